"""What goes upstream: target URL, end-to-end headers, auth substitution, then the relay (proxy layer).

The client's own credentials are forwarded unless the upstream has a configured key; then the
format's auth headers and query parameters (Gemini's ``?key=``) are replaced by it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from urllib.parse import urlencode

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from adapters.base import WireFormat
from proxy.relay import Capture, Timing, forward_headers, relay
from proxy.state import APP, Upstream
from proxy.wire import REQUEST_ID, REQUEST_ID_HEADER, STARTED, info


def target_path(request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str, *,
                keep_auth: bool = True) -> str:
    """The incoming raw path and query, byte for byte, minus auth query parameters when the
    upstream's own key replaces them (or when ``keep_auth`` is off, for recording)."""
    query = request.rel_url.raw_query_string
    strip = upstream.api_key or not keep_auth
    if strip and fmt.AUTH_QUERY and any(name in request.query for name in fmt.AUTH_QUERY):
        query = urlencode([(k, v) for k, v in request.query.items() if k not in fmt.AUTH_QUERY])
    return raw_path + (f"?{query}" if query else "")


def target_url(request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str) -> URL:
    """``upstream.url`` + ``target_path``."""
    return URL(upstream.url + target_path(request, fmt, upstream, raw_path), encoded=True)


def outgoing_headers(request: web.Request, fmt: WireFormat, upstream: Upstream) -> CIMultiDict[str]:
    own = request.app[APP].own_headers
    if upstream.api_key:
        return forward_headers(request.headers, drop=own | frozenset(fmt.AUTH_HEADERS),
                               replace=fmt.upstream_auth(upstream.api_key))
    return forward_headers(request.headers, drop=own)


async def forward(
    request: web.Request,
    fmt: WireFormat,
    upstream: Upstream,
    raw_path: str,
    body: bytes | AsyncIterable[bytes] | None,
    headers: CIMultiDict[str] | None = None,
    capture: Capture | None = None,
) -> web.StreamResponse:
    """Send the request to ``upstream`` and stream the answer back; record timing in the log line."""
    fields = info(request)
    fields["upstream"] = upstream.name
    timing = Timing(request[STARTED])
    try:
        return await relay(
            request,
            upstream.session,
            target_url(request, fmt, upstream, raw_path),
            body,
            headers if headers is not None else outgoing_headers(request, fmt, upstream),
            timing,
            extra_headers={REQUEST_ID_HEADER: request[REQUEST_ID]},
            capture=capture,
        )
    finally:
        fields.update(upstream_status=timing.status, upstream_ms=round(timing.upstream_s * 1000, 3))
        if timing.status is not None:
            request.app[APP].metrics.upstream.observe(timing.headers_s)
