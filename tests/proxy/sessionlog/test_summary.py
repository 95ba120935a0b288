"""Session summaries (what the inspector's list shows): events, standing quarantines and the last
activity of every session, read through the cached log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from projectionist.policy.events import Quarantine, Recovered, Rejected
from projectionist.proxy.sessionlog.cached import CachedLog
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.sessionlog.summary import SessionSummary, summaries, summary

A, B, C = (f"sha256:{c * 64}" for c in "abc")


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[CachedLog]:
    cached = CachedLog(SqliteLog(tmp_path / "log.db"))
    await cached.start()
    yield cached
    await cached.close()


async def test_summaries_count_events_and_standing_quarantines(log: CachedLog) -> None:
    assert await summaries(log) == [] and await summary(log, "nobody") is None
    await log.append("s1", 0, [Quarantine(A, "not_found", False, name="a.png")])
    await log.append("s1", 1, [Quarantine(B, "corrupt", False)])
    await log.append("s1", 2, [Rejected(C, "openai_chat", 1, "sha256:" + "0" * 64)])
    await log.append("s1", None, [Recovered(A, 10, "image/png", 1, 1)])
    await log.fork("s1", "s2", 2)
    events = await log.read("s1")
    assert [e.seq for e in events] == list(range(1, len(events) + 1)) and len(events) == 4

    found = {s.session: s for s in await summaries(log)}
    assert found["s1"] == SessionSummary("s1", len(events), 2, len(events), events[-1].time)
    s2 = await log.read("s2")
    assert found["s2"] == SessionSummary("s2", 3, 2, 3, s2[-1].time)
    assert await summary(log, "s2") == found["s2"]
