"""Session identification and per-session locks (proxy layer).

The session id comes from a configurable header (with aliases). The lock registry hands out one
``asyncio.Lock`` per live session, held only while a decision is recorded; the log's conditional
append covers writers in other processes. ``StateCache`` keeps the folded state of recently used
sessions: the policy still reads the log after the cached last seq on every request (an indexed
range read, empty unless someone else appended), so another replica's quarantine or recovery is
seen on the next request.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections import OrderedDict
from typing import Final

from multidict import MultiMapping

from projectionist.policy.errors import InvalidRequest
from projectionist.policy.fold import SessionState

_SESSION_RE: Final = re.compile(r"[\x21-\x7e]{1,256}")


def parse_session_id(value: str) -> str:
    """A session id is 1-256 visible ASCII characters; anything else is the client's error."""
    if _SESSION_RE.fullmatch(value) is None:
        raise InvalidRequest("session id must be 1-256 visible ASCII characters", code="INVALID_SESSION_ID")
    return value


def session_from_headers(headers: MultiMapping[str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            return parse_session_id(value)
    return None


class SessionLocks:
    """One lock per session id, alive while anyone holds it (weakly kept otherwise)."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def __call__(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock


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
