"""Session summaries: one line per session for the CLI, the admin API and the admin page (proxy layer).

The counts, last seq and last time come from the log's index in one query
(``Log.session_stats``); the standing quarantines from the session's fold. A fold this process
holds at the session's last seq costs nothing; any other is brought up to date through
``CachedLog.read_state`` (the state events past what it holds, from the latest checkpoint on),
so asking twice reads nothing twice.
"""

from __future__ import annotations

import asyncio
from typing import Final

import msgspec

from ...policy.fold import EMPTY, SessionState
from ...policy.projection import refresh
from .base import SessionStats
from .cached import CachedLog

#: Folds brought up to date at once while summarising many sessions (the SQLite read lane has two
#: threads; more would only queue there, behind requests).
FOLDS_AT_ONCE: Final = 4


class SessionSummary(msgspec.Struct, frozen=True):
    """One session: ``events`` in its log, ``quarantined`` its standing quarantines (store
    failures, and rejections per upstream format), ``last_seq``, and ``last_activity``, the time
    of its latest event as the log stored it."""

    session: str
    events: int
    quarantined: int
    last_seq: int
    last_activity: str


async def summaries(log: CachedLog, *, limit: int | None = None, skip: int = 0) -> list[SessionSummary]:
    """Every session of ``log`` (at most ``limit``), the most recently active first; the first
    ``skip`` of them left out (only the others are folded)."""
    stats = (await log.inner.session_stats(limit=limit))[skip:]
    gate = asyncio.Semaphore(FOLDS_AT_ONCE)

    async def one(found: SessionStats) -> SessionSummary:
        async with gate:
            return await _summarise(log, found)

    return list(await asyncio.gather(*(one(found) for found in stats)))


async def summary(log: CachedLog, session: str) -> SessionSummary | None:
    """The summary of ``session``, or None when its log holds no event."""
    stats = await log.inner.session_stats(session)
    return await _summarise(log, stats[0]) if stats else None


async def _summarise(log: CachedLog, stats: SessionStats) -> SessionSummary:
    state = await _state_at(log, stats.session, stats.last_seq)
    return SessionSummary(session=stats.session, events=stats.events,
                          quarantined=len(state.quarantined) + len(state.rejected),
                          last_seq=stats.last_seq, last_activity=stats.last_time)


async def _state_at(log: CachedLog, session: str, last_seq: int) -> SessionState:
    """The session's fold at ``last_seq`` or later: the cached one when it is that far already."""
    cached = log.state(session)
    if cached is not None and cached.last_seq >= last_seq:
        return cached
    return await refresh(log, session, cached or EMPTY)
