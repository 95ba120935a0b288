"""The one way a decision reaches the session log (policy layer, pure: the log is the
``SessionLog`` port). Under the caller's per-session lock, ``transition`` refolds, appends what is
still missing conditionally on the fresh state, and on a conflict refolds and asks again, so
concurrent deciders, also across replicas, make exactly one transition: a quarantine recorded,
a variant pinned, a probed quarantine lifted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from .errors import AppendConflict, Code, Unavailable
from .events import Event, EventData, Learnt, Quarantine, Recovered, Rejected, Variant
from .fold import EMPTY, SessionState, fold, fold_states
from .model import StoredImage
from .ports import SessionLog
from .rejection import stands

#: The caller's per-session lock (an ``asyncio.Lock``, or one shared across a process's requests).
Lock = contextlib.AbstractAsyncContextManager[Any]
_D = TypeVar("_D", bound=EventData)

#: Bound on re-fold rounds when other writers keep changing the session under us.
MAX_ROUNDS: Final = 8


async def refresh(log: SessionLog, session_id: str, state: SessionState = EMPTY) -> SessionState:
    """Fold whatever the log holds beyond ``state`` (a cached state stays valid across replicas);
    only state events are read, from the latest checkpoint on."""
    read = await log.read_state(session_id, state.last_seq)
    return fold_states(read.events, read.last_seq, state)


async def transition(
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
    raise Unavailable(f"session log kept changing while {doing}", code=Code.SESSION_CONTENDED)


async def _settle(log: SessionLog, session_id: str, state: SessionState, appended: list[Event]) -> SessionState:
    """``state`` after our own append: folded on directly, or, when records others appended lie
    between (they never conflict), refreshed from the log."""
    if appended and appended[0].seq == state.last_seq + 1:
        return fold(appended, state)
    return await refresh(log, session_id, state)


async def record(
    log: SessionLog,
    session_id: str,
    state: SessionState,
    wanted: Sequence[Quarantine | Rejected],
    lock: Lock,
) -> tuple[SessionState, tuple[Quarantine | Rejected, ...]]:
    """Append the quarantines not yet in the log; the loser of a race re-folds and decides again."""
    state, new, _ = await transition(log, session_id, state, lock, "recording",
                                     lambda now: [q for q in wanted if not _stands(now, q)])
    return state, tuple(new)


def _stands(state: SessionState, quarantine: Quarantine | Rejected) -> bool:
    """Whether the log already holds this quarantine (a rejection: for its own format)."""
    if isinstance(quarantine, Rejected):
        return (quarantine.format, quarantine.attachment_id) in state.rejected
    return quarantine.attachment_id in state.quarantined


async def teach(log: SessionLog, session_id: str, state: SessionState, rule: Learnt, lock: Lock
                ) -> tuple[SessionState, bool]:
    """Append the rule unless one as strict stands for its upstream, model and kind (one
    transition, also across replicas); whether it was appended."""
    def missing(now: SessionState) -> list[Learnt]:
        return [] if stands(rule, now.learnt.get((rule.upstream, rule.model, rule.rule))) else [rule]

    state, new, _ = await transition(log, session_id, state, lock, "learning a rule", missing)
    return state, bool(new)


async def pin(log: SessionLog, session_id: str, state: SessionState, variants: Sequence[Variant], lock: Lock
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

    return (await transition(log, session_id, state, lock, "pinning variants", missing))[0]


async def lift(
    log: SessionLog, session_id: str, state: SessionState, images: Sequence[StoredImage], lock: Lock
) -> tuple[SessionState, tuple[str, ...]]:
    """Append ``attachment/recovered`` (``automatic``) for the images whose probed quarantine
    (``Quarantine.probed``) still stands; the loser of a race re-folds and finds it lifted already
    (one transition)."""
    def missing(now: SessionState) -> list[Recovered]:
        return [Recovered(i.id, i.bytes, i.media_type, i.width, i.height, automatic=True) for i in images
                if (quarantine := now.quarantined.get(i.id)) is not None and quarantine.probed]

    state, new, _ = await transition(log, session_id, state, lock, "lifting quarantines", missing)
    return state, tuple(r.attachment_id for r in new)
