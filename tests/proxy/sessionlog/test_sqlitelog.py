"""Tests for projectionist.proxy.sessionlog.sqlite: the embedded SQLite SessionLog backend (its schema,
pragmas, durability and locking). What every log must do is in the contract suite,
``test_log_contract.py``, which runs on this backend too."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projectionist.policy.errors import AppendConflict, LogCorrupt, Unavailable
from projectionist.policy.events import (
    Quarantine,
    Recovered,
    ResponseRecorded,
    encode_event,
    encode_events,
    envelope,
)
from projectionist.proxy.sessionlog.base import join_records, split_records
from projectionist.proxy.sessionlog.sqlite import PAGE_SIZE, SCHEMA_VERSION, SqliteLog
from tests.records import whole_calls

ID_A = "sha256:" + "a" * 64
ID_B = "sha256:" + "b" * 64


def q(attachment_id: str = ID_A, name: str | None = None) -> Quarantine:
    return Quarantine(attachment_id=attachment_id, failure="not_found", retryable=False, name=name)


def rec(attachment_id: str = ID_A) -> Recovered:
    return Recovered(attachment_id=attachment_id, bytes=10, media_type="image/png", width=1, height=1)


def ticking_clock() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"2024-01-01T00:00:{next(counter):02d}.000Z"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "dir" / "log.db"


@pytest.fixture
async def log(db: Path) -> AsyncIterator[SqliteLog]:
    sl = SqliteLog(db, clock=ticking_clock())
    yield sl
    await sl.close()


async def test_schema_created_idempotently(db: Path) -> None:
    first = SqliteLog(db)
    assert await first.read("s") == []
    await first.close()
    second = SqliteLog(db)  # a second open must not fail on the existing schema
    await second.append("s", 0, [q()])
    await second.close()
    assert db.parent.is_dir()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
        index = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events_state'").fetchone()[0]
    assert "WITHOUT ROWID" not in sql.upper()  # a rowid table: its key's b-tree holds no bodies
    assert "PRIMARY KEY (session, seq)" in sql
    assert "(session, seq) WHERE type NOT IN" in index


async def test_a_new_file_gets_large_pages_and_an_older_file_keeps_its_own(db: Path, tmp_path: Path) -> None:
    """Rows of records spill onto fewer overflow pages at ``PAGE_SIZE``; a file made before keeps
    SQLite's default and its rows (the page size is fixed when the file is made)."""
    new = SqliteLog(db)
    await new.append("s", 0, [q()])
    await new.close()
    older = tmp_path / "older.db"
    with sqlite3.connect(older) as conn:
        conn.execute("CREATE TABLE t (x)")  # a file made by SQLite's defaults
    kept = SqliteLog(older)
    await kept.append("s", 0, [q()])
    assert [event.seq for event in await kept.read("s")] == [1]
    await kept.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE != 4096
    with sqlite3.connect(older) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096


async def test_a_version_1_file_gets_the_state_index_and_keeps_its_rows(db: Path) -> None:
    """Version 2 adds the partial index of state events (``read_state``); the rows stay."""
    first = SqliteLog(db)
    written = await first.append("s", 0, [q(), q(ID_B)])
    await first.close()
    with sqlite3.connect(db) as conn:
        conn.execute("DROP INDEX events_state")
        conn.execute("PRAGMA user_version = 1")
    second = SqliteLog(db)
    assert await second.read("s") == written
    assert (await second.read_state("s")).events == written
    await second.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events_state'").fetchone() == (1,)
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events_state_changes'").fetchone() == (1,)


async def test_newer_schema_version_is_refused(db: Path) -> None:
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version = 7")
    sl = SqliteLog(db)
    with pytest.raises(Unavailable) as info:
        await sl.read("s")
    assert info.value.code == "LOG_UNAVAILABLE"
    assert "7" in info.value.message
    await sl.close()


async def test_empty_or_invalid_append_rejected(log: SqliteLog) -> None:
    with pytest.raises(ValueError):
        await log.append("s", 0, [])
    with pytest.raises(ValueError):
        await log.append("s", -1, [q()])
    assert await log.read("s") == []


async def test_durable_across_close_and_reopen(db: Path) -> None:
    first = SqliteLog(db)
    written = await first.append("s", 0, [q(), rec()])
    await first.close()
    with pytest.raises(RuntimeError):
        await first.read("s")
    await first.close()  # idempotent

    second = SqliteLog(db)
    assert await second.read("s") == written
    assert [e.seq for e in await second.append("s", 2, [q(ID_B)])] == [3]
    await second.close()


def _instrument(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[str], list[str], list[tuple[int, str | None]]]:
    """Wrap sqlite3.connect so every statement records its text and thread, and every
    authorization request its action and table."""
    statements: list[str] = []
    threads: list[str] = []
    actions: list[tuple[int, str | None]] = []
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = real_connect(*args, **kwargs)

        def trace(sql: str) -> None:
            statements.append(sql)
            threads.append(threading.current_thread().name)

        conn.set_trace_callback(trace)

        def authorizer(action: int, arg1: str | None, *_: Any) -> int:
            actions.append((action, arg1))
            return sqlite3.SQLITE_OK

        conn.set_authorizer(authorizer)
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    return statements, threads, actions


async def test_sqlite_runs_off_the_event_loop_and_never_updates(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements, threads, actions = _instrument(monkeypatch)
    sl = SqliteLog(db)
    await sl.append("s", 0, [q()])
    with pytest.raises(AppendConflict):
        await sl.append("s", 0, [q()])
    await sl.read("s")
    await sl.fork("s", "t")
    await sl.sessions()
    await sl.close()
    assert "PRAGMA synchronous = FULL" in statements  # durable before acknowledging
    assert "PRAGMA journal_mode = WAL" in statements
    assert statements.count("BEGIN IMMEDIATE") >= 3  # append, conflicting append, fork
    main = threading.main_thread().name
    assert threads, "the trace callback saw no statements"
    assert main not in threads
    assert {name.rsplit("-", 1)[0] for name in threads} <= {"lane-log writes", "lane-log reads"}
    assert len({name for name in threads if "writes" in name}) == 1  # every write on one thread
    inserts = [a for a in actions if a == (sqlite3.SQLITE_INSERT, "events")]
    assert inserts  # the authorizer sees writes (at prepare time; cached statements only once)
    rewrites = [a for a in actions if a[0] in (sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE)]
    assert all(table != "events" for _, table in rewrites), rewrites  # append-only


async def test_event_loop_keeps_running_while_append_waits_for_lock(db: Path) -> None:
    sl = SqliteLog(db)
    await sl.read("s")  # schema exists
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # hold the write lock
    try:
        task = asyncio.create_task(sl.append("s", 0, [q()]))
        ticks = 0
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            ticks += 1
        assert not task.done()  # waiting on the busy timeout, in the worker thread
        assert ticks >= 10  # the loop kept turning meanwhile
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    assert [e.seq for e in await task] == [1]
    await sl.close()


async def test_busy_timeout_surfaces_as_unavailable(db: Path) -> None:
    sl = SqliteLog(db, busy_timeout=0.1)
    await sl.read("s")
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(Unavailable) as info:
            await sl.append("s", 0, [q()])
        assert info.value.code == "LOG_UNAVAILABLE"
        assert info.value.retryable
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    assert [e.seq for e in await sl.append("s", 0, [q()])] == [1]
    await sl.close()


async def test_calls_waiting_for_a_held_lock_share_one_bound_not_one_each(db: Path) -> None:
    """Another process holds the write lock: eight queued appends all give up within about one
    busy_timeout, not one after another (the last one would have waited eight times as long)."""
    sl = SqliteLog(db, busy_timeout=0.3)
    await sl.read("s")
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.gather(*(sl.append(f"s{i}", 0, [q()]) for i in range(8)), return_exceptions=True)
        waited = loop.time() - started
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    assert all(isinstance(r, Unavailable) and r.code == "LOG_UNAVAILABLE" and r.retryable for r in results)
    assert waited < 4 * 0.3, f"waited {waited:.2f} s: the calls queued up one busy_timeout each"
    assert [e.seq for e in await sl.append("s", 0, [q()])] == [1]
    await sl.close()


async def test_cancelled_append_leaves_no_open_transaction(db: Path) -> None:
    sl = SqliteLog(db)
    await sl.read("s")
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        task = asyncio.create_task(sl.append("s", 0, [q(), rec()]))
        await asyncio.sleep(0.2)  # the job is now inside BEGIN IMMEDIATE, waiting for the lock
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    # The cancelled caller left; its job finishes on the write lane. A job cancelled inside its
    # transaction gives its place back at once (in_use 0) and counts as stuck until it returns:
    # only then is its outcome in the log (on a loaded machine, a while after the COMMIT above).
    for _ in range(3000):
        if sl._writes.in_use == 0 and sl._writes.stuck == 0:
            break
        await asyncio.sleep(0.01)
    assert (sl._writes.in_use, sl._writes.stuck) == (0, 0), "the cancelled append's job never returned"
    # The job ran to completion as one transaction: all of it or none of it, never a part.
    seqs = [e.seq for e in await sl.read("s")]
    assert seqs in ([], [1, 2])
    # And the write lock was released: another connection can write straight away.
    other = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
    nxt = await sl.append("s", len(seqs), [q(ID_B)])
    assert nxt[0].seq == len(seqs) + 1
    await sl.close()


async def test_a_row_edited_by_hand_into_text_or_a_number_is_log_corrupt(db: Path) -> None:
    from projectionist.policy.errors import LogCorrupt

    sl = SqliteLog(db)
    await sl.append("s", 0, [q()])
    editor = sqlite3.connect(db, isolation_level=None)
    editor.execute("INSERT INTO events (session, seq, type, time, body) VALUES ('s', 2, 'attachment/quarantine', 't', 3.5)")
    editor.execute("INSERT INTO events (session, seq, type, time, body) VALUES ('t', 1, 'attachment/quarantine', 't', "
                   "'{\"type\": \"x\"}')")
    editor.close()
    for session, seq in (("s", 2), ("t", 1)):
        with pytest.raises(LogCorrupt) as info:
            await sl.read(session)
        assert (info.value.session_id, info.value.seq, info.value.status) == (session, seq, 503)
    await sl.close()


async def test_a_write_that_hangs_on_the_disk_costs_writes_only_and_times_out(
        db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write stuck in the OS (a hung fsync): it ends as LOG_UNAVAILABLE after its timeout,
    later writes are refused promptly while it hangs, and reads go on in their own lane."""
    sl = SqliteLog(db, busy_timeout=0.3)
    await sl.append("s", 0, [q()])
    hung, release = threading.Event(), threading.Event()
    real = SqliteLog._append_tx

    def stuck(self: SqliteLog, *args: object) -> object:
        hung.set()
        release.wait(30)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(SqliteLog, "_append_tx", stuck)
    try:
        with pytest.raises(Unavailable) as timed_out:
            await sl.append("s", 1, [q(ID_B)])
        assert timed_out.value.code == "LOG_UNAVAILABLE" and hung.is_set()
        with pytest.raises(Unavailable) as refused:  # the write lane holds the hung write
            await sl.append("t", 0, [q()])
        assert refused.value.code == "LOG_UNAVAILABLE"
        assert [e.seq for e in await sl.read("s")] == [1]  # reads go on
        assert sl._writes.stuck == 1
    finally:
        release.set()
    await sl.close()


async def test_a_batch_of_records_is_a_few_statements_not_one_per_row(tmp_path: Path) -> None:
    """Every statement sqlite3 steps lets go of the GIL, and the log's thread then waits for a
    busy event loop to hand it back (up to 5 ms): with one INSERT per row a batch of 256 records
    took long enough under load that the record queue overflowed and records were dropped."""
    log = SqliteLog(tmp_path / "log.sqlite3")
    await log.start()
    statements: list[str] = []
    original = log._connection

    class Counted:  # the statements the log steps (a trace callback also sees each trigger run)
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            statements.append(sql)
            return self.conn.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.conn, name)

    log._connection = lambda: Counted(original())  # type: ignore[method-assign, assignment, return-value]
    records = [ResponseRecorded(request_id=f"r{i}", request_seq=0, status=200, latency_ms=1.0) for i in range(300)]
    events = await log.append("s", None, records, durable=False)
    inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
    assert [e.seq for e in events] == list(range(1, 301))
    assert len(inserts) <= 3  # 300 rows in chunks of 128
    assert [e.seq for e in await log.read("s", 0)] == list(range(1, 301))
    await log.close()


def call_record(n: int) -> ResponseRecorded:
    return ResponseRecorded(request_id=f"r{n}", request_seq=0, status=200, latency_ms=float(n))


def rows_of(db: Path, session: str) -> list[tuple[int, int | None, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT seq, first, type FROM events WHERE session = ? ORDER BY seq", (session,)).fetchall()


async def test_the_records_of_a_group_commit_are_one_row_and_read_as_one_event_each(db: Path) -> None:
    """Records appended together (the recorder's batches) cost SQLite one row, not one per call;
    a state event among them stays a row of its own (a state read and the watch need it); what
    a reader sees is one event per seq, also when it reads from inside the row."""
    log = SqliteLog(db, clock=ticking_clock())
    try:
        written = await asyncio.gather(
            log.append("s", None, [call_record(1), call_record(2)], durable=False),
            log.append("s", None, [call_record(3), q(), call_record(4)], durable=False),
            log.append("t", None, [call_record(5)], durable=False))
        assert rows_of(db, "s") == [(3, 1, "response/recorded"), (4, None, "attachment/quarantine"),
                                    (5, None, "response/recorded")]
        assert rows_of(db, "t") == [(1, None, "response/recorded")]
        events = await log.read("s")
        assert [e.seq for e in events] == [1, 2, 3, 4, 5]
        assert events == written[0] + written[1]
        assert await log.read("s", 2) == events[2:]  # begins inside the row of three
        assert await log.read("s", 3) == events[3:]
        assert [e.seq for e in (await log.read_state("s")).events] == [4]
        assert [(s.session, s.events, s.last_seq) for s in await log.session_stats()] == [("s", 5, 5), ("t", 1, 1)]
    finally:
        await log.close()


async def test_whole_calls_are_a_row_of_their_own_between_the_records_of_one_group_commit(db: Path) -> None:
    """``append_calls`` in the same group commit as other records of the session: its calls are
    one row of their own (in their short form), the records before and after rows of theirs,
    no two rows over one seq; a reader sees one event per seq, from inside a row too."""
    log = SqliteLog(db, clock=ticking_clock())
    calls = whole_calls(3)
    try:
        before, last, after = await asyncio.gather(
            log.append("s", None, [call_record(1), call_record(2)], durable=False),
            log.append_calls("s", calls),
            log.append("s", None, [call_record(3)], durable=False))
        assert last == 5
        assert rows_of(db, "s") == [(2, 1, "response/recorded"), (5, 3, "request/recorded"),
                                    (6, None, "response/recorded")]
        events = await log.read("s")
        assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
        assert events[:2] == before and events[5:] == after and [e.data for e in events[2:5]] == calls.records()
        assert await log.read("s", 3) == events[3:]
        assert [(s.session, s.events, s.last_seq) for s in await log.session_stats()] == [("s", 6, 6)]
    finally:
        await log.close()


async def test_whole_calls_take_under_half_the_bytes_of_their_records_stored_as_events(db: Path) -> None:
    log = SqliteLog(db, clock=ticking_clock())
    calls = whole_calls(50)
    try:
        await log.append_calls("short", calls)
        await log.append("events", None, calls.records(), durable=False)
        assert [e.data for e in await log.read("short")] == [e.data for e in await log.read("events")]
    finally:
        await log.close()
    with sqlite3.connect(db) as conn:
        size = dict(conn.execute("SELECT session, sum(length(body)) FROM events GROUP BY session").fetchall())
    assert size["short"] * 2 < size["events"]


@pytest.mark.parametrize("at", [1, 2, 3])
async def test_a_fork_inside_a_row_of_whole_calls_copies_their_records(db: Path, at: int) -> None:
    log = SqliteLog(db, clock=ticking_clock())
    try:
        await log.append_calls("p", whole_calls(4))
        parent = await log.read("p")
        await log.fork("p", "c", at)
        child = await log.read("c")
        assert child[:at] == parent[:at] and child[at].seq == at + 1 and len(child) == at + 1
        assert await log.read("p") == parent
    finally:
        await log.close()


async def test_a_row_of_whole_calls_that_names_a_shared_part_it_lacks_is_corruption(db: Path) -> None:
    log = SqliteLog(db, clock=ticking_clock())
    try:
        await log.append_calls("s", whole_calls(2))
        with sqlite3.connect(db) as conn:
            (body,) = conn.execute("SELECT body FROM events WHERE session = 's'").fetchone()
            conn.execute("UPDATE events SET body = ? WHERE session = 's'",
                         (bytes(body).replace(b"]]],[[0,", b"]]],[[7,", 1),))
        with pytest.raises(LogCorrupt) as info:
            await log.read("s")
        assert (info.value.session_id, info.value.seq) == ("s", 2)
    finally:
        await log.close()


@pytest.mark.parametrize("at", [1, 2, 3])
async def test_a_fork_inside_a_row_of_records_copies_each_record_verbatim(db: Path, at: int) -> None:
    log = SqliteLog(db, clock=ticking_clock())
    try:
        parent = await log.append("p", None, [call_record(n) for n in range(1, 5)], durable=False)
        await log.fork("p", "c", at)
        child = await log.read("c")
        assert child[:at] == parent[:at] and child[at].seq == at + 1 and len(child) == at + 1
        assert await log.read("p") == parent  # the parent's row untouched
        with sqlite3.connect(db) as conn:
            (body,) = conn.execute("SELECT body FROM events WHERE session = 'p'").fetchone()
            copied = [bytes(b) for (b,) in conn.execute(
                "SELECT body FROM events WHERE session = 'c' AND type != 'session/forked' ORDER BY seq")]
        assert b"".join(copied).strip(b"[]") in bytes(body)  # the events' own bytes, cut from the row
    finally:
        await log.close()


def old_layout(*, first: bool) -> str:
    """The events table as versions up to 4 made it (``WITHOUT ROWID``; ``first`` from version 4)."""
    return ("CREATE TABLE events (session TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, time TEXT NOT NULL,"
            f" body BLOB NOT NULL,{' first INTEGER,' if first else ''} PRIMARY KEY (session, seq)) WITHOUT ROWID")


async def test_a_version_3_file_gets_rows_of_records_and_keeps_its_rows(db: Path) -> None:
    """Version 4 adds ``first`` (rows of several records); a version-3 file's rows read as before."""
    old = sqlite3.connect(db.parent.mkdir(parents=True) or db)
    old.execute(old_layout(first=False))
    old.execute("PRAGMA user_version = 3")
    old.close()
    log = SqliteLog(db, clock=ticking_clock())
    try:
        one = await log.append("s", 0, [q()])
        more = await log.append("s", None, [call_record(1), call_record(2)], durable=False)
        assert await log.read("s") == one + more
        assert rows_of(db, "s") == [(1, None, "attachment/quarantine"), (3, 2, "response/recorded")]
    finally:
        await log.close()


async def test_a_version_4_file_without_rowid_is_rebuilt_as_a_rowid_table_and_reads_the_same(db: Path) -> None:
    """Up to 2026-12-05 the table was ``WITHOUT ROWID``: a seek there reads every row of records it
    passes in full (0.3 ms with rows of 200 KB). Opening such a file rebuilds it as a rowid table
    in place, its rows (a row of several records too) read back the same, and its version is 5
    (rows of whole calls, ``append_calls``, are new in 5: the rebuild has nothing to change for them)."""
    old = sqlite3.connect(db.parent.mkdir(parents=True) or db)
    old.execute(old_layout(first=True))
    old.execute("PRAGMA user_version = 4")
    old.close()
    log = SqliteLog(db, clock=ticking_clock())
    try:
        written = await log.append("s", 0, [q()])
        written += await log.append("s", None, [call_record(1), call_record(2)], durable=False)
    finally:
        await log.close()
    with sqlite3.connect(db) as conn:  # as an older process left it, rows of several records included
        conn.execute("CREATE TABLE keep AS SELECT * FROM events")
        conn.execute("DROP TABLE events")
        conn.execute(old_layout(first=True))
        conn.execute("INSERT INTO events SELECT * FROM keep")
        conn.execute("DROP TABLE keep")
    assert rows_of(db, "s") == [(1, None, "attachment/quarantine"), (3, 2, "response/recorded")]
    log = SqliteLog(db, clock=ticking_clock())
    try:
        assert await log.read("s") == written
        assert (await log.read_state("s")).events == written[:1]
        assert [e.seq for e in await log.append("s", None, [call_record(3)], durable=False)] == [4]
    finally:
        await log.close()
    with sqlite3.connect(db) as conn:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
        assert "WITHOUT ROWID" not in sql.upper()
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events_state'").fetchone() == (1,)
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events_state_changes'").fetchone() == (1,)
        # the last seq of a session comes from the key's index alone: no row's body is read
        plan = " ".join(str(row[-1]) for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT coalesce(max(seq), 0) FROM events WHERE session = 's'"))
        assert "COVERING INDEX" in plan, plan
    assert rows_of(db, "s") == [(1, None, "attachment/quarantine"), (3, 2, "response/recorded"),
                                (4, None, "response/recorded")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=20), st.integers(0, 2**40), st.none() | st.integers(100, 599),
                          st.floats(0, 1e6, allow_nan=False), st.none() | st.dictionaries(st.text(max_size=8),
                                                                                        st.integers(0, 10**6), max_size=3)),
                min_size=1, max_size=12))
def test_a_row_of_records_is_each_records_own_bytes_whatever_they_hold(calls: list[tuple[str, int, int | None, float,
                                                                                          dict[str, int] | None]]) -> None:
    """A row's body is encoded in one call (``encode_events``); it must be exactly the records
    each encoded alone and joined (``join_records``): a fork cuts a row there, a reader splits it."""
    events = [envelope(seq, "2026-12-05T00:00:00.000Z", ResponseRecorded(rid, seq, status, latency, usage))
              for rid, seq, status, latency, usage in calls]
    each = [encode_event(event) for event in events]
    assert encode_events(events) == join_records(each)
    assert split_records(encode_events(events)) == each


async def test_a_fork_inside_a_damaged_row_of_whole_calls_is_corruption_and_makes_no_child(db: Path) -> None:
    """A fork cuts a row of whole calls as the events it reads as: one that does not read is the
    parent's corruption (named by session and the row's seq), never an error of another kind, and
    the child is not made."""
    log = SqliteLog(db, clock=ticking_clock())
    try:
        await log.append_calls("p", whole_calls(3))
        with sqlite3.connect(db) as conn:
            (body,) = conn.execute("SELECT body FROM events WHERE session = 'p'").fetchone()
            conn.execute("UPDATE events SET body = ? WHERE session = 'p'", (bytes(body).replace(b",200,", b',"200",', 1),))
        with pytest.raises(LogCorrupt) as info:
            await log.fork("p", "c", 2)
        assert (info.value.session_id, info.value.seq) == ("p", 3)
        assert await log.read("c") == []
    finally:
        await log.close()
