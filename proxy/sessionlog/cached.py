"""The session log as the proxy uses it: one owner of the per-session fold cache, locks and checkpoints (proxy layer).

``CachedLog`` wraps a backend and is itself a ``SessionLog``. Every state read past a cached
fold's last seq, and every append it makes, moves that fold forward, so the policy only ever
reads the state events it has not seen (usually none) and nobody else updates the cache. The fold
of another replica's or process's appends arrives through those reads on the next request. The
lock per session serialises this process's decisions; the backend's conditional append covers
the rest.

When a fold it learns has folded enough state events since the last checkpoint
(``fold.checkpoint_due``), it appends a ``session/checkpoint`` restating it, conditional on that
fold's last seq, so a cold process folds from the checkpoint instead of from seq 1. Across
replicas: the append fails (and is simply skipped) if any state event came after that seq, so a
checkpoint always equals the fold at its own seq; records and other checkpoints may lie between,
and change nothing. Checkpoints never make anyone else's append conflict. Two replicas may both
write one at the same moment; the second is redundant and harmless.

With a backend that pushes state-change notices (``inner.watch``, PostgreSQL), ``fresh`` hands
out a cached fold without any read while the watch vouches that nothing changed since the read
behind it (``sessionlog.watch`` says what that makes staler, and why replay stays exact).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Sequence

from ...policy.errors import AppendConflict, Unavailable
from ...policy.events import CallRecords, Event, EventData, ForkedEvent
from ...policy.fold import (
    CHECKPOINT_EVERY,
    EMPTY,
    SessionState,
    checkpoint_due,
    checkpoint_of,
    fold,
    fold_states,
)
from ...policy.ports import StateRead
from ..observe.logger import get_logger
from .base import Log, Pruned
from .watch import Mark, StateWatch


class StateCache:
    """Folded ``SessionState`` of the most recently used sessions, bounded by count (LRU)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._states: OrderedDict[str, SessionState] = OrderedDict()

    def get(self, session_id: str) -> SessionState | None:
        state = self._states.get(session_id)
        if state is not None:
            self._states.move_to_end(session_id)
        return state

    def put(self, session_id: str, state: SessionState) -> None:
        current = self._states.get(session_id)
        if current is not None and current.last_seq > state.last_seq:
            return  # a concurrent request already cached a newer fold
        self._states[session_id] = state
        self._states.move_to_end(session_id)
        while len(self._states) > self.capacity:
            self._states.popitem(last=False)

    def __len__(self) -> int:
        return len(self._states)


class CachedLog:
    """A ``Log`` plus the fold cache and the session locks of this process."""

    def __init__(self, inner: Log, sessions: int = 10_000, checkpoint_every: int = 0) -> None:
        self.inner = inner
        self.states = StateCache(sessions)
        #: state events between checkpoints (``fold.CHECKPOINT_EVERY`` unless a test sets it)
        self.checkpoint_every = checkpoint_every or CHECKPOINT_EVERY
        self._checkpointing: set[str] = set()  # sessions with a checkpoint append in flight here
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self.watch: StateWatch | None = getattr(inner, "watch", None)
        self._vouched: OrderedDict[str, Mark] = OrderedDict()  # the watch's mark behind each cached fold

    def fresh(self, session_id: str) -> SessionState | None:
        """The cached fold of ``session_id`` when the watch vouches that it is current (no state
        read needed), else None."""
        if self.watch is None:
            return None
        cached = self.states.get(session_id)
        if cached is None or not self.watch.unchanged(session_id, self._vouched.get(session_id)):
            return None
        return cached

    def _vouch(self, session_id: str, mark: Mark) -> None:
        self._vouched[session_id] = mark
        self._vouched.move_to_end(session_id)
        while len(self._vouched) > self.states.capacity:
            self._vouched.popitem(last=False)

    def state(self, session_id: str) -> SessionState | None:
        """The cached fold of ``session_id`` (refresh it by reading past its ``last_seq``)."""
        return self.states.get(session_id)

    def lock(self, session_id: str) -> asyncio.Lock:
        """This process's lock for decisions about ``session_id`` (alive while anyone holds it)."""
        found = self._locks.get(session_id)
        if found is None:
            found = self._locks[session_id] = asyncio.Lock()
        return found

    @staticmethod
    def _base(cached: SessionState | None, after_seq: int) -> SessionState | None:
        """The fold that events read or appended after ``after_seq`` continue, if this process has it."""
        if cached is not None:
            return cached if cached.last_seq == after_seq else None
        return EMPTY if after_seq == 0 else None

    def _learn(self, session_id: str, after_seq: int, events: list[Event]) -> SessionState | None:
        """Fold ``events`` (everything after ``after_seq``) into the cache when they continue it."""
        cached = self.states.get(session_id)
        base = self._base(cached, after_seq)
        if base is None or not events and cached is not None:
            return None
        state = fold(events, base)
        self.states.put(session_id, state)
        return state

    def _learn_states(self, session_id: str, after_seq: int, read: StateRead) -> SessionState | None:
        """Fold a state read past ``after_seq`` into the cache when it continues it."""
        cached = self.states.get(session_id)
        base = self._base(cached, after_seq)
        if base is None or not read.events and cached is not None and read.last_seq == cached.last_seq:
            return None
        state = fold_states(read.events, read.last_seq, base)
        self.states.put(session_id, state)
        return state

    async def _checkpoint(self, session_id: str, before: SessionState | None, after: SessionState | None) -> None:
        """Append a checkpoint of ``after`` when one is due and this learning step made it so
        (new state events, not a mere record). Best effort: a conflict (a state event came
        first) or an unavailable log skips it; the next state event tries again."""
        if after is None or before is not None and after.unsaved <= before.unsaved:
            return
        if not checkpoint_due(after, self.checkpoint_every) or session_id in self._checkpointing:
            return
        self._checkpointing.add(session_id)
        try:
            events = await self.inner.append(session_id, after.last_seq, [checkpoint_of(after)], durable=False)
        except (AppendConflict, Unavailable) as error:
            get_logger().info("checkpoint_skipped", session=session_id, reason=type(error).__name__)
            return
        finally:
            self._checkpointing.discard(session_id)
        if events:
            self._learn(session_id, events[0].seq - 1, events)

    # -- SessionLog ------------------------------------------------------------------------------

    async def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        events = await self.inner.read(session_id, after_seq)
        self._learn(session_id, after_seq, events)
        return events

    async def read_state(self, session_id: str, after_seq: int = 0) -> StateRead:
        mark = self.watch.mark() if self.watch is not None else None  # before the read: a later notice voids it
        read = await self.inner.read_state(session_id, after_seq)
        before = self.states.get(session_id)
        learned = self._learn_states(session_id, after_seq, read)
        cached = self.states.get(session_id)
        if mark is not None and cached is not None and cached.last_seq == read.last_seq:
            self._vouch(session_id, mark)  # the cache now holds what this read saw
        await self._checkpoint(session_id, before, learned)
        return read

    async def append(
        self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *, durable: bool = True
    ) -> list[Event]:
        events = await self.inner.append(session_id, expected_seq, data, durable=durable)
        if events:
            before = self.states.get(session_id)
            await self._checkpoint(session_id, before, self._learn(session_id, events[0].seq - 1, events))
        return events

    async def append_calls(self, session_id: str, calls: CallRecords) -> int:
        """Records only: the cached fold just moves on to their last seq (when it was at the seq
        before them), as ``append`` of the same records would."""
        last = await self.inner.append_calls(session_id, calls)
        self._learn_states(session_id, last - len(calls.calls), StateRead([], last))
        return last

    async def fork(self, parent: str, child: str, at_seq: int | None = None) -> ForkedEvent:
        return await self.inner.fork(parent, child, at_seq)

    async def prune(self, before: str, session: str | None = None) -> Pruned:
        """Records only: no state event changes, so no cached fold goes stale."""
        return await self.inner.prune(before, session)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()
