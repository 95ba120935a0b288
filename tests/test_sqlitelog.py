"""Tests for projectionist.proxy.sessionlog.sqlite: the embedded SQLite SessionLog backend."""

from __future__ import annotations

import asyncio
import itertools
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from projectionist.policy.errors import AppendConflict, Conflict, InvalidRequest, Unavailable
from projectionist.policy.events import (
    FORKED,
    QUARANTINE,
    Forked,
    ForkedEvent,
    Quarantine,
    QuarantineEvent,
    Recovered,
    RecoveredEvent,
    UnknownEvent,
    encode_event,
)
from projectionist.policy.fold import fold
from projectionist.policy.ports import SessionLog
from projectionist.proxy.sessionlog.sqlite import SqliteLog

REPO_ROOT = Path(__file__).resolve().parents[1]
ID_A = "sha256:" + "a" * 64
ID_B = "sha256:" + "b" * 64


def q(attachment_id: str = ID_A, name: str | None = None) -> Quarantine:
    return Quarantine(attachment_id=attachment_id, failure="not_found", retryable=False, name=name)


def rec(attachment_id: str = ID_A) -> Recovered:
    return Recovered(attachment_id=attachment_id, bytes=10, media_type="image/png", width=1, height=1)


def ticking_clock() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"2024-01-01T00:00:{next(counter):02d}.000Z"


def raw_rows(path: Path, session: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT seq, type, time, body FROM events WHERE session = ? ORDER BY seq", (session,)
        ).fetchall()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "dir" / "log.db"


@pytest.fixture
async def log(db: Path) -> AsyncIterator[SqliteLog]:
    sl = SqliteLog(db, clock=ticking_clock())
    yield sl
    await sl.close()


def test_satisfies_protocol(db: Path) -> None:
    checked: SessionLog = SqliteLog(db)  # mypy checks the structural match
    assert callable(checked.fork)


async def test_schema_created_idempotently(db: Path) -> None:
    first = SqliteLog(db)
    assert await first.read("s") == []
    await first.close()
    second = SqliteLog(db)  # a second open must not fail on the existing schema
    await second.append("s", 0, [q()])
    await second.close()
    assert db.parent.is_dir()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
    assert "WITHOUT ROWID" in sql.upper()
    assert "PRIMARY KEY (session, seq)" in sql


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


async def test_append_read_round_trip(log: SqliteLog) -> None:
    assert await log.read("s") == []
    first = await log.append("s", 0, [q(ID_A, "shot.png"), q(ID_B)])
    assert [e.seq for e in first] == [1, 2]
    assert all(isinstance(e, QuarantineEvent) for e in first)
    assert first[0].time == first[1].time  # one append, one time
    second = await log.append("s", 2, [rec(ID_A)])
    assert [e.seq for e in second] == [3]
    assert isinstance(second[0], RecoveredEvent)
    assert second[0].time != first[0].time

    everything = await log.read("s")
    assert everything == first + second
    assert [e.seq for e in everything] == [1, 2, 3]
    assert await log.read("s", after_seq=1) == everything[1:]
    assert await log.read("s", after_seq=3) == []
    assert await log.read("other") == []
    state = fold(everything)
    assert state.last_seq == 3
    assert set(state.quarantined) == {ID_B}


async def test_sessions_are_isolated_and_listed(log: SqliteLog) -> None:
    await log.append("b", 0, [q()])
    await log.append("a", 0, [q()])
    await log.append("a", 1, [rec()])
    assert [e.seq for e in await log.read("b")] == [1]
    assert [e.seq for e in await log.read("a")] == [1, 2]
    assert await log.sessions() == ["a", "b"]


async def test_default_clock_is_utc_millis_z(db: Path) -> None:
    sl = SqliteLog(db)
    [event] = await sl.append("s", 0, [q()])
    await sl.close()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event.time), event.time


async def test_conditional_append_conflict_writes_nothing(log: SqliteLog, db: Path) -> None:
    await log.append("s", 0, [q()])
    before = raw_rows(db, "s")
    for stale in (0, 2, 5):
        with pytest.raises(AppendConflict) as info:
            await log.append("s", stale, [rec(), q(ID_B)])
        assert info.value.actual == 1
        assert info.value.expected == stale
        assert info.value.session_id == "s"
    assert raw_rows(db, "s") == before


async def test_empty_or_invalid_append_rejected(log: SqliteLog) -> None:
    with pytest.raises(ValueError):
        await log.append("s", 0, [])
    with pytest.raises(ValueError):
        await log.append("s", -1, [q()])
    assert await log.read("s") == []


async def test_multi_event_append_is_atomic(log: SqliteLog, db: Path) -> None:
    await log.append("s", 0, [q()])
    # Make the third row of the next batch fail inside the transaction, after two rows went in.
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TRIGGER boom BEFORE INSERT ON events WHEN NEW.seq = 4"
            " BEGIN SELECT RAISE(ABORT, 'boom'); END"
        )
    with pytest.raises(Unavailable) as info:
        await log.append("s", 1, [rec(), q(ID_B), rec(ID_B)])
    assert info.value.code == "LOG_UNAVAILABLE"
    assert [e.seq for e in await log.read("s")] == [1]  # seqs 2 and 3 were rolled back
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER boom")
    # The connection is usable again and no transaction was left open.
    assert [e.seq for e in await log.append("s", 1, [rec(), q(ID_B), rec(ID_B)])] == [2, 3, 4]


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


async def test_two_instances_race_fifty_appends_one_wins(db: Path) -> None:
    a, b = SqliteLog(db), SqliteLog(db)
    await a.append("s", 0, [q()])
    attempts = [
        (a if i % 2 else b).append("s", 1, [q(f"sha256:{i:064x}")]) for i in range(50)
    ]
    results = await asyncio.gather(*attempts, return_exceptions=True)
    wins = [r for r in results if isinstance(r, list)]
    losses = [r for r in results if isinstance(r, AppendConflict)]
    assert len(wins) == 1
    assert len(losses) == 49
    assert all(loss.actual == 2 for loss in losses)
    assert await a.read("s") == await b.read("s")
    assert [e.seq for e in await b.read("s")] == [1, 2]
    assert (await a.read("s"))[1] == wins[0][0]
    await a.close()
    await b.close()


_RACER = """
import asyncio, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from projectionist.policy.errors import AppendConflict
from projectionist.policy.events import Quarantine
from projectionist.proxy.sessionlog.sqlite import SqliteLog

async def main() -> None:
    log = SqliteLog(Path(sys.argv[2]))
    tag = sys.argv[3]
    await log.read("s")  # open the database before the start signal
    print("ready", flush=True)
    sys.stdin.readline()
    async def attempt(i: int) -> str:
        data = Quarantine(attachment_id="sha256:" + tag * 64, failure="corrupt", retryable=False,
                          name=f"{tag}-{i}")
        try:
            await log.append("s", 0, [data])
            return "won"
        except AppendConflict as exc:
            return f"lost:{exc.actual}"
    results = await asyncio.gather(*(attempt(i) for i in range(10)))
    await log.close()
    print(" ".join(results), flush=True)

asyncio.run(main())
"""


def test_two_processes_race_one_wins(db: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(REPO_ROOT), str(db), tag],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("c", "d")
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        for proc in procs:  # start both as close together as possible
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            outputs.append(out.split())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = [r for out in outputs for r in out]
    assert len(results) == 20
    assert results.count("won") == 1
    assert results.count("lost:1") == 19
    rows = raw_rows(db, "s")
    assert [row[0] for row in rows] == [1]
    winner_tag = "c" if "won" in outputs[0] else "d"
    assert ("sha256:" + winner_tag * 64).encode() in rows[0][3]


async def test_fork_copies_prefix_verbatim_and_appends_marker(log: SqliteLog, db: Path) -> None:
    await log.append("p", 0, [q(ID_A, "a.png")])
    await log.append("p", 1, [q(ID_B)])
    await log.append("p", 2, [rec(ID_A)])
    parent_rows = raw_rows(db, "p")

    marker = await log.fork("p", "c1", at_seq=2)
    assert isinstance(marker, ForkedEvent)
    assert marker.seq == 3
    assert marker.data == Forked(parent="p", at_seq=2)
    child_rows = raw_rows(db, "c1")
    assert child_rows[:2] == parent_rows[:2]  # seq, type, time and body bytes identical
    assert child_rows[2][:2] == (3, FORKED)
    assert child_rows[2][2] == marker.time
    assert child_rows[2][2] not in {row[2] for row in parent_rows}  # marker got a fresh time
    assert bytes(child_rows[2][3]) == encode_event(marker)
    child = await log.read("c1")
    assert child[:2] == (await log.read("p"))[:2]
    assert child[2] == marker
    assert set(fold(child).quarantined) == {ID_A, ID_B}  # recovery at p:3 is not in the fork
    assert raw_rows(db, "p") == parent_rows  # parent untouched

    # Default at_seq: the parent's last seq.
    whole = await log.fork("p", "c2")
    assert whole.data == Forked(parent="p", at_seq=3)
    assert raw_rows(db, "c2")[:3] == parent_rows
    # The child is an ordinary session afterwards.
    assert [e.seq for e in await log.append("c1", 3, [rec(ID_B)])] == [4]


async def test_fork_of_empty_parent_at_zero(log: SqliteLog) -> None:
    marker = await log.fork("nobody", "child")
    assert marker.seq == 1
    assert marker.data == Forked(parent="nobody", at_seq=0)
    assert await log.read("child") == [marker]
    explicit = await log.fork("nobody", "child2", at_seq=0)
    assert explicit.seq == 1


async def test_fork_errors_write_nothing(log: SqliteLog, db: Path) -> None:
    await log.append("p", 0, [q(), rec()])
    await log.append("taken", 0, [q(ID_B)])
    taken_rows = raw_rows(db, "taken")

    with pytest.raises(Conflict) as exists:
        await log.fork("p", "taken")
    assert exists.value.code == "SESSION_EXISTS"
    assert exists.value.status == 409
    with pytest.raises(Conflict) as itself:
        await log.fork("p", "p", at_seq=1)
    assert itself.value.code == "SESSION_EXISTS"
    for bad in (3, -1):
        with pytest.raises(InvalidRequest) as invalid:
            await log.fork("p", "fresh", at_seq=bad)
        assert invalid.value.code == "INVALID_FORK_SEQ"
        assert invalid.value.status == 400
    with pytest.raises(InvalidRequest):
        await log.fork("nobody", "fresh", at_seq=1)

    assert raw_rows(db, "taken") == taken_rows
    assert raw_rows(db, "fresh") == []
    assert [e.seq for e in await log.read("p")] == [1, 2]
    assert await log.sessions() == ["p", "taken"]


async def test_unknown_event_type_reads_back_and_forks_verbatim(log: SqliteLog, db: Path) -> None:
    await log.append("s", 0, [q()])
    body = b'{"type":"future/annotation","seq":2,"time":"2030-01-01T00:00:00.000Z","data":{"x":[1,2]}}'
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO events (session, seq, type, time, body) VALUES (?, ?, ?, ?, ?)",
            ("s", 2, "future/annotation", "2030-01-01T00:00:00.000Z", body),
        )
    events = await log.read("s")
    assert isinstance(events[0], QuarantineEvent)
    unknown = events[1]
    assert isinstance(unknown, UnknownEvent)
    assert (unknown.seq, unknown.type) == (2, "future/annotation")
    assert bytes(unknown.data) == b'{"x":[1,2]}'
    assert fold(events).last_seq == 2
    # The log counts it: the next append must expect seq 2.
    with pytest.raises(AppendConflict) as info:
        await log.append("s", 1, [rec()])
    assert info.value.actual == 2
    await log.fork("s", "f")
    assert bytes(raw_rows(db, "f")[1][3]) == body


async def test_known_type_with_bad_body_is_not_masked(log: SqliteLog, db: Path) -> None:
    await log.read("s")  # create the schema
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO events (session, seq, type, time, body) VALUES (?, ?, ?, ?, ?)",
            ("s", 1, QUARANTINE, "t", b'{"type":"attachment/quarantine","seq":1,"time":"t","data":{}}'),
        )
    with pytest.raises(msgspec.ValidationError) as info:
        await log.read("s")  # a known type with a bad body is corruption, never an UnknownEvent
    assert "attachment_id" in str(info.value)


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
    assert len(set(threads)) == 1  # one dedicated worker thread
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
