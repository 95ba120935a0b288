"""The projecting route: parse, find references, run the policy, render, relay (proxy layer).

A body with no reference is forwarded as the original bytes. Otherwise it is decoded once, only
the image slots are patched, and it is encoded once. Every decision (reads, quarantines,
placeholders, errors) is made before the upstream call, so before the first response byte.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from aiohttp import web

from adapters.base import WireFormat
from policy.model import Unavailable
from policy.projection import project
from proxy.relay import Timing, forward_headers, relay
from proxy.sessions import session_from_headers
from proxy.state import APP, Upstream
from proxy.wire import REQUEST_ID, REQUEST_ID_HEADER, Handler, endpoint, info

_decoder: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()


def may_hold_refs(raw: bytes) -> bool:
    """Cheap pre-check on raw bytes: every reference spells ``sha256:`` unless JSON-escaped,
    and a body with any ``\\u`` escape is decoded to be sure."""
    return b"sha256:" in raw or b"\\u" in raw


def upstream_headers(request: web.Request, fmt: WireFormat, upstream: Upstream) -> Any:
    app = request.app[APP]
    drop: tuple[str, ...] = app.session_headers
    if upstream.api_key:
        return forward_headers(request.headers, drop=drop + fmt.AUTH_HEADERS, replace=fmt.upstream_auth(upstream.api_key))
    return forward_headers(request.headers, drop=drop)


def projecting_handler(fmt: WireFormat, upstream_name: str, route: str) -> Handler:
    @endpoint(fmt, route)
    async def handle(request: web.Request) -> web.StreamResponse:
        app = request.app[APP]
        upstream = app.upstreams[upstream_name]
        fields = info(request)
        raw = await request.read()
        session_id = session_from_headers(request.headers, app.session_headers)
        fields.update(adapter=fmt.NAME, upstream=upstream.name, session=session_id)
        body = raw
        if may_hold_refs(raw):
            decoded = _decoder.decode(raw)
            sites = fmt.find_refs(decoded)
            if sites:
                projection = await project(
                    [site.ref for site in sites],
                    store=app.store,
                    log=app.log,
                    session_id=session_id,
                    lock=app.locks(session_id) if session_id else None,
                    sessionless=app.config.server.sessionless,
                )
                fields.update(
                    refs=len(sites),
                    reads=projection.reads,
                    quarantined=[q.failure for q in projection.recorded],
                    placeholders=sum(isinstance(o, Unavailable) for o in projection.outcomes),
                )
                fmt.render(sites, projection.outcomes)
                body = _encoder.encode(decoded)
        timing = Timing()
        try:
            return await relay(
                request,
                upstream.session,
                upstream.url + request.path_qs,
                body,
                upstream_headers(request, fmt, upstream),
                timing,
                extra_headers={REQUEST_ID_HEADER: request[REQUEST_ID]},
            )
        finally:
            fields.update(upstream_status=timing.status, upstream_ms=round(timing.upstream_s * 1000, 3))

    return handle
