"""The ways a call goes upstream (proxy layer, call sublayer): projected, or passed through unchanged.

A projected call runs the four stages in order, each in its own module: ``read`` (the body and
its session), ``prepare`` (the policy's projection, the upstream body, its headers, its recorder
and re-send screen), ``send`` (the relay, and what the answer reports), ``record`` (watching it
as it streams). ``relay_unchanged`` streams the request body upstream as it arrives (its
``Content-Length`` kept, so upstreams that refuse chunked uploads still work).
"""

from __future__ import annotations

from aiohttp import web

from .call import Call
from .outgoing import outgoing_headers
from .prepare import prepare
from .read import read
from .send import relay_body, send

CHUNK = 64 * 1024


async def relay_projected(call: Call) -> web.StreamResponse:
    inbound = await read(call)
    prepared = await prepare(call, inbound)
    return await send(call, inbound, prepared)


async def relay_unchanged(call: Call) -> web.StreamResponse:
    request = call.request
    headers = outgoing_headers(request.headers, call.fmt, call.upstream, call.services.guard)
    if not request.body_exists:
        return await relay_body(call, None, headers)
    if request.content_length is not None:
        headers["Content-Length"] = str(request.content_length)
    return await relay_body(call, request.content.iter_chunked(CHUNK), headers)
