"""Retention of the session log: records older than ``[record] keep_days`` pruned, by the server
every ``[record] prune_every`` seconds and by ``projectionist prune`` (proxy layer).

A session's log holds two kinds of event. State events (quarantines, recoveries, forks, variant
pins, refusals learnt, checkpoints) are what every projection is decided on: they are kept for
good, so restart, fork and replay rebuild the same upstream bodies however old the session.
Records (a call's request and response: what the console shows and ``replay`` sends again) are
evidence: past the retention each becomes a stand-in of its seq, time and type (``PRUNED``,
~90 bytes against ~1.8 KB), so no seq goes missing and no reader sees a gap. A pruned call can
no longer be replayed or shown; everything kept is as it was, byte for byte.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

from ..observe.logger import get_logger
from .base import Pruned


class Prunable(Protocol):
    """What retention needs of a log (``base.Log.prune``; the cached log passes it through)."""

    async def prune(self, before: str, session: str | None = None) -> Pruned: ...


def cutoff(keep_days: float, now: datetime | None = None) -> str:
    """The time before which records are pruned, written as the log writes times."""
    at = (now or datetime.now(UTC)) - timedelta(days=keep_days)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def prune(log: Prunable, keep_days: float, session: str | None = None) -> Pruned:
    """Prune the records of ``log`` older than ``keep_days`` (in one session, or all)."""
    return await log.prune(cutoff(keep_days), session)


#: Seconds after start-up the server's first prune waits (start-up and its first calls go first).
FIRST_AFTER = 60.0


async def keep_pruning(log: Prunable, keep_days: float, every: float, first_after: float = FIRST_AFTER) -> None:
    """The server's retention: a prune ``first_after`` seconds from now, then every ``every``
    seconds, until cancelled. A prune that fails is logged and tried again next time (the calls go
    on: a prune is never on their way)."""
    await asyncio.sleep(min(first_after, every))
    while True:
        started = time.perf_counter()
        try:
            done = await prune(log, keep_days)
            get_logger().info("log_pruned", records=done.records, sessions=done.sessions, keep_days=keep_days,
                              bytes_before=done.bytes_before, bytes_after=done.bytes_after,
                              duration_ms=round((time.perf_counter() - started) * 1000, 1))
        except Exception as exc:
            get_logger().warning("log_prune_failed", error=type(exc).__name__, code=getattr(exc, "code", None))
        await asyncio.sleep(every)
