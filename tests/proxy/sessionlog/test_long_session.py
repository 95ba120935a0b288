"""State reads and checkpoints on every backend (SQLite and PostgreSQL), up to a 100,000-event session.

``read_state`` ships the state events only, from the latest checkpoint on, and the session's last
seq; a checkpoint is appended conditionally like any state event but never makes anyone else's
append conflict; fork copies checkpoints verbatim. A cold process folds a long session by reading
a bounded number of rows (counted as the backend returns them, not timed), and gets the state of
a full fold from scratch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from projectionist.policy.errors import AppendConflict
from projectionist.policy.events import (
    CheckpointEvent,
    Event,
    EventData,
    ForkedEvent,
    QuarantineEvent,
    ResponseRecorded,
)
from projectionist.policy.fold import (
    CHECKPOINT_EVERY,
    CHECKPOINT_SPREAD,
    SessionState,
    checkpoint_of,
    fold,
    fold_states,
)
from projectionist.policy.ports import StateRead
from projectionist.policy.projection import refresh
from projectionist.proxy.sessionlog.base import SessionStats
from projectionist.proxy.sessionlog.cached import CachedLog
from projectionist.proxy.sessionlog.postgres import PostgresLog
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from tests.proxy.sessionlog.test_log_contract import (  # noqa: F401  (fixtures, used by name)
    ID_A,
    ID_B,
    ID_C,
    LogBackend,
    log,
    log_backend,
    q,
    rec,
    record,
)


class CountingLog:
    """A backend that counts the rows each kind of read returned."""

    def __init__(self, inner: SqliteLog | PostgresLog) -> None:
        self.inner = inner
        self.state_rows = 0
        self.state_reads = 0
        self.full_rows = 0
        self.full_reads = 0

    async def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        events = await self.inner.read(session_id, after_seq)
        self.full_reads += 1
        self.full_rows += len(events)
        return events

    async def read_state(self, session_id: str, after_seq: int = 0) -> StateRead:
        read = await self.inner.read_state(session_id, after_seq)
        self.state_reads += 1
        self.state_rows += len(read.events)
        return read

    async def session_stats(self, session: str | None = None, limit: int | None = None) -> list[SessionStats]:
        return await self.inner.session_stats(session, limit)

    async def append(self, session_id: str, expected_seq: int | None, data: Any, *, durable: bool = True) -> list[Event]:
        return await self.inner.append(session_id, expected_seq, data, durable=durable)

    async def fork(self, parent: str, child: str, at_seq: int | None = None) -> ForkedEvent:
        return await self.inner.fork(parent, child, at_seq)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()


# -- the read_state contract -----------------------------------------------------------------------


async def test_read_state_skips_records_and_reports_the_last_seq(log: SqliteLog | PostgresLog) -> None:
    assert await log.read_state("nobody") == StateRead([], 0)
    a = await log.append("s", 0, [q(ID_A)])
    await log.append("s", None, [record(), record()])
    b = await log.append("s", 1, [q(ID_B), rec(ID_A)])  # records in between never conflict
    await log.append("s", None, [record()])
    read = await log.read_state("s")
    assert read == StateRead(a + b, 6)
    assert await log.read_state("s", 1) == StateRead(b, 6)
    assert await log.read_state("s", 5) == StateRead([], 6)
    assert await log.read_state("s", 99) == StateRead([], 6)
    assert fold_states(read.events, read.last_seq) == fold(await log.read("s"))


async def test_read_state_starts_at_the_latest_checkpoint(log: SqliteLog | PostgresLog) -> None:
    await log.append("s", 0, [q(ID_A), q(ID_B)])
    await log.append("s", None, [record()])
    first = await log.append("s", 2, [checkpoint_of(fold(await log.read("s")))])
    more = await log.append("s", 4, [rec(ID_A)])
    second = await log.append("s", 5, [checkpoint_of(fold(await log.read("s")))])
    tail = await log.append("s", 6, [q(ID_C)])
    await log.append("s", None, [record()])
    assert isinstance(first[0], CheckpointEvent) and first[0].seq == 4
    assert (await log.read_state("s")).events == second + tail
    assert (await log.read_state("s", 5)).events == second + tail
    assert (await log.read_state("s", 3)).events == second + tail
    assert (await log.read_state("s", 6)).events == tail
    assert (await log.read_state("s", 6)).last_seq == 8
    whole = fold(await log.read("s"))
    assert fold_states((await log.read_state("s")).events, 8) == whole
    assert fold_states((await log.read_state("s", 2)).events, 8, fold((await log.read("s"))[:2])) == whole
    assert set(whole.quarantined) == {ID_B, ID_C} and more[0].seq == 5


async def test_a_checkpoint_is_conditional_but_never_makes_others_conflict(log: SqliteLog | PostgresLog) -> None:
    await log.append("s", 0, [q(ID_A)])
    state = fold(await log.read("s"))
    # Only records between: the checkpoint lands and still restates the fold at its seq.
    await log.append("s", None, [record()])
    [mark] = await log.append("s", state.last_seq, [checkpoint_of(state)], durable=False)
    assert mark.seq == 3
    # Another writer that expected seq 1 is not held up by that checkpoint.
    assert [e.seq for e in await log.append("s", 1, [q(ID_B)])] == [4]
    # A state event after the checkpoint's basis: the checkpoint is refused, nothing is written.
    with pytest.raises(AppendConflict):
        await log.append("s", state.last_seq, [checkpoint_of(state)])
    assert [e.seq for e in await log.read("s")] == [1, 2, 3, 4]


async def test_fork_copies_checkpoints_and_the_child_folds_like_its_parent(log: SqliteLog | PostgresLog) -> None:
    await log.append("p", 0, [q(ID_A), q(ID_B)])
    await log.append("p", 2, [checkpoint_of(fold(await log.read("p")))])
    await log.append("p", 3, [rec(ID_B)])
    await log.append("p", None, [record()])
    for at in (1, 2, 3, 4, 5):
        child = f"c{at}"
        marker = await log.fork("p", child, at)
        events = await log.read(child)
        assert events[:at] == (await log.read("p"))[:at]  # checkpoints included, verbatim
        read = await log.read_state(child)
        assert read.events[-1] == marker and read.last_seq == at + 1
        assert fold_states(read.events, read.last_seq) == fold(events)


# -- a long session ---------------------------------------------------------------------------------

TOTAL = 100_000
STATE_EVERY = 97  # one state event per 97 events: ~1,000 quarantines and recoveries among records
IDS = [f"sha256:{i:064x}" for i in range(40)]


def state_event(n: int) -> EventData:
    """The n-th state event: quarantines of 40 ids in turn, every third one recovered again."""
    aid = IDS[n % len(IDS)]
    return rec(aid) if n % 3 == 2 else q(aid, name=f"shot-{n}.png")


async def build_long_session(log: CachedLog, session: str, total: int = TOTAL) -> int:
    """Fill ``session`` with ``total`` events as a proxy would: record batches, state events
    appended conditionally through the ``CachedLog`` (which writes the checkpoints). Returns the
    number of state events."""
    n = seq = 0
    while seq < total:
        batch = min(STATE_EVERY - 1, total - seq - 1)
        if batch > 0:
            data = [ResponseRecorded(request_id=f"r{seq + i}", request_seq=seq + i, status=200, latency_ms=1.0)
                    for i in range(batch)]
            seq = (await log.append(session, None, data, durable=False))[-1].seq
        state = await refresh(log, session, log.state(session) or SessionState())
        seq = (await log.append(session, state.last_seq, [state_event(n)], durable=False))[-1].seq
        n += 1
    return n


def bound(state: SessionState) -> int:
    """Rows a cold fold may read: one checkpoint and fewer than the state events that make the
    next one due."""
    return 1 + max(CHECKPOINT_EVERY, len(state.quarantined) // CHECKPOINT_SPREAD)


async def test_a_cold_fold_of_a_100k_event_session_reads_a_bounded_number_of_rows(log_backend: LogBackend) -> None:
    writer = CachedLog(log_backend.make())
    states = await build_long_session(writer, "long")
    full = await log_backend.make().read("long")
    assert len(full) >= TOTAL and states >= 1000
    checkpoints = [e for e in full if isinstance(e, CheckpointEvent)]
    assert len(checkpoints) >= states // max(CHECKPOINT_EVERY, len(IDS) // CHECKPOINT_SPREAD) - 1
    whole = fold(full)

    # A freshly started process: a new backend instance, an empty cache.
    counting = CountingLog(log_backend.make())
    cold = CachedLog(counting)
    state = await refresh(cold, "long")
    assert state == whole and cold.state("long") == whole
    assert counting.full_reads == 0
    assert 0 < counting.state_rows <= bound(whole), counting.state_rows
    assert any(isinstance(e, QuarantineEvent) for e in full[-200:])
    # Warm: the next refresh reads nothing.
    before = counting.state_rows
    assert await refresh(cold, "long", state) == whole and counting.state_rows == before

    # Fork in the middle and at the end: the children fold as from scratch, cold, bounded.
    for child, at in (("mid", 61_234), ("end", None)):
        await writer.fork("long", child, at)
        events = await log_backend.make().read(child)
        fresh = CountingLog(log_backend.make())
        assert await refresh(CachedLog(fresh), child) == fold(events)
        assert fresh.full_reads == 0 and fresh.state_rows <= bound(fold(events)) + 1  # + the fork marker


async def test_an_old_log_without_checkpoints_gets_one_on_its_first_cold_fold(log_backend: LogBackend) -> None:
    plain = log_backend.make()
    for n in range(CHECKPOINT_EVERY + 5):  # written by a version without checkpoints
        await plain.append("old", None, [state_event(n), record()], durable=False)
    first = CountingLog(log_backend.make())
    state = await refresh(CachedLog(first), "old")
    assert first.state_rows == CHECKPOINT_EVERY + 5  # all the state events, none of the records
    assert isinstance((await plain.read("old"))[-1], CheckpointEvent)
    second = CountingLog(log_backend.make())
    again = await refresh(CachedLog(second), "old")
    assert second.state_rows == 1 and again.quarantined == state.quarantined and again.since == state.since


async def test_replicas_racing_never_write_a_checkpoint_that_differs_from_the_fold_at_its_seq(
        log_backend: LogBackend) -> None:
    """Two replicas (two instances, two caches, checkpoints every 2 state events) decide on one
    session at once, each retrying after a conflict as the policy does: every checkpoint in the
    log restates exactly the fold of the events before it, and the final folds agree."""
    replicas = [CachedLog(log_backend.make(**log_backend.pool), checkpoint_every=2) for _ in range(2)]

    async def decide(log: CachedLog, tag: int) -> None:
        for n in range(40):
            while True:
                state = await refresh(log, "race", log.state("race") or SessionState())
                try:
                    await log.append("race", state.last_seq, [state_event(n * 2 + tag)], durable=False)
                    await log.append("race", None, [record()], durable=False)
                    break
                except AppendConflict:
                    continue

    await asyncio.gather(*(decide(log, tag) for tag, log in enumerate(replicas)))
    events = await log_backend.make().read("race")
    checkpoints = [e for e in events if isinstance(e, CheckpointEvent)]
    assert len(checkpoints) >= 10
    for mark in checkpoints:
        before = fold(events[:mark.seq - 1])
        assert checkpoint_of(before).quarantined == mark.data.quarantined, mark.seq
    whole = fold(events)
    for log in replicas:
        assert await refresh(log, "race", log.state("race") or SessionState()) == whole
