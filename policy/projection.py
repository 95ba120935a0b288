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
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Literal

import msgspec

from projectionist.policy.errors import (
    CORRUPT,
    INVALID_REF,
    NOT_FOUND,
    READ_FAILED,
    AppendConflict,
    AttachmentError,
    Conflict,
    InternalError,
    ProjectionistError,
    Unavailable,
)
from projectionist.policy.events import Event, Quarantine, Recovered, RecoveredEvent
from projectionist.policy.fold import EMPTY, SessionState, fold, placeholder
from projectionist.policy.model import Failure, ImageRef, Outcome, Resolved, StoredImage, Placeholder, check_id
from projectionist.policy.ports import AttachmentStore, SessionLog

Sessionless = Literal["fail", "placeholder"]
Lock = contextlib.AbstractAsyncContextManager[Any]

FAILURE: Final[dict[str, Failure]] = {NOT_FOUND: "not_found", CORRUPT: "corrupt", READ_FAILED: "read_failed"}
#: Bound on re-fold rounds when other writers keep changing the session under us.
MAX_ROUNDS: Final = 8


class Projection(msgspec.Struct, frozen=True):
    """What one request's references became; ``outcomes`` align with the input references."""

    outcomes: tuple[Outcome, ...]
    state: SessionState
    reads: int = 0
    recorded: tuple[Quarantine, ...] = ()
    retries: int = 0
    lifted: tuple[str, ...] = ()


class Recovery(msgspec.Struct, frozen=True):
    """Result of ``recover``: the appended event, or None when nothing needed lifting."""

    event: RecoveredEvent | None
    state: SessionState


async def refresh(log: SessionLog, session_id: str, state: SessionState = EMPTY) -> SessionState:
    """Fold whatever the log holds beyond ``state`` (a cached state stays valid across replicas)."""
    return fold(await log.read(session_id, state.last_seq), state)


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


async def _read_many(
    store: AttachmentStore, ids: Sequence[str], parallel: int
) -> dict[str, tuple[StoredImage | AttachmentError, int]]:
    """Read ``ids`` with at most ``parallel`` reads of this request in flight at once."""
    if len(ids) <= 1:
        return {aid: await _read(store, aid) for aid in ids}
    results: dict[str, tuple[StoredImage | AttachmentError, int]] = {}
    queue = iter(ids)

    async def worker() -> None:
        for aid in queue:
            results[aid] = await _read(store, aid)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(parallel, len(ids))):
                group.create_task(worker())
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return {aid: results[aid] for aid in ids}


def _quarantine_for(error: AttachmentError, attachment_id: str, name: str | None) -> Quarantine:
    return Quarantine(attachment_id, FAILURE[error.code], retryable=error.code == READ_FAILED, name=name)


async def _record(
    log: SessionLog,
    session_id: str,
    state: SessionState,
    wanted: Sequence[Quarantine],
    lock: Lock,
) -> tuple[SessionState, tuple[Quarantine, ...]]:
    """Append the quarantines not yet in the log; the loser of a race re-folds and decides again."""
    async with lock:
        for _ in range(MAX_ROUNDS):
            state = await refresh(log, session_id, state)
            new = [q for q in wanted if q.attachment_id not in state.quarantined]
            if not new:
                return state, ()
            try:
                events = await log.append(session_id, state.last_seq, new)
            except AppendConflict:
                continue
            return await _settle(log, session_id, state, events), tuple(new)
    raise Unavailable("session log kept changing while recording", code="SESSION_CONTENDED")


async def _settle(log: SessionLog, session_id: str, state: SessionState, appended: list[Event]) -> SessionState:
    """``state`` after our own append: folded on directly, or, when records others appended lie
    between (they never conflict), refreshed from the log."""
    if appended and appended[0].seq == state.last_seq + 1:
        return fold(appended, state)
    return await refresh(log, session_id, state)


class Read(msgspec.Struct, frozen=True):
    """Next: read these ids (none of them quarantined, none read yet)."""

    ids: tuple[str, ...]


class Record(msgspec.Struct, frozen=True):
    """Next: append these quarantines (the session's log decides them, once)."""

    quarantines: tuple[Quarantine, ...]


class Lift(msgspec.Struct, frozen=True):
    """Next: lift these retryable quarantines, whose probe read verified (``attachment/recovered``,
    ``automatic``)."""

    images: tuple[StoredImage, ...]


class Fail(msgspec.Struct, frozen=True):
    """Next: fail the request with this error (a bad reference, or a sessionless failure)."""

    error: Any


class Done(msgspec.Struct, frozen=True):
    """The outcome of every reference, aligned with the request's references."""

    outcomes: tuple[Outcome, ...]


Step = Read | Record | Lift | Fail | Done


def decide(
    refs: Sequence[ImageRef],
    state: SessionState,
    results: Mapping[str, StoredImage | AttachmentError],
    *,
    recording: bool,
    sessionless: Sessionless = "fail",
    due: frozenset[str] = frozenset(),
) -> Step:
    """The next step of a projection, from what is known so far (pure; see ``project``).

    ``results`` holds the verified read (or its failure) of each id read so far; ``recording``
    says whether there is a session log to record quarantines in; ``due`` names the retryable
    quarantines whose probe is due (``Prober``): they are read, and lifted if the read verifies."""
    names = _names(refs)
    pending = tuple(aid for aid in names
                    if (aid not in state.quarantined or aid in due) and aid not in results)
    if pending:
        return Read(pending)
    lifts = tuple(image for aid in names if aid in due and aid in state.quarantined
                  and isinstance(image := results[aid], StoredImage))
    if lifts and recording:
        return Lift(lifts)
    failures = {aid: result for aid in names
                if aid not in state.quarantined and isinstance(result := results[aid], AttachmentError)}
    for error in failures.values():
        if error.code == INVALID_REF:
            return Fail(error)
    wanted = tuple(_quarantine_for(error, aid, names[aid]) for aid, error in failures.items())
    if wanted and recording:
        return Record(wanted)
    if wanted and sessionless == "fail":
        return Fail(next(iter(failures.values())))
    unrecorded = {q.attachment_id: q for q in wanted}
    outcomes: list[Outcome] = []
    for ref in refs:
        quarantine = state.quarantined.get(ref.id) or unrecorded.get(ref.id)
        if quarantine is not None:
            outcomes.append(Placeholder(quarantine.failure, placeholder(ref, quarantine)))
        else:
            image = results[ref.id]
            assert isinstance(image, StoredImage)
            outcomes.append(Resolved(image))
    return Done(tuple(outcomes))


def _names(refs: Sequence[ImageRef]) -> dict[str, str | None]:
    """Each referenced id once, in order, with the first display name any reference gave it."""
    names: dict[str, str | None] = {}
    for ref in refs:
        if names.get(ref.id) is None:
            names[ref.id] = ref.name
    return names


async def project(
    refs: Sequence[ImageRef],
    *,
    store: AttachmentStore,
    log: SessionLog | None,
    session_id: str | None,
    lock: Lock | None = None,
    sessionless: Sessionless = "fail",
    state: SessionState | None = None,
    parallel: int = 8,
    prober: Prober | None = None,
) -> Projection:
    """Resolve every reference of one request to a verified image or a placeholder.

    Promises:
    - a reference already quarantined in the log is never read;
    - ATTACHMENT_NOT_FOUND / ATTACHMENT_CORRUPT are quarantined at once; ATTACHMENT_READ_FAILED
      after exactly one immediate retry, as ``retryable``; each quarantine is appended (durably)
      before this returns, so before the caller's single upstream call;
    - cancellation propagates and unclassified errors raise ``InternalError``; neither records;
    - without a session nothing is recorded: ``sessionless="fail"`` raises the first failure,
      ``"placeholder"`` projects the placeholder for it;
    - every occurrence of one id gets the same treatment; outcomes are a pure function of the
      final folded state, the references and the verified bytes (``decide``).
    ``state`` is an optional cached fold for the session; it is refreshed from the log first;
    ``parallel`` bounds this request's reads in flight at once; with a ``prober``, a retryable
    quarantine whose probe is due is read once more and, if the read verifies, lifted
    (``attachment/recovered``, ``automatic``) before the projection, in the same request.
    """
    if not refs:
        return Projection((), state or EMPTY)
    if session_id is not None and log is None:
        raise ValueError("a session needs a log")
    recording = log is not None and session_id is not None
    state = await refresh(log, session_id, state or EMPTY) if log and session_id else (state or EMPTY)
    due = prober.due(state, _names(refs)) if prober is not None and recording else frozenset()
    results: dict[str, StoredImage | AttachmentError] = {}
    recorded: tuple[Quarantine, ...] = ()
    lifted: tuple[str, ...] = ()
    reads = retries = rounds = 0
    while True:
        step = decide(refs, state, results, recording=recording, sessionless=sessionless, due=due)
        if isinstance(step, Done):
            return Projection(step.outcomes, state, reads, recorded, retries, lifted)
        if isinstance(step, Fail):
            raise step.error
        if isinstance(step, Read):
            for aid, (result, count) in (await _read_many(store, step.ids, parallel)).items():
                results[aid] = result
                reads += count
                retries += count - 1
                if aid in due and isinstance(result, AttachmentError):
                    assert prober is not None
                    prober.failed(aid)  # still unreadable: the next probe waits another period
                    due -= {aid}
            continue
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise Unavailable("session log kept changing while projecting", code="SESSION_CONTENDED")
        assert log is not None and session_id is not None
        if isinstance(step, Lift):
            state, done = await _lift(log, session_id, state, step.images, lock or contextlib.nullcontext())
            lifted += done
            due -= {image.id for image in step.images}
            continue
        state, new = await _record(log, session_id, state, step.quarantines, lock or contextlib.nullcontext())
        recorded += new
        for quarantine in step.quarantines:  # one someone recovered meanwhile is read afresh
            del results[quarantine.attachment_id]


async def _lift(
    log: SessionLog, session_id: str, state: SessionState, images: Sequence[StoredImage], lock: Lock
) -> tuple[SessionState, tuple[str, ...]]:
    """Append ``attachment/recovered`` (``automatic``) for the images whose retryable quarantine
    still stands; the loser of a race re-folds and finds it lifted already (one transition)."""
    async with lock:
        for _ in range(MAX_ROUNDS):
            state = await refresh(log, session_id, state)
            todo = [image for image in images
                    if (quarantine := state.quarantined.get(image.id)) is not None and quarantine.retryable]
            if not todo:
                return state, ()
            data = [Recovered(i.id, i.bytes, i.media_type, i.width, i.height, automatic=True) for i in todo]
            try:
                events = await log.append(session_id, state.last_seq, data)
            except AppendConflict:
                continue
            return await _settle(log, session_id, state, events), tuple(i.id for i in todo)
    raise Unavailable("session log kept changing while lifting quarantines", code="SESSION_CONTENDED")


class Prober:
    """When a retryable quarantine gets its probe: ``after`` seconds after the quarantine's event,
    and after a failed probe, another full ``after`` later (this process remembers, for up to
    ``capacity`` objects). ``after`` of 0 turns probing off. ``not_found`` and ``corrupt``
    quarantines are never probed: only an operator's verified recovery lifts those."""

    def __init__(self, after: float, *, now: Callable[[], datetime] | None = None,
                 monotonic: Callable[[], float] = time.monotonic, capacity: int = 10_000) -> None:
        self.after = after
        self._now = now or (lambda: datetime.now(UTC))
        self._monotonic = monotonic
        self._capacity = capacity
        self._failed: OrderedDict[str, float] = OrderedDict()

    def due(self, state: SessionState, ids: Iterable[str]) -> frozenset[str]:
        if self.after <= 0:
            return frozenset()
        now, clock = self._now(), self._monotonic()
        found = set()
        for aid in ids:
            quarantine = state.quarantined.get(aid)
            if quarantine is None or not quarantine.retryable:
                continue
            failed = self._failed.get(aid)
            if failed is not None and clock - failed < self.after:
                continue
            since = _parse_time(state.since.get(aid, ""))
            if since is not None and (now - since).total_seconds() >= self.after:
                found.add(aid)
        return frozenset(found)

    def failed(self, attachment_id: str) -> None:
        self._failed[attachment_id] = self._monotonic()
        self._failed.move_to_end(attachment_id)
        while len(self._failed) > self._capacity:
            self._failed.popitem(last=False)


def _parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


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
    type, dimensions) and the attachment is still quarantined when the append happens; a failed
    verification raises ``Conflict`` (409) carrying the failure code and appends nothing; a
    reference that is not quarantined appends nothing.
    """
    check_id(attachment_id)
    state = await refresh(log, session_id, state or EMPTY)
    if attachment_id not in state.quarantined:
        return Recovery(None, state)
    result = await _read_once(store, attachment_id)
    if isinstance(result, AttachmentError):
        raise Conflict(f"verification failed: {result.code}", code=result.code, status=409)
    data = Recovered(result.id, result.bytes, result.media_type, result.width, result.height)
    async with lock or contextlib.nullcontext():
        for _ in range(MAX_ROUNDS):
            state = await refresh(log, session_id, state)
            if attachment_id not in state.quarantined:
                return Recovery(None, state)
            try:
                events = await log.append(session_id, state.last_seq, [data])
            except AppendConflict:
                continue
            event = events[0]
            assert isinstance(event, RecoveredEvent)
            return Recovery(event, await _settle(log, session_id, state, events))
    raise Unavailable("session log kept changing while recovering", code="SESSION_CONTENDED")
