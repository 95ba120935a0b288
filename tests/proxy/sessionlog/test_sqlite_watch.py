"""The SQLite log's polled state-change watch: every state event leaves a row in ``state_changes``
(a trigger, so every writer of the file leaves one), and the log polls them while asked. A cached
fold is handed out without a read only while the polls are recent and none named its session;
another process's quarantine or fork voids it within a few polls, its records and checkpoints do
not; a poll that hangs or fails, or changes pruned before they were read, send every request
back to the log; a decision made between two polls still meets the conditional append."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from projectionist.proxy.sessionlog.cached import CachedLog
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.sessionlog.watch import PolledWatch
from tests.proxy.sessionlog.watching import a_stale_decision_records_one_transition, ID, quarantine, record, until, vouched as vouched_every, watch_of

INTERVAL = 0.02


async def vouched(log: CachedLog, session_id: str) -> None:
    await vouched_every(log, session_id, INTERVAL)


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[tuple[CachedLog, CachedLog, Path]]:
    """Two logs on one file, each with its own connections: as two processes share it."""
    path = tmp_path / "log.db"
    a, b = SqliteLog(path, watch_interval=INTERVAL), SqliteLog(path, watch_interval=INTERVAL)
    for log in (a, b):
        await log.start()
    try:
        yield CachedLog(a), CachedLog(b), path
    finally:
        await a.close()
        await b.close()


async def test_a_read_fold_stays_fresh_until_another_writer_changes_the_session(
        logs: tuple[CachedLog, CachedLog, Path]) -> None:
    a, b, _ = logs
    await vouched(a, "s")
    await b.append("s", None, [record("r1")], durable=False)  # records change no state: no row
    await asyncio.sleep(6 * INTERVAL)
    assert a.fresh("s") is not None
    await b.append("s", 1, [quarantine()])  # a state change: the next poll names the session
    await until(lambda: a.fresh("s") is None, "the poll to see the quarantine", seconds=1.0)
    read = await a.read_state("s", a.states.get("s").last_seq)  # type: ignore[union-attr]
    assert [e.data for e in read.events] == [quarantine()]
    await vouched(a, "s")
    fresh = a.fresh("s")
    assert fresh is not None and ID in fresh.quarantined


async def test_a_fork_by_another_writer_voids_a_cached_empty_fold(logs: tuple[CachedLog, CachedLog, Path]) -> None:
    a, b, _ = logs
    await b.append("parent", None, [quarantine()])
    await vouched(a, "child")  # the child does not exist yet: an empty fold, vouched
    await b.fork("parent", "child")
    await until(lambda: a.fresh("child") is None, "the poll to see the fork", seconds=1.0)
    await vouched(a, "child")
    state = a.fresh("child")
    assert state is not None and ID in state.quarantined


async def test_another_process_quarantine_reaches_this_one_within_a_few_polls(
        logs: tuple[CachedLog, CachedLog, Path]) -> None:
    a, _, path = logs
    await vouched(a, "p")
    script = (  # a second process on the file: not this process's connections, not its code paths
        "import asyncio, sys\n"
        "from projectionist.proxy.sessionlog.sqlite import SqliteLog\n"
        "from projectionist.policy.events import Quarantine\n"
        "async def main():\n"
        "    log = SqliteLog(sys.argv[1], watch_interval=0)\n"
        f"    await log.append('p', None, [Quarantine(attachment_id={ID!r}, failure='not_found', retryable=False)])\n"
        "    await log.close()\n"
        "asyncio.run(main())\n")
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", script, str(path)], capture_output=True,
                                   timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    await until(lambda: a.fresh("p") is None, "the poll to see the other process's quarantine", seconds=1.0)


async def test_a_poll_that_hangs_vouches_for_nothing_until_one_completes(
        logs: tuple[CachedLog, CachedLog, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    a, _, _ = logs
    inner = a.inner
    assert isinstance(inner, SqliteLog) and isinstance(inner.watch, PolledWatch)
    await vouched(a, "s")
    release = threading.Event()
    original = SqliteLog._changes_job

    def hung(after: int, conn: sqlite3.Connection) -> list[tuple[int, str]]:
        release.wait(10)  # a disk that hangs: the poll blocks in the OS
        return original(after, conn)

    monkeypatch.setattr(SqliteLog, "_changes_job", staticmethod(hung))
    await asyncio.sleep(2 * INTERVAL)  # the poll under way now hangs
    await until(lambda: a.fresh("s") is None, "the watch to stop vouching", seconds=1.0)
    assert inner.watch.mark() is None  # nor does a read now vouch: it goes to the log each time
    monkeypatch.setattr(SqliteLog, "_changes_job", staticmethod(original))
    release.set()
    await vouched(a, "s")


async def test_changes_pruned_before_they_were_read_void_every_mark(
        logs: tuple[CachedLog, CachedLog, Path]) -> None:
    a, b, path = logs
    watch = watch_of(a)
    await vouched(a, "s")
    generation = watch.generation
    watch.notified = lambda session_id: None  # type: ignore[method-assign]  # what names no session
    await b.append("other", None, [quarantine()])
    await b.append("other", 1, [quarantine("sha256:" + "cd" * 32)])
    with sqlite3.connect(path) as conn:  # as if they had been pruned before this log read them
        conn.execute("DELETE FROM state_changes WHERE id = (SELECT min(id) FROM state_changes)")
    await until(lambda: watch.generation > generation, "the gap", seconds=1.0)
    assert a.fresh("s") is None  # a gap voids every mark, whatever session it was


async def test_the_trigger_keeps_a_row_per_state_event_only(logs: tuple[CachedLog, CachedLog, Path]) -> None:
    _, b, path = logs
    await b.append("s", None, [record("r1"), record("r2")], durable=False)
    await b.append("s", 2, [quarantine()])
    await b.fork("s", "t")
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT session FROM state_changes ORDER BY id").fetchall()
    assert rows == [("s",), ("t",), ("t",)]  # the quarantine, its copy in the fork and the fork; no record


async def test_a_decision_made_between_two_polls_still_records_one_transition(
        logs: tuple[CachedLog, CachedLog, Path]) -> None:
    a, b, _ = logs
    await vouched(a, "race")
    watch_of(a).notified = lambda session_id: None  # type: ignore[method-assign]  # the poll has not seen it yet
    await a_stale_decision_records_one_transition(a, b, "race")  # B quarantined it first


async def test_an_idle_watch_polls_nothing_and_wakes_when_asked(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db", watch_interval=INTERVAL)
    await log.start()
    try:
        assert log.watch is not None
        log.watch.idle_after = 0.05
        cached = CachedLog(log)
        await vouched(cached, "s")
        await asyncio.sleep(0.2)  # nobody asks: the poller waits
        polls = log.ops.snapshot()["watch"]
        await asyncio.sleep(0.3)
        assert log.ops.snapshot()["watch"] == polls
        assert cached.fresh("s") is None  # its last poll is old: it vouches for nothing, and wakes
        await until(lambda: log.ops.snapshot()["watch"] > polls, "a poll after the ask", seconds=1.0)
    finally:
        await log.close()


def test_the_polled_watch_vouches_only_while_its_last_poll_is_recent() -> None:
    now = [100.0]
    watch = PolledWatch(lambda: now[0], max_age=0.1)
    assert watch.mark() is None and watch.demand.is_set()  # never polled: stale, and asked
    watch.polled(100.0, [])
    mark = watch.mark()
    assert mark is not None and watch.unchanged("s", mark)
    now[0] = 100.2
    assert not watch.unchanged("s", mark)  # the poll is too old now
    watch.polled(100.2, ["s"])
    assert not watch.unchanged("s", mark) and watch.unchanged("t", mark)
    watch.polled(100.2, [], gap=True)
    assert not watch.unchanged("t", mark)  # a gap voids every earlier mark
