"""The ways a request goes upstream: projected, passed through unchanged, or as bytes already read (proxy layer).

Each ends in the one stage, ``upstream.relay.relay``. ``relay_projected`` runs the policy first
(``upstream.prepare.build``) and lets a ``Recorder`` watch the call; ``relay_unchanged`` streams
the request body upstream as it arrives (its ``Content-Length`` kept, so upstreams that refuse
chunked uploads still work). A projected call's answer is watched for the usage and model it
reports (the recorder's reading, or a ``Meter``'s without one): the log line, the token counters
and the call's span get them.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Final
from urllib.parse import unquote

from aiohttp import web
from multidict import CIMultiDict, MultiMapping

from ...adapters.base import WireFormat
from ...adapters.responses import tokens
from ...policy.errors import ProjectionistError
from ...policy.model import ImageRef, Placeholder, Resolved, scoped_session
from ...policy.projection import Projection, ProjectionContext, project
from ..inbound.bodies import read_body
from ..inbound.context import Context, context
from . import sessions
from .resend import Resend, carried_ids
from ..inbound.inflight import Carrying
from ..inbound.services import SERVICES, Services
from .outgoing import outgoing_headers, readable_codings, recordable_headers, recorded_path, target_url
from ..upstream.prepare import Built, Read, build, decode_json, may_hold_inline, may_hold_refs, read_images
from .record import CallInfo, Meter, Recorder
from .send import Body, relay
from ..inbound.context import Timing
from ..upstream.target import Upstream

CHUNK = 64 * 1024
#: The model a Gemini method's path names (``/v1beta/models/{model}:generateContent``).
_GEMINI_MODEL: Final = re.compile(r"/models/([^/:]+):")
#: The longest model name the log line and the span repeat.
MODEL_MAX: Final = 128
#: The session a ``/s/{session}/`` path prefix named (``http.routing``), already checked.
PATH_SESSION = web.RequestKey("projectionist.path_session", str)


def session_of(headers: MultiMapping[str], names: tuple[str, ...], in_path: str | None = None) -> str | None:
    """The session the client named on purpose (``sessions.named``): its header (``names[0]``,
    which must agree with a path that names one), the path, or a configured alias."""
    found = sessions.named(headers, names[0], names[1:], in_path)
    return found.id if found is not None else None


def _session(request: web.Request, services: Services, fmt: WireFormat, raw: bytes
             ) -> tuple[sessions.Found | None, Read | None]:
    """The request's session by ``sessions``' order, with the body as ``read_images`` read it for
    that (only when it may hold images and nothing before the body named one)."""
    found = sessions.named(request.headers, services.session_headers[0], services.session_headers[1:],
                           request.get(PATH_SESSION))
    if found is not None or not services.config.server.client_sessions:
        return found, None
    found = sessions.from_headers(request.headers)
    if found is not None:
        return found, None
    read: Read
    if services.config.policy.inline_images and may_hold_inline(raw):
        read = read_images(fmt, raw, services.identities)
    elif may_hold_refs(raw):
        read = (None, decode_json(raw), [])
    else:
        return None, None
    _, tree, client = read
    found = sessions.from_body(fmt, tree, request.headers)
    if found is None and client:  # images of its own: a session derived from its opening
        found = sessions.derived(fmt, request.headers, tree, {id(c.value): aid for c, aid in client})
    # references alone keep the sessionless policy
    return found, read


async def relay_projected(request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str) -> web.StreamResponse:
    services = request.app[SERVICES]
    ctx = context(request)
    raw = await read_body(request)
    found, read = _session(request, services, fmt, raw)
    session_id = scoped_session(ctx.tenant, found.id) if found is not None else None
    store = services.reader if ctx.tenant is None else services.visible.reader(ctx.tenant)
    ctx.fields.update(adapter=fmt.NAME, session=session_id)
    if found is not None and found.source not in ("header", "path"):
        ctx.fields["session_source"] = found.source
    started = time.perf_counter()
    seen_refs: list[ImageRef] = []

    async def run(refs: list[ImageRef], images: int) -> Projection:
        seen_refs[:] = refs
        fresh = services.log.fresh(session_id) if session_id else None
        return await project(refs, ProjectionContext(
            store=store, log=services.log, session_id=session_id, upstream_format=fmt.FORMAT,
            profile=fmt.PROFILE, vary=services.variants, images=images,
            lock=services.log.lock(session_id) if session_id else None,
            sessionless=services.config.server.sessionless,
            state=fresh or (services.log.state(session_id) if session_id else None),
            fresh=fresh is not None,
            parallel=services.config.policy.parallel_reads,
            prober=services.prober,
            probe_wait=services.config.policy.probe_wait,
        ))

    recording = bool(session_id) and services.recording.on
    policy = services.config.policy
    path = recorded_path(raw_path, request.rel_url.raw_query_string)
    identities = services.identities if policy.inline_images and session_id else None
    headers = outgoing_headers(request.headers, fmt, upstream, services.guard)
    headers.popall("Content-Encoding", None)  # the body goes upstream decoded (and projected)
    readable_codings(headers)
    sent_headers = recordable_headers(headers) if recording else ()

    async def built_and_recorded(attempt: int) -> tuple[Built, Recorder | None]:
        built = await build(fmt, raw, run, describe=recording, shape_unchanged=False,
                            max_references=policy.max_references,
                            max_projected_bytes=policy.max_projected_bytes, http=services.http_refs,
                            identities=identities, read=read if attempt == 1 else None)
        if built.projection is not None:
            _account(request, services, built, time.perf_counter() - started)
        if not (session_id and built.described is not None):
            return built, None
        request_id = ctx.request_id if attempt == 1 else f"{ctx.request_id}.{attempt}"
        call = CallInfo(session_id, request_id, ctx.started, ctx.route, fmt, upstream.name, request.method, path,
                        sent_headers)
        return built, services.recording.start(call, raw, built.described, built.projection)

    in_flight: list[Carrying] = []

    async def again() -> tuple[bytes, Recorder | None]:
        built, recorder = await built_and_recorded(2)
        for call in in_flight:  # the call sent now carries these (the refused images are placeholders)
            call.ids = carried_ids(built)
        return built.body, recorder

    built, recorder = await built_and_recorded(1)
    model = _requested_model(fmt, raw_path, built.tree)
    if model is not None:
        ctx.fields["model"] = model
        if ctx.trace is not None:
            ctx.trace.requested(model)
    screen = None
    if session_id and built.images:
        screen = Resend(services, fmt, session_id, built, list(seen_refs), recorder, again, ctx.fields, ctx.tenant)
    if session_id is None or not built.images:
        return await relay_body(request, fmt, upstream, raw_path, built.body, headers, recorder=recorder,
                                screen=screen, meter=Meter() if recorder is None else None)
    timing = Timing(ctx.started)
    with services.inflight.carrying(session_id, fmt.FORMAT, carried_ids(built), timing) as call:
        in_flight.append(call)
        return await relay_body(request, fmt, upstream, raw_path, built.body, headers, recorder=recorder,
                                screen=screen, meter=Meter() if recorder is None else None, timing=timing)


def _requested_model(fmt: WireFormat, raw_path: str, tree: object) -> str | None:
    """The model a request names where it costs nothing to find: Gemini's path, or the body the
    projection decoded anyway (a body that was not decoded is not decoded for this)."""
    if fmt.FORMAT == "gemini":
        found = _GEMINI_MODEL.search(raw_path)
        model: object = unquote(found[1]) if found is not None else None
    else:
        model = tree.get("model") if isinstance(tree, dict) else None
    return model[:MODEL_MAX] if isinstance(model, str) and model else None


async def relay_unchanged(request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str) -> web.StreamResponse:
    headers = outgoing_headers(request.headers, fmt, upstream, request.app[SERVICES].guard)
    if not request.body_exists:
        return await relay_body(request, fmt, upstream, raw_path, None, headers)
    if request.content_length is not None:
        headers["Content-Length"] = str(request.content_length)
    return await relay_body(request, fmt, upstream, raw_path, request.content.iter_chunked(CHUNK), headers)


async def relay_body(
    request: web.Request,
    fmt: WireFormat,
    upstream: Upstream,
    raw_path: str,
    body: Body,
    headers: CIMultiDict[str] | None = None,
    recorder: Recorder | None = None,
    screen: Resend | None = None,
    meter: Meter | None = None,
    timing: Timing | None = None,
) -> web.StreamResponse:
    """Relay ``body`` to ``upstream`` and the answer back; timing goes to the log line and metrics,
    and the recorder (if any) hears how the call ended. A ``screen`` may send the call once more
    (an image the upstream refused); then its recorder is the one that hears. What the answer
    reports (usage, model) is read from the recorder, else from ``meter``."""
    services = request.app[SERVICES]
    ctx = context(request)
    timing = timing or Timing(ctx.started)
    url = target_url(raw_path, request.rel_url.raw_query_string, fmt, upstream, services.guard)
    if headers is None:
        headers = outgoing_headers(request.headers, fmt, upstream, services.guard)
    if ctx.trace is not None:
        ctx.trace.inject(headers)
    try:
        response = await relay(request, upstream.session, url, body, headers, timing,
                               request_id=ctx.request_id, observer=recorder or meter, screen=screen)
    except ProjectionistError as error:
        recorder = screen.recorder if screen is not None else recorder
        if recorder is not None:
            await recorder.failed(error.code)
        raise
    except asyncio.CancelledError:
        recorder = screen.recorder if screen is not None else recorder
        if recorder is not None:
            recorder.cancelled()
        raise
    finally:
        ctx.fields.update(upstream_status=timing.status, upstream_ms=round(timing.upstream_s * 1000, 3))
        if timing.status is not None:
            services.metrics.upstream_answered(upstream.name, timing.headers_s)
    recorder = screen.recorder if screen is not None else recorder
    watched = recorder or meter
    if watched is not None:
        _reported(ctx, services, upstream.name, fmt, watched)
    if recorder is not None:
        await recorder.finished(response.status)
    return response


def _reported(ctx: Context, services: Services, upstream: str, fmt: WireFormat, meter: Meter) -> None:
    """The usage and model an answer reported: to the log line, the token counters (by the
    model the answer names, else the one the request named) and the span."""
    usage, model = meter.reported(fmt)
    if usage is None:
        return
    input_tokens, output_tokens = tokens(usage)
    if input_tokens is not None:
        ctx.fields["input_tokens"] = input_tokens
    if output_tokens is not None:
        ctx.fields["output_tokens"] = output_tokens
    services.metrics.used(upstream, model or ctx.fields.get("model"), input_tokens, output_tokens)
    if ctx.trace is not None:
        ctx.trace.answered(model=model[:MODEL_MAX] if model else None, input_tokens=input_tokens,
                           output_tokens=output_tokens)


def _account(request: web.Request, services: Services, built: Built, seconds: float) -> None:
    ctx = context(request)
    projection = built.projection
    assert projection is not None
    placeholders = sum(isinstance(o, Placeholder) for o in projection.outcomes)
    if built.client or built.held:
        ctx.fields.update(client_images=len(built.client) + built.held, client_placeholders=built.held)
    ctx.fields.update(
        refs=len(projection.outcomes),
        reads=projection.reads,
        quarantined=[q.failure for q in projection.recorded],
        lifted=len(projection.lifted),
        placeholders=placeholders,
        variants=len(projection.pinned),
    )
    if ctx.trace is not None:
        ctx.trace.projection(seconds, references=len(projection.outcomes), reads=projection.reads,
                             quarantines=len(projection.recorded), placeholders=placeholders)
    metrics = services.metrics
    metrics.projection.observe(seconds)
    for quarantine in projection.recorded:
        metrics.quarantines[quarantine.failure] += 1
    metrics.automatic_recoveries += len(projection.lifted)
    metrics.variants_pinned += len(projection.pinned)
    metrics.store_retries += projection.retries
