"""One line per session: how many events, how many standing quarantines, the last activity
(proxy layer, sessionlog).

What the inspector's session list shows. A summary costs a state read (from the latest
checkpoint on; the fold cache keeps it) and a read of the session's last event.
"""

from __future__ import annotations

from typing import Protocol, cast

import msgspec

from projectionist.policy.fold import fold_states
from projectionist.proxy.sessionlog.cached import CachedLog


class SessionSummary(msgspec.Struct, frozen=True):
    session: str
    events: int
    quarantined: int
    last_seq: int
    last_activity: str


class _Listing(Protocol):
    async def sessions(self) -> list[str]: ...


async def summary(log: CachedLog, session: str) -> SessionSummary | None:
    """The summary of ``session``, or None when it has no events. Seqs are contiguous from 1
    (a fork copies its prefix verbatim), so the last seq is the number of events."""
    read = await log.read_state(session)
    if read.last_seq == 0:
        return None
    state = fold_states(read.events, read.last_seq)
    last = await log.read(session, read.last_seq - 1)
    return SessionSummary(session, read.last_seq, len(state.quarantined) + len(state.rejected), read.last_seq,
                          last[-1].time if last else "")


async def summaries(log: CachedLog) -> list[SessionSummary]:
    """Every session with at least one event, in the backend's order (by id)."""
    if not hasattr(log.inner, "sessions"):
        return []
    found = [await summary(log, session) for session in await cast(_Listing, log.inner).sessions()]
    return [s for s in found if s is not None]
