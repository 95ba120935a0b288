"""Retention (issue 37, item 4): records older than a time become stand-ins of their seq, time and
type; state events, seqs and everything stored since stay byte for byte, so folds, forks and
state reads are what they were. On both backends (SQLite's rows of several records included)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from projectionist.policy.events import PRUNED, RequestEvent, ResponseEvent, UnknownEvent, encode_event, event_type
from projectionist.policy.fold import fold
from projectionist.proxy.sessionlog.base import Pruned
from projectionist.proxy.sessionlog.postgres import PostgresLog
from projectionist.proxy.sessionlog.retention import cutoff, keep_pruning
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from tests.records import whole_calls
from tests.proxy.sessionlog.test_log_contract import ID_B, LogBackend, log_backend, q, rec, record  # noqa: F401

OLD, CUT, NEW = "2026-01-01T00:00:00.000Z", "2026-06-01T00:00:00.000Z", "2026-12-01T00:00:00.000Z"


class Clock:
    """The log's clock, set by the test: what it says is the time of the next append."""

    def __init__(self, now: str = OLD) -> None:
        self.now = now

    def __call__(self) -> str:
        return self.now


async def a_session(log: SqliteLog | PostgresLog, clock: Clock, session: str = "s") -> None:
    """State events and records, old and new; old records also as one group commit (SQLite: one row)."""
    clock.now = OLD
    await log.append(session, 0, [q()])
    await asyncio.gather(*(log.append(session, None, [record()], durable=False) for _ in range(3)))
    events = await log.read(session)
    await log.append(session, events[-1].seq, [rec()])
    await log.append(session, None, [record()], durable=False)
    clock.now = NEW
    await log.append(session, None, [record(), record()], durable=False)
    await log.append(session, None, [q(ID_B)])


async def test_old_records_become_stand_ins_and_nothing_else_changes(log_backend: LogBackend) -> None:
    clock = Clock()
    log = log_backend.make(clock=clock)
    await a_session(log, clock)
    await a_session(log, clock, "other")
    before = await log.read("s")
    state_before = await log.read_state("s")
    done = await log.prune(CUT)
    after = await log.read("s")
    assert [e.seq for e in after] == [e.seq for e in before] == list(range(1, len(before) + 1))  # no gap
    old_records = [e for e in before if isinstance(e, (RequestEvent, ResponseEvent)) and e.time == OLD]
    assert len(old_records) == 4 and done.records == 8 and done.sessions == 2
    for was, now in zip(before, after):
        if was in old_records:
            assert isinstance(now, UnknownEvent) and now.type == PRUNED and (now.seq, now.time) == (was.seq, was.time)
            assert msgspec.json.decode(now.data) == {"was": event_type(was.data)}
        else:  # state events and new records: byte for byte
            assert encode_event(now) == encode_event(was)
    assert fold(after) == fold(before)
    assert await log.read_state("s") == state_before
    assert 0 < done.bytes_after < done.bytes_before  # (these records are small: a real call's are ~1.8 KB)
    assert await log.prune(CUT) == Pruned()  # pruned already: nothing to do
    assert await log.read("s") == after


async def test_old_whole_calls_become_stand_ins_like_any_record(log_backend: LogBackend) -> None:
    """Records appended as whole calls (``append_calls``; SQLite: a row in their short form) are
    pruned like any other: each old one a stand-in of its seq, time and type, the new ones kept."""
    clock = Clock()
    log = log_backend.make(clock=clock)
    await log.append("s", 0, [q()])
    await log.append_calls("s", whole_calls(4))
    clock.now = NEW
    await log.append_calls("s", whole_calls(2, "new"))
    before = await log.read("s")
    done = await log.prune(CUT)
    after = await log.read("s")
    assert [e.seq for e in after] == [e.seq for e in before] == [1, 2, 3, 4, 5, 6, 7]
    assert done.records == 4 and done.sessions == 1
    assert [(e.seq, e.time, msgspec.json.decode(e.data)) for e in after[1:5] if isinstance(e, UnknownEvent)
            and e.type == PRUNED] == [(e.seq, OLD, {"was": "request/recorded"}) for e in before[1:5]]
    assert [encode_event(e) for e in after[:1] + after[5:]] == [encode_event(e) for e in before[:1] + before[5:]]
    assert await log.prune(CUT) == Pruned()
    assert await log.read("s") == after


async def test_a_prune_of_one_session_leaves_the_others(log_backend: LogBackend) -> None:
    clock = Clock()
    log = log_backend.make(clock=clock)
    await a_session(log, clock, "one")
    await a_session(log, clock, "two")
    two = await log.read("two")
    done = await log.prune(NEW, session="one")
    assert done.records == 4 and done.sessions == 1
    assert await log.read("two") == two
    assert sum(isinstance(e, UnknownEvent) for e in await log.read("one")) == 4


async def test_a_fork_of_a_pruned_session_folds_the_same(log_backend: LogBackend) -> None:
    clock = Clock()
    log = log_backend.make(clock=clock)
    await a_session(log, clock)
    await log.prune(CUT)
    parent = await log.read("s")
    middle = next(e.seq for e in parent if isinstance(e, UnknownEvent)) + 1  # inside the pruned run
    await log.fork("s", "child", middle)
    child = await log.read("child")
    assert [encode_event(e) for e in child[:middle]] == [encode_event(e) for e in parent[:middle]]
    assert fold(child[:-1]).quarantined == fold(parent[:middle]).quarantined


async def test_appends_go_on_while_a_prune_runs(log_backend: LogBackend) -> None:
    clock = Clock()
    log = log_backend.make(clock=clock)
    for n in range(600):  # more rows than one transaction of a prune takes
        await log.append(f"s{n % 3}", None, [record()], durable=False)
    clock.now = NEW

    async def appends() -> None:
        for n in range(60):
            last = (await log.read_state("s0")).last_seq
            await log.append("s0", last, [q(f"sha256:{n:064x}")])

    done, _ = await asyncio.gather(log.prune(CUT), appends())
    assert done.records == 600
    events = await log.read("s0")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(fold(events).quarantined) == 60


async def test_the_server_prunes_on_its_own_and_a_failed_prune_is_tried_again(tmp_path: Any) -> None:
    clock = Clock()
    log = SqliteLog(tmp_path / "log.db", clock=clock)
    await log.append("s", None, [record()], durable=False)
    calls: list[str] = []
    real = log.prune

    async def flaky(before: str, session: str | None = None) -> Pruned:
        calls.append(before)
        if len(calls) == 1:
            raise OSError("disk on fire")
        return await real(before, session)

    log.prune = flaky  # type: ignore[method-assign]
    task = asyncio.ensure_future(keep_pruning(log, 30, every=0.01, first_after=0))
    try:
        for _ in range(500):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(calls) >= 2 and calls[0] <= cutoff(30)
    assert isinstance((await log.read("s"))[0], UnknownEvent)
    await log.close()


@pytest.mark.parametrize("days", [0, 30, 0.5])
def test_the_cutoff_is_written_as_the_log_writes_times(days: float) -> None:
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 12, 5, 12, 0, 0, 123000, tzinfo=UTC)
    at = cutoff(days, now)
    assert len(at) == len(NEW) and at.endswith("Z")
    assert datetime.fromisoformat(at.replace("Z", "+00:00")) == now - timedelta(days=days)
