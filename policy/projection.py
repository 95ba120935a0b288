"""Projection and recovery: the only place with quarantine logic (policy layer, pure).

``project`` turns the references of one request into verified images or placeholders, recording
every newly discovered failure in the session log before the caller makes its single upstream
call. ``recover`` lifts a quarantine only after a full verified read. Both talk to storage only
through the ``AttachmentStore`` and ``SessionLog`` Protocols and take the caller's per-session lock;
the log's conditional append makes them safe across processes too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, assert_never

import msgspec

from .errors import (
    READ_FAILED,
    AppendConflict,
    AttachmentError,
    Conflict,
    InternalError,
    ProjectionistError,
    Unavailable,
)
from .decide import Ask, Done, Fail, Lift, Pin, Progress, Read, Record, Sessionless, Vary, decide, names_of
from .events import Event, EventData, Quarantine, Recovered, RecoveredEvent, Rejected, Variant
from .probe import Prober
from .fold import EMPTY, SessionState, fold, fold_states
from .model import ImageRef, Outcome, StoredImage, check_id
from .profile import Profile
from .ports import AttachmentStore, SessionLog, Varier

Lock = contextlib.AbstractAsyncContextManager[Any]
_D = TypeVar("_D", bound=EventData)

#: Bound on re-fold rounds when other writers keep changing the session under us.
MAX_ROUNDS: Final = 8


class ProjectionContext(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one projection works with besides its references, built once by its caller.

    The ports: the ``store`` it reads, the session ``log`` it records in (None: no session), the
    caller's per-session ``lock``, the ``prober`` that says when a retryable quarantine is read
    again, and ``vary``, which makes the variant an upstream's profile asks for (None: nothing is
    made, as in a replay). The session: its ``session_id``, a cached ``state`` of it and whether
    the caller vouches that state is ``fresh``, and the ``sessionless`` policy when there is none.
    The upstream: its ``upstream_format`` and ``profile``. The limits: ``parallel`` reads in
    flight at once, ``probe_wait`` seconds for a probe, and ``images``, how many images the
    request holds in all. ``project`` promises what each does."""

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

    @property
    def recording(self) -> bool:
        """Whether this projection has a session log to record in."""
        return self.log is not None and self.session_id is not None


class Projection(msgspec.Struct, frozen=True):
    """What one request's references became; ``outcomes`` align with the input references."""

    outcomes: tuple[Outcome, ...]
    state: SessionState
    reads: int = 0
    recorded: tuple[Quarantine | Rejected, ...] = ()
    retries: int = 0
    lifted: tuple[str, ...] = ()
    pinned: tuple[Variant, ...] = ()


class Recovery(msgspec.Struct, frozen=True):
    """Result of ``recover``: the appended event, or None when nothing needed lifting."""

    event: RecoveredEvent | None
    state: SessionState


async def refresh(log: SessionLog, session_id: str, state: SessionState = EMPTY) -> SessionState:
    """Fold whatever the log holds beyond ``state`` (a cached state stays valid across replicas);
    only state events are read, from the latest checkpoint on."""
    read = await log.read_state(session_id, state.last_seq)
    return fold_states(read.events, read.last_seq, state)


async def _read_once(store: AttachmentStore, attachment_id: str) -> StoredImage | AttachmentError:
    try:
        return await store.read_image(attachment_id)
    except AttachmentError as exc:
        return exc
    except ProjectionistError:
        raise
    except Exception as exc:  # unclassified: never a quarantine, always a clear failure
        raise InternalError(f"unclassified error reading {attachment_id[:15]}: {type(exc).__name__}") from exc


async def _read(store: AttachmentStore, attachment_id: str) -> tuple[StoredImage | AttachmentError, int]:
    """One verified read; a READ_FAILED gets exactly one immediate retry. Cancellation propagates."""
    result = await _read_once(store, attachment_id)
    if isinstance(result, AttachmentError) and result.code == READ_FAILED:
        return await _read_once(store, attachment_id), 2
    return result, 1


async def _probe(store: AttachmentStore, attachment_id: str, wait: float) -> tuple[StoredImage | AttachmentError, int]:
    """A probe of a retryable quarantine: one read, no retry, waited for at most ``wait``. Any
    failure (unreadable, a full store, still reading when the wait ends) is a failed probe: the
    request keeps the placeholder; a read still going on stays shared with whoever wants it next."""
    try:
        async with asyncio.timeout(wait):
            return await store.read_image(attachment_id), 1
    except AttachmentError as error:
        return error, 1
    except (TimeoutError, Unavailable):
        return AttachmentError(READ_FAILED, "the probe read did not verify in time", attachment_id=attachment_id), 1


async def _read_many(
    store: AttachmentStore, ids: Sequence[str], parallel: int,
    probes: frozenset[str] = frozenset(), probe_wait: float = 2.0,
) -> dict[str, tuple[StoredImage | AttachmentError, int]]:
    """Read ``ids`` with at most ``parallel`` reads of this request in flight at once (the ids in
    ``probes`` by ``_probe``)."""
    async def one(aid: str) -> tuple[StoredImage | AttachmentError, int]:
        return await (_probe(store, aid, probe_wait) if aid in probes else _read(store, aid))

    if len(ids) <= 1:
        return {aid: await one(aid) for aid in ids}
    results: dict[str, tuple[StoredImage | AttachmentError, int]] = {}
    queue = iter(ids)

    async def worker() -> None:
        for aid in queue:
            results[aid] = await one(aid)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(parallel, len(ids))):
                group.create_task(worker())
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return {aid: results[aid] for aid in ids}


async def _record(
    log: SessionLog,
    session_id: str,
    state: SessionState,
    wanted: Sequence[Quarantine | Rejected],
    lock: Lock,
) -> tuple[SessionState, tuple[Quarantine | Rejected, ...]]:
    """Append the quarantines not yet in the log; the loser of a race re-folds and decides again."""
    state, new, _ = await _transition(log, session_id, state, lock, "recording",
                                      lambda now: [q for q in wanted if not _stands(now, q)])
    return state, tuple(new)


async def _transition(
    log: SessionLog, session_id: str, state: SessionState, lock: Lock, doing: str,
    missing: Callable[[SessionState], list[_D]],
) -> tuple[SessionState, list[_D], list[Event]]:
    """The one way a decision reaches the log: under ``lock``, refold, append what is still
    ``missing`` from the fresh state, conditionally on it; a conflict (another writer's state
    event) refolds and asks again, so concurrent deciders make one transition. Returns the state
    after it, what was appended (nothing when nothing was missing) and its events."""
    async with lock:
        for _ in range(MAX_ROUNDS):
            state = await refresh(log, session_id, state)
            new = missing(state)
            if not new:
                return state, [], []
            try:
                events = await log.append(session_id, state.last_seq, new)
            except AppendConflict:
                continue
            return await _settle(log, session_id, state, events), new, events
    raise Unavailable(f"session log kept changing while {doing}", code="SESSION_CONTENDED")


def _stands(state: SessionState, quarantine: Quarantine | Rejected) -> bool:
    """Whether the log already holds this quarantine (a rejection: for its own format)."""
    if isinstance(quarantine, Rejected):
        return (quarantine.format, quarantine.attachment_id) in state.rejected
    return quarantine.attachment_id in state.quarantined


async def reject(
    rejected: Sequence[Rejected],
    *,
    log: SessionLog,
    session_id: str,
    lock: Lock | None = None,
    state: SessionState | None = None,
) -> tuple[SessionState, tuple[Quarantine | Rejected, ...]]:
    """Record images an upstream refused (``attachment/rejected``, each for its format), durably
    and once: concurrent requests and replicas that saw the same refusal append one transition.
    Returns the state after it and the quarantines this call appended."""
    return await _record(log, session_id, state or EMPTY, rejected, lock or contextlib.nullcontext())


async def _pin(log: SessionLog, session_id: str, state: SessionState, variants: Sequence[Variant], lock: Lock
               ) -> SessionState:
    """Append the variants made for this request, each only if the image's pin for its target is
    still the one the decision saw in ``state`` (none, or one that would not read): one transition
    per image and target; the loser of a race re-folds and takes the winner's pin."""
    seen = {(v.attachment_id, v.target): (old.variant_id if (old := state.variants.get((v.attachment_id, v.target)))
                                          is not None else None) for v in variants}

    def missing(now: SessionState) -> list[Variant]:
        new = []
        for variant in variants:
            key = (variant.attachment_id, variant.target)
            current = now.variants.get(key)
            if current != variant and (current.variant_id if current else None) == seen.get(key):
                new.append(variant)
        return new

    return (await _transition(log, session_id, state, lock, "pinning variants", missing))[0]


async def _settle(log: SessionLog, session_id: str, state: SessionState, appended: list[Event]) -> SessionState:
    """``state`` after our own append: folded on directly, or, when records others appended lie
    between (they never conflict), refreshed from the log."""
    if appended and appended[0].seq == state.last_seq + 1:
        return fold(appended, state)
    return await refresh(log, session_id, state)


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
    With no reference but a session, only the state is refreshed: what the images the client
    inlined itself become depends on it (``decide.held_inline``).
    ``state`` is an optional cached fold for the session; it is refreshed from the log first,
    unless the caller vouches it is ``fresh`` (nothing changed since it was read; a decision that
    turns out stale still meets the conditional append, which reads again);
    ``parallel`` bounds this request's reads in flight at once; with a ``prober``, a retryable
    quarantine whose probe is due is read once more and, if the read verifies, lifted
    (``attachment/recovered``, ``automatic``) before the projection, in the same request.
    """
    if not refs and not context.recording:
        return Projection((), context.state or EMPTY)
    if context.session_id is not None and context.log is None:
        raise ValueError("a session needs a log")
    ask = Ask(refs, context.recording, context.sessionless, context.upstream_format, context.profile, context.images)
    return await _carry_out(ask, context, await _begin(refs, context))


async def _begin(refs: Sequence[ImageRef], context: ProjectionContext) -> Progress:
    """The progress a projection starts from: the session's state, refreshed from the log unless
    the caller vouched for it, and the probes due for its references."""
    state = context.state
    if context.log and context.session_id and not (context.fresh and state is not None):
        state = await refresh(context.log, context.session_id, state or EMPTY)
    state = state or EMPTY
    prober = context.prober
    due = prober.due(state, names_of(refs)) if prober is not None and context.recording else frozenset()
    return Progress(state, due=due)


async def _carry_out(ask: Ask, context: ProjectionContext, progress: Progress) -> Projection:
    """Carry out each step ``decide`` names, each by its own handler, until it is done or fails."""
    while True:
        step = decide(ask, progress)
        match step:
            case Done(outcomes):
                return Projection(outcomes, progress.state, progress.reads, progress.recorded, progress.retries,
                                  progress.lifted, progress.pinned)
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
    found = await _read_many(context.store, step.ids, context.parallel, progress.due, context.probe_wait)
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
    progress.state, done = await _lift(log, session_id, progress.state, step.images, lock)
    progress.lifted += done
    progress.due -= {image.id for image in step.images}


async def _pin_step(step: Pin, context: ProjectionContext, progress: Progress) -> None:
    """Pin the variants made; a pin someone else made meanwhile stands: ours is dropped, theirs is read."""
    log, session_id, lock = _writing(context, progress)
    progress.state = state = await _pin(log, session_id, progress.state, step.variants, lock)
    progress.pinned += tuple(v for v in step.variants if state.variants.get((v.attachment_id, v.target)) == v)
    progress.made = {aid: v for aid, v in progress.made.items()
                     if v is None or state.variants.get((aid, v.target)) in (None, v)}


async def _record_step(step: Record, context: ProjectionContext, progress: Progress) -> None:
    """Record the quarantines; an id someone recovered meanwhile is read afresh."""
    log, session_id, lock = _writing(context, progress)
    progress.state, new = await _record(log, session_id, progress.state, step.quarantines, lock)
    progress.recorded += new
    for quarantine in step.quarantines:
        del progress.results[quarantine.attachment_id]


def _writing(context: ProjectionContext, progress: Progress) -> tuple[SessionLog, str, Lock]:
    """The log, session and lock of a step that writes, counted: past ``MAX_ROUNDS`` such steps
    other writers kept changing the session under this projection."""
    progress.rounds += 1
    if progress.rounds > MAX_ROUNDS:
        raise Unavailable("session log kept changing while projecting", code="SESSION_CONTENDED")
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


async def _lift(
    log: SessionLog, session_id: str, state: SessionState, images: Sequence[StoredImage], lock: Lock
) -> tuple[SessionState, tuple[str, ...]]:
    """Append ``attachment/recovered`` (``automatic``) for the images whose retryable quarantine
    still stands; the loser of a race re-folds and finds it lifted already (one transition)."""
    def missing(now: SessionState) -> list[Recovered]:
        return [Recovered(i.id, i.bytes, i.media_type, i.width, i.height, automatic=True) for i in images
                if (quarantine := now.quarantined.get(i.id)) is not None and quarantine.retryable]

    state, new, _ = await _transition(log, session_id, state, lock, "lifting quarantines", missing)
    return state, tuple(r.attachment_id for r in new)


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
    result = await _read_once(store, attachment_id)
    if isinstance(result, AttachmentError):
        raise Conflict(f"verification failed: {result.code}", code=result.code, status=409)
    data = Recovered(result.id, result.bytes, result.media_type, result.width, result.height)
    state, _, events = await _transition(log, session_id, state, lock or contextlib.nullcontext(), "recovering",
                                         lambda now: [data] if _held(now, attachment_id) else [])
    if not events:
        return Recovery(None, state)
    event = events[0]
    assert isinstance(event, RecoveredEvent)
    return Recovery(event, state)


def _held(state: SessionState, attachment_id: str) -> bool:
    return attachment_id in state.quarantined or any(aid == attachment_id for _, aid in state.rejected)
