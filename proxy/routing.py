"""Routing: which upstream a request goes to, and whether it is projected or passed through (proxy layer).

``/u/{name}/...`` goes to the named upstream with the prefix removed. Any other path goes to a
default upstream, by this rule, first match wins:

1. an ``anthropic-version`` header, or a path under ``/v1/messages``: ``anthropic``;
2. a path under ``/v1beta/``, ``/v1alpha/`` or ``/upload/``, a Gemini model method
   (``/v1/models/{m}:{method}``), an ``x-goog-api-key`` header or a ``key`` query parameter: ``gemini``;
3. everything else: ``openai``.

A POST to a projecting path of the upstream's format goes through the policy (generation and the
token-counting endpoints that take the same body); the Files API is handled in ``proxy.files``;
everything else passes through unchanged.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

from aiohttp import web

from adapters import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from adapters.base import WireFormat
from policy.errors import NotFound
from proxy import files
from proxy.passthrough import passthrough
from proxy.projecting import project_and_forward
from proxy.state import APP
from proxy.wire import respond

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
    name = request.match_info["name"]
    raw_path = request.rel_url.raw_path
    return await dispatch(request, name, raw_path[len(f"/u/{name}"):] or "/")


async def dispatch(request: web.Request, name: str, raw_path: str) -> web.StreamResponse:
    upstream = request.app[APP].upstreams.get(name)
    if upstream is None:
        async def unknown() -> web.StreamResponse:
            raise NotFound(f"no upstream named {name!r}", code="UNKNOWN_UPSTREAM")
        return await respond(request, openai_chat, "unknown_upstream", unknown)
    path = unquote(raw_path) if "%" in raw_path else raw_path
    adapter = projecting_adapter(upstream.format, request.method, path)
    if adapter is not None:
        fmt = adapter
        return await respond(request, fmt, fmt.NAME, lambda: project_and_forward(request, fmt, upstream, raw_path))
    errors = ERROR_FORMATS[upstream.format]
    if files.handles(upstream.format, request.method, path):
        return await respond(request, errors, "files", lambda: files.handle(request, errors, upstream, raw_path, path))
    return await respond(request, errors, "passthrough", lambda: passthrough(request, errors, upstream, raw_path))
