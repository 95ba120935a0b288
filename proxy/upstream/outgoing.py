"""What goes upstream: target URL, end-to-end headers, auth substitution, then the relay (proxy layer).

The URL is the upstream's configured base plus the validated client path (``proxy.urls``). The
client's own credentials are forwarded unless the upstream has a configured key; then the
format's auth headers and query parameters (Gemini's ``?key=``) are replaced by it. The proxy's
own tokens (client tokens, the admin token, ``X-Projectionist-Token``) are never forwarded.
"""

from __future__ import annotations

from collections.abc import AsyncIterable

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from projectionist.adapters.base import WireFormat
from projectionist.proxy.http.auth import CREDENTIAL_QUERY
from projectionist.proxy.upstream.relay import Capture, Timing, forward_headers, relay
from projectionist.proxy.http.services import APP, Upstream
from projectionist.proxy.upstream.urls import filter_query
from projectionist.proxy.http.middleware import REQUEST_ID, REQUEST_ID_HEADER, STARTED, info


def upstream_query(request: web.Request, fmt: WireFormat, upstream: Upstream) -> str:
    """The incoming raw query, byte for byte, minus auth parameters the upstream's own key
    replaces and any parameter carrying one of the proxy's own tokens."""
    query = request.rel_url.raw_query_string
    if not query:
        return query
    guard = request.app[APP].guard
    replaced = frozenset(fmt.AUTH_QUERY) if upstream.api_key else frozenset()
    return filter_query(query, lambda k, v: k not in replaced and not (k in CREDENTIAL_QUERY and guard.is_own(v)))


def recorded_path(request: web.Request, raw_path: str) -> str:
    """The path and query as the session log keeps them: no credential parameter, on any format."""
    query = filter_query(request.rel_url.raw_query_string, lambda k, v: k.lower() not in CREDENTIAL_QUERY)
    return raw_path + (f"?{query}" if query else "")


def target_url(request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str) -> URL:
    """The configured base + the checked ``raw_path`` + ``upstream_query``."""
    return upstream.base.join(raw_path, upstream_query(request, fmt, upstream))


def outgoing_headers(request: web.Request, fmt: WireFormat, upstream: Upstream) -> CIMultiDict[str]:
    app = request.app[APP]
    drop = app.own_headers | app.guard.own_credential_headers(request.headers)
    if upstream.api_key:
        return forward_headers(request.headers, drop=drop | frozenset(fmt.AUTH_HEADERS),
                               replace=fmt.upstream_auth(upstream.api_key))
    return forward_headers(request.headers, drop=drop)


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
    url = target_url(request, fmt, upstream, raw_path)
    try:
        return await relay(
            request,
            upstream.session,
            url,
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

