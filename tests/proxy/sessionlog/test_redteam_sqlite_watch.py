"""Red-team tests of the SQLite log's polled state-change watch (``PolledWatch`` fed by ``_poll``).

The promise under attack: a cached fold is handed out (``CachedLog.fresh``) only when no state
change to its session, by any writer of the file, can have been committed more than ``max_age``
before the request; and a hung or failing poll never makes the watch vouch.

Each test is one attack. Three broke the promise when they were written (a poll read at most
10,000 changes yet claimed all of them; a file restored from a copy hid its new changes below the
poller's last id); the poll now reads its changes whole before it claims them, and a newest id
below its last is a gap. All stay as regression tests.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from projectionist.policy.events import QUARANTINE, Quarantine, encode_event, envelope
from projectionist.proxy.sessionlog.cached import CachedLog
from projectionist.proxy.sessionlog.sqlite import _SCHEMA, _STATE_INDEX, SCHEMA_VERSION, SqliteLog
from projectionist.proxy.sessionlog.watch import PolledWatch
from tests.proxy.sessionlog.watching import ID, quarantine, until, watch_of, vouched as vouched_every

INTERVAL = 0.02
MAX_AGE = 4 * INTERVAL


async def vouched(log: CachedLog, session_id: str) -> None:
    await vouched_every(log, session_id, INTERVAL)


def many(n: int, offset: int = 0) -> list[Quarantine]:
    return [quarantine(f"sha256:{offset + i:064x}") for i in range(n)]


def spy_polls(watch: PolledWatch, probe: object) -> list[object]:
    """After every poll's ``polled`` (the moment the watch's view is newest), record ``probe()``:
    what a request arriving right then would be handed."""
    seen: list[object] = []
    original = watch.polled

    def spy(began: float, sessions: list[str], *, gap: bool = False, complete: bool = True) -> None:
        original(began, sessions, gap=gap, complete=complete)
        seen.append(probe() if callable(probe) else None)

    watch.polled = spy  # type: ignore[method-assign]
    return seen


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[tuple[CachedLog, SqliteLog, Path]]:
    """A watching log and a second, non-watching writer on the same file (as a second replica)."""
    path = tmp_path / "log.db"
    a, b = SqliteLog(path, watch_interval=INTERVAL), SqliteLog(path, watch_interval=0)
    for log in (a, b):
        await log.start()
    try:
        yield CachedLog(a), b, path
    finally:
        await a.close()
        await b.close()


# -- attacks that broke the promise before the poll read its changes whole and saw a restore ------


async def test_a_backlog_longer_than_one_poll_after_an_idle_spell_keeps_the_promise(
        logs: tuple[CachedLog, SqliteLog, Path]) -> None:
    """An idle replica wakes to >10,000 state changes another replica made meanwhile. The attack:
    its first poll read only the first 10,000 (``_CHANGES``' LIMIT) yet sets ``polled_at`` as if it had read
    everything committed before it began, and the pre-idle marks are still of the same generation.
    A session whose change is in the unread rest is handed out stale though changed long ago."""
    a, b, _ = logs
    watch = watch_of(a)
    watch.idle_after = 0.05
    await vouched(a, "y")  # y's empty fold, vouched
    await asyncio.sleep(0.3)  # nobody asks: the poller sleeps on ``demand``
    await b.append("other", None, many(10_000))  # another replica's busy minute
    await b.append("y", None, [quarantine()])  # ... and y's quarantine, after them in id order
    committed = time.monotonic()
    await asyncio.sleep(0.3)  # y's change is now far older than max_age
    seen = spy_polls(watch, lambda: (time.monotonic() - committed, a.fresh("y")))
    await a.read_state("z", 0)  # a request (any session) wakes the poller: its mark asks
    await until(lambda: len(seen) >= 3, "three polls")
    stale = [(round(age, 3), state) for age, state in seen if state is not None]  # type: ignore[misc]
    assert not stale, f"y's fold without its quarantine handed out {stale[0][0]} s after the commit (max_age {MAX_AGE})"


async def test_a_fork_that_copies_many_state_events_keeps_the_promise(tmp_path: Path) -> None:
    """Another writer forks a session with 90,000 state events (90,001 change rows, one
    transaction), then quarantines y. The watching log keeps asking; each poll reads 10,000 rows
    and claims freshness as of its start, so y's row is read only ~10 polls later: meanwhile y's
    stale fold is handed out to requests arriving more than max_age after y's commit."""
    path = tmp_path / "log.db"
    writer = SqliteLog(path, watch_interval=0)
    await writer.start()
    await writer.append("parent", None, many(90_000))  # a long session: 90,000 state events (its fork stays under KEEP_CHANGES: no gap)
    log = SqliteLog(path, watch_interval=INTERVAL)
    await log.start()  # its poller starts after the parent's rows
    a = CachedLog(log)
    try:
        await vouched(a, "y")
        committed: list[float] = []
        seen = spy_polls(log.watch,  # type: ignore[arg-type]
                         lambda: (time.monotonic() - committed[0] if committed else 0.0, a.fresh("y")))
        await writer.fork("parent", "child")
        await writer.append("y", None, [quarantine()])
        committed.append(time.monotonic())
        mark = a._vouched["y"]
        await until(lambda: (a.fresh("y"), log.watch._last.get("y", 0))[1] > mark.notices,  # type: ignore[union-attr]
                    "the poll to reach y's row", seconds=5.0)
        late = [round(age, 3) for age, state in seen if state is not None and age > MAX_AGE]  # type: ignore[misc]
        assert not late, f"y's stale fold handed out {late[-1]} s after its commit (max_age {MAX_AGE})"
    finally:
        await log.close()
        await writer.close()


async def test_a_restored_file_with_fewer_changes_keeps_the_promise(
        logs: tuple[CachedLog, SqliteLog, Path], tmp_path: Path) -> None:
    """The file is restored from a backup (SQLite's backup API, under the running processes) taken
    before some changes the watch already read: its ``state_changes`` ends below the poller's
    ``last``. New changes get ids <= ``last``; ``WHERE id > last`` never returns them and, with no
    rows, no gap is seen: the watch vouches for y forever while y is quarantined."""
    a, b, path = logs
    watch = watch_of(a)
    await vouched(a, "y")
    snapshot = sqlite3.connect(tmp_path / "backup.db")
    with sqlite3.connect(path) as live:
        live.backup(snapshot)
    notices = watch.notices
    await b.append("other", None, many(5))  # after the backup: read by the watch
    await until(lambda: watch.notices >= notices + 5, "the poll to read them")
    await vouched(a, "y")
    live = sqlite3.connect(path)
    try:
        snapshot.backup(live)  # the restore
    finally:
        live.close()
        snapshot.close()
    await b.append("y", None, [quarantine()])  # a state change after the restore: id <= the poller's last
    assert [e.data for e in (await b.read_state("y")).events] == [quarantine()]
    await asyncio.sleep(MAX_AGE)  # the promise: within max_age of the commit
    for _ in range(30):  # 0.3 s of requests
        await asyncio.sleep(0.01)
        assert a.fresh("y") is None, \
            "y's fold without its quarantine is handed out after a restore (the poll reads id > last only)"


# -- attacks that hold (regression tests) ----------------------------------------------------------


@pytest.mark.parametrize("how", ["unexpected exception", "cancelled"])
async def test_a_poller_that_fails_or_dies_stops_vouching(
        logs: tuple[CachedLog, SqliteLog, Path], monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A poll failing with an exception the log's table does not name (a bug) makes the watch
    unhealthy and the poller goes on; a cancelled poller ends, ``healthy`` stays True but
    ``polled_at`` freezes, so ``current()`` fails after max_age. Either way: nothing vouched."""
    a, b, _ = logs
    inner = a.inner
    assert isinstance(inner, SqliteLog) and inner._poller is not None
    watch = watch_of(a)
    await vouched(a, "y")
    original = SqliteLog._changes_job
    if how == "cancelled":
        inner._poller.cancel()
        await until(lambda: inner._poller is not None and inner._poller.done(), "the poller to end", seconds=2.0)
    else:
        def broken(after: int, conn: sqlite3.Connection) -> list[tuple[int, str]]:
            raise ValueError("not a sqlite3 or OS error: passes through map_exceptions")
        monkeypatch.setattr(SqliteLog, "_changes_job", staticmethod(broken))
        await until(lambda: (a.fresh("y"), watch.healthy)[1] is False, "the failed poll", seconds=2.0)
        assert not inner._poller.done()
    await b.append("y", None, [quarantine()])  # no poll will read this
    await until(lambda: a.fresh("y") is None, "the watch to stop vouching", seconds=1.0)
    for _ in range(20):
        await a.read_state("y", 0)  # reads take no mark that vouches
        assert a.fresh("y") is None and watch.mark() is None
        await asyncio.sleep(0.01)
    if how != "cancelled":  # the fault gone, the poller vouches again, with the change read
        monkeypatch.setattr(SqliteLog, "_changes_job", staticmethod(original))
        await vouched(a, "y")
        state = a.fresh("y")
        assert state is not None and ID in state.quarantined


async def test_a_stopped_process_does_not_vouch_for_a_change_made_while_it_was_stopped(
        logs: tuple[CachedLog, SqliteLog, Path]) -> None:
    """The event loop is blocked (a stopped process, a long GC, a CPU-bound callback) while
    another writer commits: ``current()`` reads the monotonic clock at the ask, so the first
    request after the stall is not handed the cached fold, even before any poll runs again."""
    a, b, _ = logs
    await vouched(a, "y")
    await b.append("y", None, [quarantine()])
    time.sleep(2 * MAX_AGE)  # blocks the loop: no poll can complete
    assert a.fresh("y") is None


async def test_a_version_2_connection_opened_before_the_migration_leaves_change_rows(tmp_path: Path) -> None:
    """An older process holds a connection to a version-2 file (no trigger) with its INSERT
    prepared; a version-3 process migrates the file. The old connection's next state event fires
    the trigger (SQLite re-prepares on the schema change), so the watch sees it."""
    path = tmp_path / "log.db"
    old = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    old.execute("PRAGMA journal_mode = WAL")
    old.execute(_SCHEMA)
    old.execute(_STATE_INDEX)
    old.execute("PRAGMA user_version = 2")
    insert = "INSERT INTO events (session, seq, type, time, body) VALUES (?, ?, ?, ?, ?)"

    def old_write(session: str, seq: int) -> None:
        event = envelope(seq, "2026-01-01T00:00:00Z", quarantine())
        old.execute(insert, (session, seq, QUARANTINE, event.time, encode_event(event)))

    old_write("before", 1)  # written before the migration: the statement is in the old connection's cache
    log = SqliteLog(path, watch_interval=INTERVAL)
    await log.start()
    a = CachedLog(log)
    try:
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        await vouched(a, "y")
        old_write("y", 1)
        await until(lambda: a.fresh("y") is None, "the poll to see the old process's quarantine", seconds=1.0)
        await vouched(a, "y")
        state = a.fresh("y")
        assert state is not None and ID in state.quarantined
    finally:
        await log.close()
        old.close()


async def test_a_rolled_back_state_event_neither_hides_nor_fakes_a_change(
        logs: tuple[CachedLog, SqliteLog, Path]) -> None:
    """A writer inserts a state event and rolls back: its change row (and id) go with it; the next
    commit reuses the id, so the poll sees no gap (no spurious renewal) and misses nothing."""
    a, b, path = logs
    watch = watch_of(a)
    await vouched(a, "y")
    await vouched(a, "ghost")
    generation = watch.generation
    other = sqlite3.connect(path, isolation_level=None)
    try:
        event = envelope(1, "2026-01-01T00:00:00Z", quarantine())
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO events (session, seq, type, time, body) VALUES (?, 1, ?, ?, ?)",
                      ("ghost", QUARANTINE, event.time, encode_event(event)))
        await asyncio.sleep(3 * INTERVAL)  # polls meanwhile see nothing uncommitted
        assert a.fresh("ghost") is not None
        other.execute("ROLLBACK")
    finally:
        other.close()
    await b.append("y", None, [quarantine()])
    await until(lambda: a.fresh("y") is None, "the poll to see y's quarantine", seconds=1.0)
    assert watch.generation == generation  # no gap: the rolled-back id was reused
    assert a.fresh("ghost") is not None  # nothing of ghost's was committed


async def test_concurrent_writer_processes_commit_in_id_order(
        logs: tuple[CachedLog, SqliteLog, Path]) -> None:
    """Two other processes append state events at once: every change row the watch reads is one
    it counts (no id committed below one already read, which the poll would skip silently)."""
    a, _, path = logs
    watch = watch_of(a)
    await vouched(a, "y")
    generation, notices = watch.generation, watch.notices
    script = (
        "import asyncio, sys\n"
        "from projectionist.proxy.sessionlog.sqlite import SqliteLog\n"
        "from projectionist.policy.events import Quarantine\n"
        "async def main():\n"
        "    log = SqliteLog(sys.argv[1], watch_interval=0)\n"
        "    q = Quarantine(attachment_id='sha256:' + 'ab' * 32, failure='not_found', retryable=False)\n"
        "    await asyncio.gather(*(log.append(f'{sys.argv[2]}-{i}', None, [q]) for i in range(150)))\n"
        "    await log.close()\n"
        "asyncio.run(main())\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), name]) for name in ("p", "q")]
    try:
        while any(p.poll() is None for p in procs):
            a.fresh("y")  # keep asking: the poller reads while they write
            await asyncio.sleep(0.01)
    finally:
        for p in procs:
            p.wait(60)
    assert all(p.returncode == 0 for p in procs)
    await until(lambda: (a.fresh("y"), watch.notices)[1] >= notices + 300, "every change counted")
    assert watch.notices == notices + 300 and watch.generation == generation
    with sqlite3.connect(path) as conn:
        ids = [i for (i,) in conn.execute("SELECT id FROM state_changes ORDER BY id")]
    assert ids == list(range(ids[0], ids[0] + len(ids)))


async def test_close_while_a_poll_hangs_leaves_nothing_vouched(
        logs: tuple[CachedLog, SqliteLog, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    a, _, _ = logs
    inner = a.inner
    assert isinstance(inner, SqliteLog)
    await vouched(a, "y")
    release = threading.Event()
    original = SqliteLog._changes_job

    def hung(after: int, conn: sqlite3.Connection) -> list[tuple[int, str]]:
        release.wait(10)
        return original(after, conn)

    monkeypatch.setattr(SqliteLog, "_changes_job", staticmethod(hung))
    await asyncio.sleep(2 * INTERVAL)  # a poll is in flight, hung
    try:
        started = time.monotonic()
        await asyncio.wait_for(inner.close(), 10)
        assert time.monotonic() - started < 5
        assert inner._poller is not None and inner._poller.done()
        await asyncio.sleep(MAX_AGE + 0.02)
        assert a.fresh("y") is None and watch_of(a).mark() is None
    finally:
        release.set()


def test_a_session_the_watch_forgot_is_not_vouched_for() -> None:
    """Its bounded memory evicts the least recently notified session; the evicted count becomes
    the floor (``_forgotten``) for every session it no longer remembers."""
    now = [0.0]
    watch = PolledWatch(lambda: now[0], max_age=1.0, capacity=2)
    watch.polled(0.0, [])
    mark = watch.mark()
    assert mark is not None
    watch.polled(0.0, ["y", "a", "b"])  # y's notice evicted
    assert "y" not in watch._last
    assert not watch.unchanged("y", mark) and not watch.unchanged("never-seen", mark)
    later = watch.mark()
    assert watch.unchanged("y", later)
