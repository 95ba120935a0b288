"""Routing: which upstream a request goes to, and whether it is projected or passed through (proxy layer).

``/u/{name}/...`` goes to the named upstream with the prefix removed (the name spelled literally
in the raw path). Any other path goes to a default upstream, by this rule, first match wins:

1. an ``anthropic-version`` header, or a path under ``/v1/messages``: ``anthropic``;
2. a path under ``/v1beta/``, ``/v1alpha/`` or ``/upload/``, a Gemini model method
   (``/v1/models/{m}:{method}``), an ``x-goog-api-key`` header or a ``key`` query parameter: ``gemini``;
3. everything else: ``openai``.

Every route here needs a client token when client tokens are configured, and its raw path must
pass ``proxy.urls.check_path`` before anything is sent. A POST to a projecting path of the
upstream's format goes through the policy (generation and the token-counting endpoints that take
the same body); the Files API is handled in ``proxy.files``; everything else passes through
unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Final
from urllib.parse import unquote

from aiohttp import web

from projectionist.adapters import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from projectionist.adapters.base import WireFormat
from projectionist.policy.errors import NotFound
from projectionist.proxy.http import files
from projectionist.proxy.upstream.passthrough import passthrough
from projectionist.proxy.upstream.prepare import project_and_forward
from projectionist.proxy.http.services import APP
from projectionist.proxy.upstream.urls import check_name, check_path
from projectionist.proxy.http.middleware import respond

_GEMINI_METHOD: Final = re.compile(r"/v1(?:beta|alpha)?/models/[^/:]+:[A-Za-z]+")
PROJECTING: Final[dict[str, tuple[tuple[re.Pattern[str], WireFormat], ...]]] = {
    "openai": ((re.compile(r"(?:/v1)?/chat/completions"), openai_chat),
               (re.compile(r"(?:/v1)?/responses(?:/compact|/input_tokens)?"), openai_responses)),
    "anthropic": ((re.compile(r"(?:/v1)?/messages(?:/count_tokens)?"), anthropic_messages),
                  (re.compile(r"(?:/v1)?/messages/batches"), anthropic_batches)),
    "gemini": ((re.compile(r"/v1(?:beta|alpha)?/models/[^/:]+:(?:generateContent|streamGenerateContent|countTokens)"),
                gemini),),
}
#: Busy un-prefixed paths, registered as plain routes so aiohttp resolves them without a pattern scan.
HOT_PATHS: Final = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
#: The wire shape of errors the proxy produces for a request bound to an upstream of each format.
ERROR_FORMATS: Final[dict[str, WireFormat]] = {"openai": openai_chat, "anthropic": anthropic_messages, "gemini": gemini}


def projecting_adapter(upstream_format: str, method: str, path: str) -> WireFormat | None:
    if method != "POST":
        return None
    for pattern, adapter in PROJECTING.get(upstream_format, ()):
        if pattern.fullmatch(path):
            return adapter
    return None


def default_upstream(request: web.Request) -> str:
    """The upstream name for an un-prefixed path (the rule in this module's docstring)."""
    path = request.path
    if "anthropic-version" in request.headers or path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    if (path.startswith(("/v1beta/", "/v1alpha/", "/upload/")) or _GEMINI_METHOD.fullmatch(path)
            or "x-goog-api-key" in request.headers
            or ("key=" in request.rel_url.raw_query_string and "key" in request.query)):
        return "gemini"
    return "openai"


async def dispatch_default(request: web.Request) -> web.StreamResponse:
    return await dispatch(request, default_upstream(request), request.rel_url.raw_path)


async def dispatch_named(request: web.Request) -> web.StreamResponse:
    """``/u/{name}/{tail}``, read from the raw path: the name must be spelled literally, and the
    tail is the raw rest of the path (never a slice of a decoded name)."""
    raw_path = request.rel_url.raw_path
    name, _, tail = raw_path[len("/u/"):].partition("/") if raw_path.startswith("/u/") else ("", "", "")
    return await dispatch(request, name, "/" + tail)


async def dispatch(request: web.Request, name: str, raw_path: str) -> web.StreamResponse:
    app = request.app[APP]
    upstream = app.upstreams.get(name)
    if upstream is None:
        async def unknown() -> web.StreamResponse:
            app.guard.require_client(request.headers, request.query)
            check_name(name)
            raise NotFound(f"no upstream named {name!r}", code="UNKNOWN_UPSTREAM")
        return await respond(request, openai_chat, "unknown_upstream", unknown)
    path = unquote(raw_path) if "%" in raw_path else raw_path
    adapter = projecting_adapter(upstream.format, request.method, path)
    fmt = adapter if adapter is not None else ERROR_FORMATS[upstream.format]
    call: Callable[[], Awaitable[web.StreamResponse]]
    if adapter is not None:
        route, call = fmt.NAME, lambda: project_and_forward(request, fmt, upstream, raw_path)
    elif files.handles(upstream.format, request.method, path):
        route, call = "files", lambda: files.handle(request, fmt, upstream, raw_path, path)
    else:
        route, call = "passthrough", lambda: passthrough(request, fmt, upstream, raw_path)

    async def guarded() -> web.StreamResponse:
        app.guard.require_client(request.headers, request.query)
        check_path(raw_path)
        return await call()
    return await respond(request, fmt, route, guarded)
