"""Projection and recovery: the only place with quarantine logic (policy layer, pure).

``project`` turns the references of one request into verified images or placeholders, recording
every newly discovered failure in the session log before the caller makes its single upstream
call: it carries out the steps ``decide`` names, one handler per step, with everything it works
with in one ``ProjectionContext``. ``recover`` lifts a quarantine only after a full verified read.
Both talk to storage only through the ``AttachmentStore`` and ``SessionLog`` Protocols (``reads``,
``transitions``) and take the caller's per-session lock; the log's conditional append makes them
safe across processes too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import assert_never

import msgspec

from .decide import (Ask, Done, Fail, Lift, Pin, Progress, Read, Record, Sessionless, Vary, at_once, decide, held_urls,
                     names_of)
from .errors import AttachmentError, Code, Conflict, Unavailable
from .events import Learnt, Quarantine, Recovered, RecoveredEvent, Rejected, Variant
from .fold import EMPTY, SessionState, assuming
from .model import ImageRef, Inlined, InlineOutcome, Outcome, Placeholder, StoredImage, check_id
from .ports import AttachmentStore, SessionLog, Varier
from .probe import Prober
from .profile import Profile, takes_images
from .reads import read_many, read_once
from .transitions import MAX_ROUNDS, Lock, lift, pin, record, refresh, teach, transition

__all__ = ["Projection", "ProjectionContext", "Recovery", "learn", "project", "recover", "refresh", "reject"]


class ProjectionContext(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one projection works with besides its references, built once by its caller.

    The ports: the ``store`` it reads, the session ``log`` it records in (None: no session), the
    caller's per-session ``lock``, the ``prober`` that says when a retryable quarantine is read
    again, and ``vary``, which makes the variant an upstream's profile asks for (None: nothing is
    made, as in a replay). The session: its ``session_id``, a cached ``state`` of it and whether
    the caller vouches that state is ``fresh``, and the ``sessionless`` policy when there is none.
    The upstream: its ``upstream_format`` and ``profile``. The limits: ``parallel`` reads in
    flight at once, ``probe_wait`` seconds for a probe, and ``images``, how many images the
    request holds in all. The request: the images its client ``inline``d itself, whether they
    are fitted (``fit``), and the ``upstream`` (its configured name) and ``model`` it goes to,
    for the rules learnt about them. ``project`` promises what each does."""

    store: AttachmentStore
    log: SessionLog | None
    lock: Lock | None = None
    prober: Prober | None = None
    vary: Varier | None = None
    session_id: str | None
    state: SessionState | None = None
    fresh: bool = False
    sessionless: Sessionless = "fail"
    upstream_format: str | None = None
    profile: Profile | None = None
    parallel: int = 8
    probe_wait: float = 2.0
    images: int | None = None
    inline: Sequence[Inlined] = ()
    fit: bool = True
    upstream: str | None = None
    model: str | None = None
    #: Rejections to project as if they stood, never recorded (a call that tries leaving images out).
    assume: tuple[Rejected, ...] = ()
    #: The size of the body as the client sent it (0: not known), for a limit of bytes per request.
    request_bytes: int = 0
    #: The images the provider fetches by URL (each its ``linked.url_id`` and display name): never
    #: read, only held by what the session learnt of them (``decide.held_urls``).
    links: Sequence[ImageRef] = ()

    @property
    def recording(self) -> bool:
        """Whether this projection has a session log to record in."""
        return self.log is not None and self.session_id is not None


class Projection(msgspec.Struct, frozen=True):
    """What each image slot of one request became: ``outcomes`` align with the input references,
    ``inline`` with the images the client inlined (``ProjectionContext.inline``: None, as it came),
    ``links`` with the images the provider fetches (``ProjectionContext.links``: None, as it came)."""

    outcomes: tuple[Outcome, ...]
    state: SessionState
    reads: int = 0
    recorded: tuple[Quarantine | Rejected, ...] = ()
    retries: int = 0
    lifted: tuple[str, ...] = ()
    pinned: tuple[Variant, ...] = ()
    inline: tuple[InlineOutcome, ...] = ()
    #: Whether the model the request goes to takes images (no ``no_images`` rule learnt for it).
    vision: bool = True
    links: tuple[Placeholder | None, ...] = ()


class Recovery(msgspec.Struct, frozen=True):
    """Result of ``recover``: the appended event, or None when nothing needed lifting."""

    event: RecoveredEvent | None
    state: SessionState


async def project(refs: Sequence[ImageRef], context: ProjectionContext) -> Projection:
    """Resolve every reference of one request to a verified image or a placeholder.

    Promises:
    - a reference already quarantined in the log is never read (a rejection: on upstreams of
      ``upstream_format``, the format it holds for);
    - ATTACHMENT_NOT_FOUND / ATTACHMENT_CORRUPT are quarantined at once; ATTACHMENT_READ_FAILED
      after exactly one immediate retry, as ``retryable``; each quarantine is appended (durably)
      before this returns, so before the caller's single upstream call;
    - cancellation propagates and unclassified errors raise ``InternalError``; neither records;
    - without a session nothing is recorded: ``sessionless="fail"`` raises the first failure,
      ``"placeholder"`` projects the placeholder for it;
    - every occurrence of one id gets the same treatment; outcomes are a pure function of the
      final folded state, the references and the verified bytes (``decide``);
    - with a ``profile``, an image that does not fit it is sent as a variant: the one pinned in
      the log for the request's target (the original is then not read), else one ``vary`` makes,
      pinned before this returns. Without ``vary`` (replay) nothing is made: only pins count.
      ``images`` counts all the request's images (client-inlined ones too) for a many-image rule.
    - the images the client inlined itself (``inline``) become what ``decide`` says of them: as
      they came, respelled, their variant (made from the request's own bytes, which ``store``
      serves for their ids, and pinned), or a placeholder (bytes that are no image are
      quarantined, ``inline``, before this returns); a rejection holds for them on its format;
      rules learnt for the ``upstream`` and ``model`` narrow the profile, or make every image a
      placeholder for a model that takes none.
    ``state`` is an optional cached fold for the session; it is refreshed from the log first,
    unless the caller vouches it is ``fresh`` (nothing changed since it was read; a decision that
    turns out stale still meets the conditional append, which reads again);
    ``parallel`` bounds this request's reads in flight at once; with a ``prober``, a retryable
    quarantine whose probe is due is read once more and, if the read verifies, lifted
    (``attachment/recovered``, ``automatic``) before the projection, in the same request.
    The images the provider fetches (``links``) are never read: each is held by the final state.
    """
    projection = await _project(refs, context)
    if not context.links:
        return projection
    held = held_urls(context.links, projection.state, context.upstream_format or "", projection.vision)
    return msgspec.structs.replace(projection, links=held)


async def _project(refs: Sequence[ImageRef], context: ProjectionContext) -> Projection:
    """``project`` but for the images the provider fetches."""
    if not refs and not context.inline and not context.recording:
        return Projection((), context.state or EMPTY)
    if context.session_id is not None and context.log is None:
        raise ValueError("a session needs a log")
    if not refs and not context.inline:  # nothing to read, lift or record: the state alone
        state = await _state(context)
        return Projection((), state, vision=takes_images(state.rules(context.upstream, context.model)))
    ask = Ask(refs, context.recording, context.sessionless, context.upstream_format, context.profile, context.images,
              context.inline, context.fit, context.upstream, context.model, context.request_bytes)
    if not refs:  # the images the client inlined alone: most often every one goes as it is
        state = await _state(context)
        done = at_once(ask, state)
        if done is not None:
            return Projection((), state, inline=done.inline)
        return await _carry_out(ask, context, Progress(state))
    return await _carry_out(ask, context, await _begin(refs, context))


async def _begin(refs: Sequence[ImageRef], context: ProjectionContext) -> Progress:
    """The progress a projection starts from: the session's state, refreshed from the log unless
    the caller vouched for it, and the probes due for its references."""
    state = await _state(context)
    prober = context.prober
    due = prober.due(state, names_of(refs)) if prober is not None and context.recording and refs else frozenset()
    return Progress(state, due=due)


async def _state(context: ProjectionContext) -> SessionState:
    """The session's state, refreshed from the log unless the caller vouched for its cached one
    (with the rejections the caller ``assume``s)."""
    state = context.state
    if context.log and context.session_id and not (context.fresh and state is not None):
        state = await refresh(context.log, context.session_id, state or EMPTY)
    return assuming(state or EMPTY, context.assume)


async def _carry_out(ask: Ask, context: ProjectionContext, progress: Progress) -> Projection:
    """Carry out each step ``decide`` names, each by its own handler, until it is done or fails."""
    while True:
        step = decide(ask, progress)
        match step:
            case Done(outcomes, inline, vision):
                return Projection(outcomes, progress.state, progress.reads, progress.recorded, progress.retries,
                                  progress.lifted, progress.pinned, inline, vision)
            case Fail(error):
                raise error
            case Read():
                await _read_step(step, context, progress)
            case Vary():
                await _vary_step(step, context, progress)
            case Lift():
                await _lift_step(step, context, progress)
            case Pin():
                await _pin_step(step, context, progress)
            case Record():
                await _record_step(step, context, progress)
            case _:
                assert_never(step)


async def _read_step(step: Read, context: ProjectionContext, progress: Progress) -> None:
    """Read the ids (a due one by its probe); a failed probe waits another period."""
    found = await read_many(context.store, step.ids, context.parallel, progress.due, context.probe_wait)
    for aid, (result, count) in found.items():
        progress.results[aid] = result
        progress.reads += count
        progress.retries += count - 1
        if aid in progress.due and isinstance(result, AttachmentError):
            assert context.prober is not None
            context.prober.failed(aid)  # still unreadable: the next probe waits another period
            progress.due -= {aid}


async def _vary_step(step: Vary, context: ProjectionContext, progress: Progress) -> None:
    """Make the variants asked for: each one made is read as its verified image from now on."""
    for image, made in zip(step.images, await _vary_all(context.vary, step)):
        if made is None:
            progress.made[image.id] = None
            continue
        variant, stored = made
        progress.made[image.id] = variant
        progress.results[variant.variant_id] = stored


async def _lift_step(step: Lift, context: ProjectionContext, progress: Progress) -> None:
    """Lift the probed quarantines that still stand; their probes are no longer due."""
    log, session_id, lock = _writing(context, progress)
    progress.state, done = await lift(log, session_id, progress.state, step.images, lock)
    progress.lifted += done
    progress.due -= {image.id for image in step.images}


async def _pin_step(step: Pin, context: ProjectionContext, progress: Progress) -> None:
    """Pin the variants made; a pin someone else made meanwhile stands: ours is dropped, theirs is read."""
    log, session_id, lock = _writing(context, progress)
    progress.state = state = await pin(log, session_id, progress.state, step.variants, lock)
    progress.pinned += tuple(v for v in step.variants if state.variants.get((v.attachment_id, v.target)) == v)
    progress.made = {aid: v for aid, v in progress.made.items()
                     if v is None or state.variants.get((aid, v.target)) in (None, v)}


async def _record_step(step: Record, context: ProjectionContext, progress: Progress) -> None:
    """Record the quarantines; an id someone recovered meanwhile is read afresh."""
    log, session_id, lock = _writing(context, progress)
    progress.state, new = await record(log, session_id, progress.state, step.quarantines, lock)
    progress.recorded += new
    for quarantine in step.quarantines:
        progress.results.pop(quarantine.attachment_id, None)


def _writing(context: ProjectionContext, progress: Progress) -> tuple[SessionLog, str, Lock]:
    """The log, session and lock of a step that writes, counted: past ``MAX_ROUNDS`` such steps
    other writers kept changing the session under this projection."""
    progress.rounds += 1
    if progress.rounds > MAX_ROUNDS:
        raise Unavailable("session log kept changing while projecting", code=Code.SESSION_CONTENDED)
    assert context.log is not None and context.session_id is not None
    return context.log, context.session_id, context.lock or contextlib.nullcontext()


async def _vary_all(vary: Varier | None, step: Vary) -> list[tuple[Variant, StoredImage] | None]:
    """Make each variant ``step`` asks for, at once; None where none could be made (or nothing may
    make one: a replay), so the original is sent. A busy or unavailable store fails the request,
    as with reads; cancellation propagates."""
    target = step.profile.target(step.count)

    async def one(image: StoredImage) -> tuple[Variant, StoredImage] | None:
        if vary is None:
            return None
        try:
            variant, recipe = await vary(image, step.profile, step.count)
        except Unavailable:
            raise
        except Exception:
            return None
        return (Variant(image.id, target, variant.id, variant.media_type, variant.bytes, variant.width,
                        variant.height, recipe), variant)

    if len(step.images) == 1:
        return [await one(step.images[0])]
    return list(await asyncio.gather(*(one(image) for image in step.images)))


async def reject(
    rejected: Sequence[Quarantine | Rejected],
    *,
    log: SessionLog,
    session_id: str,
    lock: Lock | None = None,
    state: SessionState | None = None,
) -> tuple[SessionState, tuple[Quarantine | Rejected, ...]]:
    """Record images an upstream refused (``attachment/rejected``, each for its format) or could
    not fetch by URL (``attachment/quarantine`` with ``url``), durably and once: concurrent
    requests and replicas that saw the same refusal append one transition. Returns the state
    after it and the quarantines this call appended."""
    return await record(log, session_id, state or EMPTY, rejected, lock or contextlib.nullcontext())


async def learn(
    rule: Learnt,
    *,
    log: SessionLog,
    session_id: str,
    lock: Lock | None = None,
    state: SessionState | None = None,
) -> tuple[SessionState, bool]:
    """Record a rule a refusal taught about an upstream and model (``upstream/learnt``), durably
    and once: a rule as strict standing already appends nothing. Returns the state after it and
    whether this call appended it."""
    return await teach(log, session_id, state or EMPTY, rule, lock or contextlib.nullcontext())


async def recover(
    attachment_id: str,
    *,
    store: AttachmentStore,
    log: SessionLog,
    session_id: str,
    lock: Lock | None = None,
    state: SessionState | None = None,
) -> Recovery:
    """Lift a quarantine after a full verified read.

    Promises: appends ``attachment/recovered`` only if the read verifies (digest, size, media
    type, dimensions) and the attachment is still quarantined (for the store, or rejected by any
    upstream: all of its quarantines are lifted) when the append happens; a failed
    verification raises ``Conflict`` (409) carrying the failure code and appends nothing; a
    reference that is not quarantined appends nothing.
    """
    check_id(attachment_id)
    state = await refresh(log, session_id, state or EMPTY)
    if not _held(state, attachment_id):
        return Recovery(None, state)
    result = await read_once(store, attachment_id)
    if isinstance(result, AttachmentError):
        raise Conflict(f"verification failed: {result.code}", code=result.code, status=409)
    data = Recovered(result.id, result.bytes, result.media_type, result.width, result.height)
    state, _, events = await transition(log, session_id, state, lock or contextlib.nullcontext(), "recovering",
                                        lambda now: [data] if _held(now, attachment_id) else [])
    if not events:
        return Recovery(None, state)
    event = events[0]
    assert isinstance(event, RecoveredEvent)
    return Recovery(event, state)


def _held(state: SessionState, attachment_id: str) -> bool:
    return attachment_id in state.quarantined or any(aid == attachment_id for _, aid in state.rejected)
