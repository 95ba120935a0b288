"""Routing: which upstream a request goes to, and whether it is projected or passed through (proxy layer).

``/u/{name}/...`` goes to the named upstream with the prefix removed (the name spelled literally
in the raw path); a rest that names a path the proxy owns (``/u/openai/admin/...``) is never sent. Any other path
goes to the default upstream named after the format it speaks, by the hints each format's adapter declares
(``adapters.facts.Spoken``, asked in the registry's order: ``adapters.registry.SPOKEN``), first match wins.
The shipped adapters declare:

1. an ``anthropic-version`` header, or a path under ``/v1/messages``: ``anthropic``;
2. a path under ``/v1beta/``, ``/v1alpha/`` or ``/upload/``, a Gemini model method
   (``/v1/models/{m}:{method}``), an ``x-goog-api-key`` header or a ``key`` query parameter: ``gemini``;
3. everything else: ``openai``.

``/s/{session}/...`` names the session in the path, for clients that can only be given a base URL
(``.../s/{session}/v1`` for OpenAI's SDK, ``.../s/{session}`` for Anthropic's, ``.../s/{session}/u/{name}/v1``):
the segment, read from the raw path and percent-decoded once, must be a valid session id and
agree with a session header if there is one; the rest of the path is then routed exactly as it
would be without the prefix. Under the prefix, ``/v1/attachments...`` is answered by the proxy's
own attachment routes, as without it; any other path the proxy owns is 404 ``ROUTE_NOT_FOUND``.

Every route here needs a client token when client tokens are configured, its raw path must pass
``upstream.urls.check_path``, and its method must be an ordinary one, before anything is sent.
A path the proxy owns, in any spelling (``/ADMIN``, ``//admin``, ``/admin;x``, ``/v1%2Fattachments``,
``/%73/x``), is answered here and never forwarded. A POST to a projecting path of the upstream's format goes
through the policy (generation and the token-counting endpoints that take the same body); the
Files API is handled in ``files.sdk`` (Gemini's in ``files.gemini``); everything else passes through unchanged.
``dispatch`` builds the one ``Call`` (which checks the path and names its adapter) and hands it to
its route: the projected pipeline, or one of ``ROUTES``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Final
from urllib.parse import unquote

from aiohttp import web
from multidict import MultiDict, MultiDictProxy, MultiMapping
from yarl import URL

from ...adapters.registry import FORMATS, SPEAKS, claims
from ...policy.errors import Code, InvalidRequest, NotFound, ProjectionistError
from ...policy.model import check_session_id
from ..call import websocket
from ..call.call import Call
from ..call.pipeline import relay_projected, relay_unchanged
from ..call.sessions import session_of
from ..config import NAME_RE
from ..files import gemini as gemini_files
from ..files import sdk as files
from ..inbound.context import Context, context
from ..inbound.services import SERVICES, Services
from ..upstream.urls import check_path

#: Busy un-prefixed paths, registered as plain routes so aiohttp resolves them without a pattern scan.
HOT_PATHS: Final = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
#: Methods that may go upstream (TRACE and CONNECT never do: an echo of the headers would hand
#: a server-held key back to the client).
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: The query of a request without a query string.
_NO_QUERY: Final[MultiMapping[str]] = MultiDictProxy(MultiDict())
#: Paths the proxy owns (lowercase, as segments), under any spelling; ``s`` is the session prefix.
OWNED: Final = (("admin",), ("healthz",), ("readyz",), ("metrics",), ("v1", "attachments"), ("s",))
SESSION_PREFIX: Final = "/s/"
#: The one owned path a ``/s/{session}/`` prefix may lead to, spelled literally: as without the prefix.
ATTACHMENTS: Final = "/v1/attachments"


def format_spoken(path: str, headers: MultiMapping[str], query: MultiMapping[str]) -> str:
    """The format a request speaks, by the rule in this module's docstring (its default upstream):
    what its path says (``registry.claims``, kept per path), unless a header or a query parameter
    of a format asked before claims it. Plain loops: every request asks, twice."""
    before, found = claims(path)
    for name, names, parameters in before:
        for header in names:
            if header in headers:
                return name
        for parameter in parameters:
            if parameter in query:
                return name
    return found


@functools.lru_cache(maxsize=256)
def owned(raw_path: str) -> bool:
    """Whether ``raw_path`` names a path the proxy owns, however it is spelled: any case, extra
    slashes, ``;`` parameters, percent-encoding (two rounds). A pure function of the path (and of
    the constant ``OWNED``), asked on every proxied request of a handful of paths: the answers of
    the latest 256 are kept (at most 2 MB of paths at aiohttp's 8 KB request-line limit)."""
    path = unquote(unquote(raw_path)).lower()
    segments = [s.split(";", 1)[0] for s in re.split(r"[/\\]+", path) if s]
    return any(tuple(segments[:len(prefix)]) == prefix for prefix in OWNED)


async def dispatch_default(request: web.Request) -> web.StreamResponse:
    # no query string: no query to parse (``request.query`` builds one on first use)
    name = format_spoken(request.path, request.headers,
                         request.query if request.rel_url.raw_query_string else _NO_QUERY)
    raw_path = request.rel_url.raw_path
    # a path with nothing percent-encoded is its own decoding: the format it speaks is ``name``
    return await dispatch(request, name, raw_path, guard_owned=True, spoken=None if "%" in raw_path else name)


async def dispatch_named(request: web.Request) -> web.StreamResponse:
    name, tail = _named(request.rel_url.raw_path)
    return await dispatch(request, name, tail, guard_owned=True)


def _named(raw_path: str) -> tuple[str, str]:
    """``/u/{name}/{tail}``, read from the raw path: the name must be spelled literally, and the
    tail is the raw rest of the path (never a slice of a decoded name)."""
    name, _, tail = raw_path[len("/u/"):].partition("/") if raw_path.startswith("/u/") else ("", "", "")
    return name, "/" + tail


async def dispatch_session(request: web.Request) -> web.StreamResponse:
    """``/s/{session}/{rest}``: the session named in the raw path, then ``rest`` routed as if it
    had come without the prefix (which never travels upstream, nor into a record)."""
    raw_path = request.rel_url.raw_path
    literal = raw_path.startswith(SESSION_PREFIX)
    segment, slash, rest = raw_path[len(SESSION_PREFIX):].partition("/")
    rest = slash + rest
    ctx = context(request)
    services = request.app[SERVICES]
    ctx.fmt = SPEAKS[format_spoken(unquote(rest), request.headers, request.query)]
    _require_client(request, services, ctx)
    if not literal:  # /%73/x/...: aiohttp matched the decoded path; the prefix must be spelled as is
        raise NotFound("no such route", code=Code.ROUTE_NOT_FOUND)
    check_path(raw_path)  # a '.' or '..' segment, the session's included, in any encoding
    session = check_session_id(unquote(segment))
    session_of(request.headers, services.session_headers, session)  # a header that disagrees
    ctx.path_session = session
    ctx.fields["session"] = session
    if not rest:
        raise NotFound("nothing to route after /s/{session}", code=Code.ROUTE_NOT_FOUND)
    if rest == ATTACHMENTS or rest.startswith(ATTACHMENTS + "/"):
        return await _unprefixed(request, rest)
    if unquote(rest).startswith("/u/"):
        return await dispatch(request, *_named(rest), guard_owned=True)
    return await dispatch(request, format_spoken(unquote(rest), request.headers, request.query), rest,
                          guard_owned=True)


async def _unprefixed(request: web.Request, rest: str) -> web.StreamResponse:
    """``rest`` answered by whichever route takes it without the prefix (the proxy's own)."""
    inner = request.clone(rel_url=URL.build(path=rest, query_string=request.rel_url.raw_query_string, encoded=True))
    match = await request.app.router.resolve(inner)
    if match.http_exception is not None:
        raise NotFound("no such route", code=Code.ROUTE_NOT_FOUND)
    match.add_app(request.app)
    match.freeze()
    inner._match_info = match  # what aiohttp's own dispatch sets (``web.Application._handle``)
    context(request).route = match.route.name or context(request).route
    return await match.handler(inner)


def _require_client(request: web.Request, services: Services, ctx: Context) -> None:
    try:
        ctx.tenant = services.guard.require_client(request.headers, request.query)
    except ProjectionistError:
        ctx.route = "unauthenticated"
        raise


#: What answers a call that is not projected, by the kind of route it takes (``_route``): each
#: its own walk from here.
Route = Callable[[Call], Awaitable[web.StreamResponse]]
ROUTES: Final[Mapping[str, Route]] = {
    "passthrough": relay_unchanged,
    "files": files.handle,
    "gemini_files": gemini_files.handle,
    "websocket": websocket.relay,
}
_FILES: Final = frozenset({"files", "gemini_files"})
#: The proxy's own Files API routes, by the kind of Files API a format declares (``Files.kind``).
FILES_APIS: Final[Mapping[str, tuple[Callable[[str, str, str], bool], str]]] = {
    "multipart": (files.handles, "files"), "resumable": (gemini_files.handles, "gemini_files")}


def check_name(raw: str) -> str:
    """An upstream name as it appears in ``/u/{name}/``: letters, digits, ``_.-``, literally."""
    if NAME_RE.fullmatch(raw) is None:
        raise InvalidRequest("upstream name must be 1-64 of [A-Za-z0-9_.-], not percent-encoded",
                             code=Code.INVALID_UPSTREAM_NAME)
    return raw


def _route(upstream_format: str, method: str, path: str, upgrade: bool) -> str | None:
    """The route of a path of ``upstream_format`` that is not a plain call: one of the proxy's own
    file APIs, or a WebSocket (an upgrade on a route that has none is the client's error: never
    a plain call)."""
    if not upgrade:
        facts = FORMATS.get(upstream_format)
        api = facts.files if facts is not None else None
        if api is None:
            return None
        handles, route = FILES_APIS[api.kind]
        return route if handles(upstream_format, method, path) else None
    if websocket.serves(upstream_format, path) is None:
        raise InvalidRequest("this route has no WebSocket; send the call without Upgrade",
                             code=Code.UPGRADE_NOT_SUPPORTED)
    return "websocket"


async def dispatch(request: web.Request, name: str, raw_path: str, *, guard_owned: bool = False,
                   spoken: str | None = None) -> web.StreamResponse:
    """``request`` to the upstream ``name`` at ``raw_path``: the client is known, the upstream
    exists, the path is not the proxy's own, the method is one that goes upstream; then the call
    is built (its path checked) and handed to its route (``ROUTES``). ``spoken``: the format
    ``raw_path`` speaks (``format_spoken``), when the caller found it already."""
    services = request.app[SERVICES]
    ctx = context(request)
    # until the client is known, errors take the shape the request itself speaks: a stranger
    # learns nothing about which named upstreams exist or what format they are
    if spoken is None:
        spoken = format_spoken(unquote(raw_path), request.headers, request.query)
    ctx.fmt = SPEAKS[spoken]
    _require_client(request, services, ctx)
    upstream = services.upstreams.get(name)
    if upstream is None:
        ctx.route = "unknown_upstream"
        check_name(name)
        raise NotFound(f"no upstream named {name!r}", code=Code.UNKNOWN_UPSTREAM)
    ctx.fields["upstream"] = upstream.name
    if guard_owned and owned(raw_path):
        raise NotFound("no such route", code=Code.ROUTE_NOT_FOUND)
    if request.method not in METHODS:
        raise ProjectionistError(f"{request.method} is not forwarded", code=Code.METHOD_NOT_ALLOWED, status=405)
    upgrade = "websocket" in request.headers.get("Upgrade", "").lower()
    own = _route(upstream.format, request.method, unquote(raw_path) if "%" in raw_path else raw_path, upgrade)
    call = Call.of(request, services, ctx, upstream, raw_path)
    kind = own or "passthrough"
    ctx.route = call.fmt.NAME if call.projected else "files" if own in _FILES else kind
    if services.tracing is not None:  # the middleware ends the span, with the answer's status
        ctx.trace = services.tracing.call(request.headers, method=request.method, path=request.rel_url.raw_path,
                                          route=ctx.route, upstream=upstream.name, upstream_format=upstream.format,
                                          request_id=ctx.request_id)
    if call.projected and own is None:
        return await relay_projected(call)
    return await ROUTES[kind](call)  # the file APIs and pass-through: each its own walk
