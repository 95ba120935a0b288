"""The projecting path: parse, find references, run the policy, render, forward (proxy layer).

A body with no reference is forwarded as the original bytes. Otherwise it is decoded once, only
the image slots are patched, and it is encoded once. Every decision (reads, quarantines,
placeholders, errors) is made before the upstream call, so before the first response byte.
``build`` is shared with replay, so a replayed call is rebuilt by the very code that built it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Final, NamedTuple

import msgspec
from aiohttp import web

from projectionist.adapters.base import WireFormat
from projectionist.policy.model import ImageRef, Unavailable
from projectionist.policy.projection import Projection, project
from projectionist.proxy.upstream.recording import record_request
from projectionist.proxy.stores.cache import inline
from projectionist.proxy.upstream.outgoing import forward
from projectionist.proxy.http.sessions import session_from_headers
from projectionist.proxy.http.services import APP, Upstream
from projectionist.proxy.http.middleware import info

_decoder: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()

Projector = Callable[[list[ImageRef]], Awaitable[Projection]]


class Built(NamedTuple):
    """An upstream body and what produced it (``projection`` is None when nothing was decoded)."""

    body: bytes
    projection: Projection | None


def may_hold_refs(raw: bytes) -> bool:
    """Cheap pre-check on raw bytes: every reference spells ``sha256:`` unless JSON-escaped,
    and a body with any ``\\u`` escape is decoded to be sure."""
    return b"sha256:" in raw or (b"\\" in raw and b"\\u" in raw)  # memchr first: most bodies have no escape


async def build(fmt: WireFormat, raw: bytes, run: Projector) -> Built:
    """The upstream body for ``raw``: the original bytes without references, else projected."""
    if not may_hold_refs(raw):
        return Built(raw, None)
    decoded = _decoder.decode(raw)
    sites = fmt.find_refs(decoded)
    if not sites:
        return Built(raw, None)
    projection = await run([site.ref for site in sites])
    fmt.render(sites, projection.outcomes, inline)
    return Built(_encoder.encode(decoded), projection)


async def project_and_forward(request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str) -> web.StreamResponse:
    app = request.app[APP]
    raw = await request.read()
    session_id = session_from_headers(request.headers, app.session_headers)
    fields = info(request)
    fields.update(adapter=fmt.NAME, session=session_id)
    started = time.perf_counter()

    async def run(refs: list[ImageRef]) -> Projection:
        projection = await project(
            refs,
            store=app.reader,
            log=app.log,
            session_id=session_id,
            lock=app.locks(session_id) if session_id else None,
            sessionless=app.config.server.sessionless,
            state=app.states.get(session_id) if session_id else None,
        )
        if session_id:
            app.states.put(session_id, projection.state)
        return projection

    built = await build(fmt, raw, run)
    if built.projection is not None:
        _account(request, built.projection, time.perf_counter() - started)
    recorder = None
    if session_id and app.config.record.mode != "off":
        recorder = await record_request(request, fmt, upstream, raw_path, raw, built.body, built.projection, session_id)
    if recorder is None:
        return await forward(request, fmt, upstream, raw_path, built.body)
    return await recorder.forward(forward(request, fmt, upstream, raw_path, built.body, capture=recorder.capture))


def _account(request: web.Request, projection: Projection, seconds: float) -> None:
    info(request).update(
        refs=len(projection.outcomes),
        reads=projection.reads,
        quarantined=[q.failure for q in projection.recorded],
        placeholders=sum(isinstance(o, Unavailable) for o in projection.outcomes),
    )
    metrics = request.app[APP].metrics
    metrics.projection.observe(seconds)
    for quarantine in projection.recorded:
        metrics.quarantines[quarantine.failure] += 1
    metrics.store_retries += projection.retries
