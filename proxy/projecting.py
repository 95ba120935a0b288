"""The projecting path: parse, find references, run the policy, render, forward (proxy layer).

A body with no reference is forwarded as the original bytes. Otherwise it is decoded once, only
the image slots are patched, and it is encoded once. Every decision (reads, quarantines,
placeholders, errors) is made before the upstream call, so before the first response byte.
"""

from __future__ import annotations

import time
from typing import Final

import msgspec
from aiohttp import web

from adapters.base import WireFormat
from policy.model import Unavailable
from policy.projection import project
from proxy.cache import inline
from proxy.forward import forward
from proxy.sessions import session_from_headers
from proxy.state import APP, Upstream
from proxy.wire import info

_decoder: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()


def may_hold_refs(raw: bytes) -> bool:
    """Cheap pre-check on raw bytes: every reference spells ``sha256:`` unless JSON-escaped,
    and a body with any ``\\u`` escape is decoded to be sure."""
    return b"sha256:" in raw or b"\\u" in raw


async def project_body(request: web.Request, fmt: WireFormat, raw: bytes) -> bytes:
    """The upstream body for ``raw``: unchanged without references, else projected."""
    if not may_hold_refs(raw):
        return raw
    decoded = _decoder.decode(raw)
    sites = fmt.find_refs(decoded)
    if not sites:
        return raw
    app = request.app[APP]
    session_id = info(request).get("session")
    started = time.perf_counter()
    projection = await project(
        [site.ref for site in sites],
        store=app.reader,
        log=app.log,
        session_id=session_id,
        lock=app.locks(session_id) if session_id else None,
        sessionless=app.config.server.sessionless,
        state=app.states.get(session_id) if session_id else None,
    )
    if session_id:
        app.states.put(session_id, projection.state)
    info(request).update(
        refs=len(sites),
        reads=projection.reads,
        quarantined=[q.failure for q in projection.recorded],
        placeholders=sum(isinstance(o, Unavailable) for o in projection.outcomes),
    )
    fmt.render(sites, projection.outcomes, inline)
    body = _encoder.encode(decoded)
    metrics = app.metrics
    metrics.projection.observe(time.perf_counter() - started)
    for quarantine in projection.recorded:
        metrics.quarantines[quarantine.failure] += 1
    if projection.retries:
        metrics.store_retries += projection.retries
    return body


async def project_and_forward(request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str) -> web.StreamResponse:
    app = request.app[APP]
    raw = await request.read()
    session_id = session_from_headers(request.headers, app.session_headers)
    info(request).update(adapter=fmt.NAME, session=session_id)
    body = await project_body(request, fmt, raw)
    return await forward(request, fmt, upstream, raw_path, body)
