"""Session identification and per-session locks (proxy layer).

The session id comes from a configurable header (with aliases). The lock registry hands out one
``asyncio.Lock`` per live session, held only while a decision is recorded; the log's conditional
append covers writers in other processes.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from typing import Final

from multidict import MultiMapping

from policy.errors import InvalidRequest

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
