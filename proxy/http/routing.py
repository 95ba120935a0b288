"""Routing: which upstream a request goes to, and whether it is projected or passed through (proxy layer).

``/u/{name}/...`` goes to the named upstream with the prefix removed (the name spelled literally
in the raw path). Any other path goes to a default upstream, by this rule, first match wins:

1. an ``anthropic-version`` header, or a path under ``/v1/messages``: ``anthropic``;
2. a path under ``/v1beta/``, ``/v1alpha/`` or ``/upload/``, a Gemini model method
   (``/v1/models/{m}:{method}``), an ``x-goog-api-key`` header or a ``key`` query parameter: ``gemini``;
3. everything else: ``openai``.

Every route here needs a client token when client tokens are configured, its raw path must pass
``upstream.urls.check_path``, and its method must be an ordinary one, before anything is sent.
A path the proxy owns, in any spelling (``/ADMIN``, ``//admin``, ``/admin;x``, ``/v1%2Fattachments``),
is answered here and never forwarded. A POST to a projecting path of the upstream's format goes
through the policy (generation and the token-counting endpoints that take the same body); the
Files API is handled in ``http.files`` (Gemini's in ``http.gemini_files``); everything else passes through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Final
from urllib.parse import unquote

from aiohttp import web
from multidict import MultiMapping

from projectionist.adapters.registry import SPEAKS, projecting
from projectionist.policy.errors import NotFound, ProjectionistError
from projectionist.proxy.http import files, gemini_files
from projectionist.proxy.http.auth import client_unauthorized
from projectionist.proxy.http.middleware import context
from projectionist.proxy.http.proxying import relay_projected, relay_unchanged
from projectionist.proxy.http.services import SERVICES
from projectionist.proxy.upstream.urls import check_name, check_path

_GEMINI_METHOD: Final = re.compile(r"/v1(?:beta|alpha)?/models/[^/:]+:[A-Za-z]+")
#: Busy un-prefixed paths, registered as plain routes so aiohttp resolves them without a pattern scan.
HOT_PATHS: Final = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
#: Methods that may go upstream (TRACE and CONNECT never do: an echo of the headers would hand
#: a server-held key back to the client).
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: Paths the proxy owns (lowercase, as segments), under any spelling.
OWNED: Final = (("admin",), ("healthz",), ("readyz",), ("metrics",), ("v1", "attachments"))


def format_spoken(path: str, headers: MultiMapping[str], query: MultiMapping[str]) -> str:
    """The format a request speaks, by the rule in this module's docstring (its default upstream)."""
    if "anthropic-version" in headers or path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    if (path.startswith(("/v1beta/", "/v1alpha/", "/upload/")) or _GEMINI_METHOD.fullmatch(path)
            or "x-goog-api-key" in headers or "key" in query):
        return "gemini"
    return "openai"


def owned(raw_path: str) -> bool:
    """Whether ``raw_path`` names a path the proxy owns, however it is spelled: any case, extra
    slashes, ``;`` parameters, percent-encoding (two rounds)."""
    path = unquote(unquote(raw_path)).lower()
    segments = [s.split(";", 1)[0] for s in re.split(r"[/\\]+", path) if s]
    return any(tuple(segments[:len(prefix)]) == prefix for prefix in OWNED)


async def dispatch_default(request: web.Request) -> web.StreamResponse:
    name = format_spoken(request.path, request.headers, request.query)
    return await dispatch(request, name, request.rel_url.raw_path, guard_owned=True)


async def dispatch_named(request: web.Request) -> web.StreamResponse:
    """``/u/{name}/{tail}``, read from the raw path: the name must be spelled literally, and the
    tail is the raw rest of the path (never a slice of a decoded name)."""
    raw_path = request.rel_url.raw_path
    name, _, tail = raw_path[len("/u/"):].partition("/") if raw_path.startswith("/u/") else ("", "", "")
    return await dispatch(request, name, "/" + tail)


async def dispatch(request: web.Request, name: str, raw_path: str, *, guard_owned: bool = False) -> web.StreamResponse:
    services = request.app[SERVICES]
    ctx = context(request)
    # until the client is known, errors take the shape the request itself speaks: a stranger
    # learns nothing about which named upstreams exist or what format they are
    ctx.fmt = SPEAKS[format_spoken(unquote(raw_path), request.headers, request.query)]
    if not services.guard.is_client(request.headers, request.query):
        ctx.route = "unauthenticated"
        raise client_unauthorized()
    upstream = services.upstreams.get(name)
    if upstream is None:
        ctx.route = "unknown_upstream"
        check_name(name)
        raise NotFound(f"no upstream named {name!r}", code="UNKNOWN_UPSTREAM")
    ctx.fields["upstream"] = upstream.name
    if guard_owned and owned(raw_path):
        raise NotFound("no such route", code="ROUTE_NOT_FOUND")
    if request.method not in METHODS:
        raise ProjectionistError(f"{request.method} is not forwarded", code="METHOD_NOT_ALLOWED", status=405)
    check_path(raw_path)
    path = unquote(raw_path) if "%" in raw_path else raw_path
    adapter = projecting(upstream.format, request.method, path)
    fmt = ctx.fmt = adapter if adapter is not None else SPEAKS[upstream.format]
    handler: Callable[[], Awaitable[web.StreamResponse]]
    if adapter is not None:
        ctx.route, handler = fmt.NAME, lambda: relay_projected(request, fmt, upstream, raw_path)
    elif files.handles(upstream.format, request.method, path):
        ctx.route, handler = "files", lambda: files.handle(request, fmt, upstream, raw_path, path)
    elif gemini_files.handles(upstream.format, request.method, path):
        ctx.route, handler = "files", lambda: gemini_files.handle(request, fmt, upstream, raw_path, path)
    else:
        ctx.route, handler = "passthrough", lambda: relay_unchanged(request, fmt, upstream, raw_path)
    if services.tracing is not None:  # the middleware ends the span, with the answer's status
        ctx.trace = services.tracing.call(request.headers, method=request.method, path=request.rel_url.raw_path,
                                          route=ctx.route, upstream=upstream.name, upstream_format=upstream.format,
                                          request_id=ctx.request_id)
    return await handler()
