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
from proxy.relay import Timing, forward_headers, relay
from proxy.state import APP, Upstream
from proxy.wire import REQUEST_ID, REQUEST_ID_HEADER, STARTED, info


def target_url(request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str) -> URL:
    """``upstream.url`` + the incoming raw path and query, byte for byte (minus replaced auth)."""
    query = request.rel_url.raw_query_string
    if upstream.api_key and fmt.AUTH_QUERY and any(name in request.query for name in fmt.AUTH_QUERY):
        query = urlencode([(k, v) for k, v in request.query.items() if k not in fmt.AUTH_QUERY])
    return URL(upstream.url + raw_path + (f"?{query}" if query else ""), encoded=True)


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
        )
    finally:
        fields.update(upstream_status=timing.status, upstream_ms=round(timing.upstream_s * 1000, 3))
        if timing.status is not None:
            request.app[APP].metrics.upstream.observe(timing.headers_s)
