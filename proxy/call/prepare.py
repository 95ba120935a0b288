"""Prepare, the second stage of a projected call (proxy layer, call sublayer): the policy's
projection of its images, the upstream body rendered from it, the headers it goes with, its
recorder, and the screen that re-sends it once when the upstream refuses an image.

The projection runs centrally, before any provider format is written (``body.build``
around ``policy.projection.project``). A re-send builds the call again through the same step,
as attempt 2, from the log (the refused images are placeholders by then).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final
from urllib.parse import unquote

from multidict import CIMultiDict

from ...adapters.base import WireFormat
from ...policy.events import Rejected
from ...policy.fold import SessionState
from ...policy.model import ImageRef, Inlined, Placeholder, StoredImage
from ...policy.ports import AttachmentStore
from ...policy.projection import Projection, ProjectionContext, project, reject
from .. import lanes
from ..inbound.budget import hold
from ..sessionlog.cached import CachedLog
from ..inbound.services import Carried
from . import refusals
from .body import Asked, Built, build
from .call import Call
from .outgoing import outgoing_headers, readable_codings, recorded_path
from .read import Inbound
from .record import CallInfo, Recorder
from .resend import Resend

#: The longest model name the log line and the span repeat.
MODEL_MAX: Final = 128


@dataclass(slots=True, eq=False)
class Prepared:
    """What goes upstream: the built body (and its projection), the headers, the recorder, the
    re-send screen (a session's call with images), and the calls in flight that carry it."""

    built: Built
    headers: CIMultiDict[str]
    recorder: Recorder | None
    screen: Resend | None
    in_flight: list[Carried] = field(default_factory=list)

    @property
    def carried(self) -> frozenset[str]:
        return carried_ids(self.built)


def carried_ids(built: Built) -> frozenset[str]:
    """Every image id ``built``'s upstream body carries (proxy-inlined or the client's own)."""
    return frozenset(aid for _, aid in (built.inlined or {}).values())


@dataclass(frozen=True, slots=True)
class Outgoing:
    """The headers a call goes upstream with (``outgoing_headers``, for a body sent decoded, with
    codings the proxy reads) and, when asked for, a copy of them as they are now, for its record
    (``sent``: credentials included, held for the writer, which keeps ``recordable_headers``
    of them; a trace header added later is not in it)."""

    headers: CIMultiDict[str]
    sent: tuple[tuple[str, str], ...] = ()


def outgoing(call: Call, *, recorded: bool) -> Outgoing:
    """``call``'s ``Outgoing``, the copy for its record only when ``recorded``."""
    headers = outgoing_headers(call.request.headers, call.fmt, call.upstream, call.services.guard)
    headers.popall("Content-Encoding", None)  # the body goes upstream decoded (and projected)
    readable_codings(headers)
    return Outgoing(headers, call.services.recording.sent_headers(headers) if recorded else ())


async def prepare(call: Call, inbound: Inbound, *, sending: Outgoing | None = None, probing: bool = True) -> Prepared:
    """``call`` prepared to go upstream. ``sending``: its ``outgoing`` with the record's part,
    when the caller made it already (a WebSocket's messages all go with the upgrade's, which
    nothing changes: the socket's upstream leg sent them once). ``probing``: a refusal in words
    no table knows may be settled by sending it again without images (the relay's calls)."""
    projecting = _Projecting(call, inbound, sending)
    built, recorder = await projecting.built(1)
    ctx = call.ctx
    model = requested_model(call.fmt, call.raw_path, built.tree)
    if model is not None:
        ctx.fields["model"] = model
        if ctx.trace is not None:
            ctx.trace.requested(model)
    screen = None
    if inbound.session_id and built.images:
        screen = Resend(call.services, call.fmt, inbound.session_id, built, list(projecting.refs), recorder,
                        projecting.again, ctx.fields, ctx.tenant, upstream=call.upstream.name, model=model,
                        probing=probing, scope=projecting.scope)
    return Prepared(built, projecting.headers, recorder, screen, projecting.in_flight)


class _Projecting:
    """One call's projection, run once and, for a re-send, once more (``again``)."""

    def __init__(self, call: Call, inbound: Inbound, sending: Outgoing | None = None) -> None:
        self.call, self.inbound = call, inbound
        services, session_id = call.services, inbound.session_id
        tenant = call.ctx.tenant
        self.store = services.reader if tenant is None else services.visible.reader(tenant)
        self.recording = bool(session_id) and services.recording.on
        self.identities = services.identities if services.config.policy.inline_images and session_id else None
        sending = sending or outgoing(call, recorded=self.recording)
        self.headers = sending.headers
        self.sent_headers = sending.sent if self.recording else ()
        self.started = time.perf_counter()
        self.refs: list[ImageRef] = []
        #: The calls in flight that carry this call's body (``send`` adds them; a re-send updates them).
        self.in_flight: list[Carried] = []
        self.attempts = 1
        self._scope: str | None = None

    async def run(self, asked: Asked, assume: tuple[Rejected, ...] = (), state: SessionState | None = None
                  ) -> Projection:
        """The policy's projection of ``asked``, with the rejections it ``assume``s; on ``state``, as
        it was when the call was first built, when given (the calls that settle a refusal by
        evidence must differ from each other only in what they leave out)."""
        refs = asked.refs
        self.refs[:] = refs
        call, session_id = self.call, self.inbound.session_id
        services = call.services
        policy = services.config.policy
        if refs:  # this request's reads: a stuck read it waited out once, it never waits for again
            lanes.WAITER.set(self)
        if session_id and state is None and (refs or asked.inline):
            await self._tenant_refusals(session_id, asked)
        fresh = state or (services.log.fresh(session_id) if session_id else None)
        store = RequestImages(self.store, asked.inline, asked.load, refs) if asked.inline else self.store
        return await project(refs, ProjectionContext(
            store=store, log=services.log, session_id=session_id, upstream_format=call.fmt.FORMAT,
            profile=call.fmt.PROFILE, vary=services.variants, images=asked.images,
            # none recorded without an image that may be: no reference, none the client inlined; the
            # session's lock is taken only when something is to be written (most turns write nothing)
            lock=SessionLock(services.log, session_id) if session_id and (refs or asked.inline) else None,
            sessionless=services.config.server.sessionless,
            state=fresh or (services.log.state(session_id) if session_id else None),
            fresh=fresh is not None,
            parallel=policy.parallel_reads,
            prober=services.prober,
            probe_wait=policy.probe_wait,
            inline=asked.inline,
            fit=policy.fit_images,
            upstream=call.upstream.name,
            model=requested_model(call.fmt, call.raw_path, asked.tree),
            assume=assume,
            request_bytes=asked.size,
            links=asked.links,
        ))

    @property
    def scope(self) -> str:
        """The tenant's refusals session (``refusals``): found once, for calls with images only."""
        if self._scope is None:
            request = self.call.request
            self._scope = refusals.scope_of(self.call.ctx.tenant, request.headers, request.query)
        return self._scope

    async def _tenant_refusals(self, session_id: str, asked: Asked) -> None:
        """The refusals of this tenant that hold for the images of ``asked`` on this format
        (``refusals``), recorded in this session when it does not hold them yet, before the
        projection reads its state: the images go as their placeholders, with no refused call."""
        call = self.call
        log = call.services.log
        ids = {ref.id for ref in asked.refs} | {image.id for image in asked.inline}
        found = await refusals.standing(log, self.scope, call.fmt.FORMAT, ids,
                                        reprobe_after=call.services.config.policy.refusal_reprobe_after)
        state = log.state(session_id)
        held = state.rejected if state is not None else {}
        wanted = tuple(r for r in found if (r.format, r.attachment_id) not in held)
        if not wanted:
            return
        _, new = await reject(wanted, log=log, session_id=session_id, lock=log.lock(session_id), state=state)
        if new:
            call.ctx.fields["tenant_rejected"] = len(new)

    async def built(self, attempt: int, assume: tuple[Rejected, ...] = (), record: bool = True,
                    state: SessionState | None = None) -> tuple[Built, Recorder | None]:
        call, inbound, services = self.call, self.inbound, self.call.services
        policy = services.config.policy
        run = partial(self.run, assume=assume, state=state) if assume or state is not None else self.run
        built = await build(call.fmt, inbound.raw, run, describe=self.recording and record, shape_unchanged=False,
                            max_references=policy.max_references, max_projected_bytes=policy.max_projected_bytes,
                            http=services.http_refs, identities=self.identities,
                            url_images=services.config.policy.url_images and bool(inbound.session_id),
                            read=inbound.read if attempt == 1 else None)
        if attempt == 1 and built.body is not inbound.raw:  # a body of its own, held as long as the call
            hold(call.ctx, services.budget, len(built.body), "built")
        if built.projection is not None:
            account(call, built, time.perf_counter() - self.started)
        if not (inbound.session_id and built.described is not None):
            return built, None
        ctx = call.ctx
        request_id = ctx.request_id if attempt == 1 else f"{ctx.request_id}.{attempt}"
        path = recorded_path(call.raw_path, call.request.rel_url.raw_query_string, services.guard)
        info = CallInfo(inbound.session_id, request_id, ctx.started, ctx.route, call.fmt, call.upstream.name,
                        call.request.method, path, self.sent_headers)
        recorder: Recorder = services.recording.start(info, inbound.raw, built.described, built.projection)
        return built, recorder

    async def again(self, *, assume: tuple[Rejected, ...] = (), record: bool = True,
                    state: SessionState | None = None) -> tuple[bytes, Recorder | None]:
        """The call built again from the log (the refused images placeholders by now; with the
        rejections it ``assume``s too, on ``state`` when given), recorded as the next attempt when
        ``record``."""
        self.attempts += 1
        built, recorder = await self.built(self.attempts, assume, record, state)
        for carrying in self.in_flight:  # the call sent now carries these (the refused images are placeholders)
            carrying.ids = carried_ids(built)
        return built.body, recorder


class SessionLock:
    """This process's lock of a session (``lock(session_id)`` of the cached log), found only when a
    decision is about to be written under it: a turn that writes nothing never makes one."""

    __slots__ = ("log", "session_id", "held")

    def __init__(self, log: CachedLog, session_id: str) -> None:
        self.log = log
        self.session_id = session_id
        self.held: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        self.held = self.log.lock(self.session_id)
        await self.held.acquire()

    async def __aexit__(self, *exc: object) -> None:
        assert self.held is not None
        self.held.release()


class RequestImages:
    """The projection's store for one call: an image its client inlined is read from the request
    itself (its decoded bytes are its identity's by construction, and what they are was read
    already: ``Inlined.facts``), any other id from ``store``. The policy reads an inlined image
    only to make its variant. An id the request also references is read from the store: what a
    reference becomes is what its stored object's own read says."""

    __slots__ = ("store", "facts", "load")

    def __init__(self, store: AttachmentStore, inline: list[Inlined], load: Callable[[str], bytes | None],
                 refs: Sequence[ImageRef] = ()) -> None:
        self.store = store
        referenced = {ref.id for ref in refs}
        self.facts = {image.id: image.facts for image in inline
                      if image.facts.media_type is not None and image.id not in referenced}
        self.load = load

    async def read_image(self, attachment_id: str) -> StoredImage:
        facts = self.facts.get(attachment_id)
        data = self.load(attachment_id) if facts is not None else None
        if facts is None or facts.media_type is None or data is None:
            return await self.store.read_image(attachment_id)
        return StoredImage(attachment_id, facts.media_type, len(data), facts.width, facts.height, data)


def requested_model(fmt: WireFormat, raw_path: str, tree: object) -> str | None:
    """The model a request names where it costs nothing to find: the path, for a format that
    names it there (``CallFacts.model_path``: Gemini's), or the body the projection decoded anyway
    (a body that was not decoded is not decoded for this)."""
    in_path = fmt.CALLS.model_path
    if in_path is not None:
        found = in_path.search(raw_path)
        model: object = unquote(found[1]) if found is not None else None
    else:
        model = tree.get("model") if isinstance(tree, dict) else None
    return model[:MODEL_MAX] if isinstance(model, str) and model else None


def account(call: Call, built: Built, seconds: float) -> None:
    """A projection's counts: to the log line, the span and the metrics."""
    ctx = call.ctx
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
    metrics = call.services.metrics
    metrics.projection.observe(seconds)
    for quarantine in projection.recorded:
        metrics.quarantines[quarantine.failure] += 1
    metrics.automatic_recoveries += len(projection.lifted)
    metrics.variants_pinned += len(projection.pinned)
    metrics.store_retries += projection.retries
