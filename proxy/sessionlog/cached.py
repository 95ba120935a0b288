"""The session log as the proxy uses it: one owner of the per-session fold cache and locks (proxy layer).

``CachedLog`` wraps a backend and is itself a ``SessionLog``. Every read past a cached fold's
last seq, and every append it makes, moves that fold forward, so the policy only ever reads the
events it has not seen (usually none) and nobody else updates the cache. The fold of another
replica's or process's appends arrives through those reads on the next request. The lock per
session serialises this process's decisions; the backend's conditional append covers the rest.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Sequence

from projectionist.policy.events import Event, EventData, ForkedEvent
from projectionist.policy.fold import EMPTY, SessionState, fold
from projectionist.proxy.sessionlog.base import Log


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

    def __init__(self, inner: Log, sessions: int = 10_000) -> None:
        self.inner = inner
        self.states = StateCache(sessions)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def state(self, session_id: str) -> SessionState | None:
        """The cached fold of ``session_id`` (refresh it by reading past its ``last_seq``)."""
        return self.states.get(session_id)

    def lock(self, session_id: str) -> asyncio.Lock:
        """This process's lock for decisions about ``session_id`` (alive while anyone holds it)."""
        found = self._locks.get(session_id)
        if found is None:
            found = self._locks[session_id] = asyncio.Lock()
        return found

    def _learn(self, session_id: str, after_seq: int, events: list[Event]) -> None:
        """Fold ``events`` (everything after ``after_seq``) into the cache when they continue it."""
        cached = self.states.get(session_id)
        base = cached if cached is not None else (EMPTY if after_seq == 0 else None)
        if base is None or base.last_seq != after_seq or not events and cached is not None:
            return
        self.states.put(session_id, fold(events, base))

    # -- SessionLog ------------------------------------------------------------------------------

    async def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        events = await self.inner.read(session_id, after_seq)
        self._learn(session_id, after_seq, events)
        return events

    async def append(
        self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *, durable: bool = True
    ) -> list[Event]:
        events = await self.inner.append(session_id, expected_seq, data, durable=durable)
        if events:
            self._learn(session_id, events[0].seq - 1, events)
        return events

    async def fork(self, parent: str, child: str, at_seq: int | None = None) -> ForkedEvent:
        return await self.inner.fork(parent, child, at_seq)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()
