"""Pass-through: any other method and path, forwarded unchanged with no projection (proxy layer).

The request body is streamed upstream as it arrives (its ``Content-Length`` kept, so upstreams
that refuse chunked uploads still work); the response streams back like any other.
"""

from __future__ import annotations

from aiohttp import web

from projectionist.adapters.base import WireFormat
from projectionist.proxy.upstream.outgoing import forward, outgoing_headers
from projectionist.proxy.http.services import Upstream

CHUNK = 64 * 1024


async def passthrough(request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str) -> web.StreamResponse:
    headers = outgoing_headers(request, fmt, upstream)
    if not request.body_exists:
        return await forward(request, fmt, upstream, raw_path, None, headers)
    if request.content_length is not None:
        headers["Content-Length"] = str(request.content_length)
    return await forward(request, fmt, upstream, raw_path, request.content.iter_chunked(CHUNK), headers)
