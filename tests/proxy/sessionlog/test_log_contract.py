"""The SessionLog contract, written once and run on every backend: the embedded SQLite log (on a temp
file) and the PostgreSQL log (on a schema of the test's own, dropped afterwards).

Appends are conditional and atomic, reads come in seq order from any seq, sessions are isolated,
a fork copies a prefix verbatim and appends its marker, unknown event types survive reading and
forking, a known type with a bad body is never masked, and two instances or two processes racing
for one seq make exactly one winner.

Each backend comes with a few helpers that reach its storage behind the log's back (``raw_rows``,
``insert_raw``, ``fail_inserts_at``) and says how to open it in another process. What only one
backend has (SQLite's pragmas, locking and worker thread; PostgreSQL's schema, pool and outages
through ``FaultyTcpProxy``) stays in ``test_sqlitelog.py`` and ``test_pglog.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest

from projectionist.policy.errors import LogCorrupt, AppendConflict, Conflict, InvalidRequest, Unavailable
from projectionist.policy.events import (
    ResponseRecorded,
    FORKED,
    QUARANTINE,
    Forked,
    ForkedEvent,
    Quarantine,
    QuarantineEvent,
    Recovered,
    RequestEvent,
    RecoveredEvent,
    UnknownEvent,
    encode_event,
)
from projectionist.policy.fold import fold
from projectionist.policy.ports import SessionLog
from projectionist.proxy.sessionlog.base import split_records
from projectionist.proxy.sessionlog.postgres import PostgresLog
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from tests.backends import pg_dsn
from tests.conftest import drop_schema
from tests.paths import ROOT
from tests.records import whole_calls

ID_A = "sha256:" + "a" * 64
ID_B = "sha256:" + "b" * 64
ID_C = "sha256:" + "c" * 64
Row = tuple[int, str, str, bytes]  # seq, type, time, body bytes, as stored


def q(attachment_id: str = ID_A, name: str | None = None) -> Quarantine:
    return Quarantine(attachment_id=attachment_id, failure="not_found", retryable=False, name=name)


def record() -> ResponseRecorded:
    """A response record: evidence, not state."""
    return ResponseRecorded(request_id="r1", request_seq=1, status=200, latency_ms=1.0)


def rec(attachment_id: str = ID_A) -> Recovered:
    return Recovered(attachment_id=attachment_id, bytes=10, media_type="image/png", width=1, height=1)


def ticking_clock() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"2024-01-01T00:00:{next(counter):02d}.000Z"


# -- the backends ----------------------------------------------------------------------------------


class LogBackend:
    """One SessionLog backend: a factory of log instances on one database (all closed at teardown),
    and access to that database behind the logs' backs."""

    #: Constructor options for an instance that many concurrent calls share (a replica's).
    pool: dict[str, Any] = {}
    #: Python source defining ``open_log(*args)`` in a racing subprocess (see ``_RACER``).
    racer_open: str = ""

    def __init__(self) -> None:
        self.made: list[SqliteLog | PostgresLog] = []

    def make(self, **kwargs: Any) -> SqliteLog | PostgresLog:
        log = self._open(**kwargs)
        self.made.append(log)
        return log

    def _open(self, **kwargs: Any) -> SqliteLog | PostgresLog:
        raise NotImplementedError

    def racer_args(self) -> list[str]:
        """The arguments of ``open_log`` in a racing subprocess: the same database."""
        raise NotImplementedError

    async def raw_rows(self, session: str) -> list[Row]:
        raise NotImplementedError

    async def insert_raw(self, session: str, seq: int, type_: str, time: str, body: bytes) -> None:
        raise NotImplementedError

    async def fail_inserts_at(self, seq: int) -> None:
        """Make the database refuse to insert a row with this seq, inside the inserting transaction."""
        raise NotImplementedError

    async def allow_inserts(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        for log in self.made:
            await log.close()


class SqliteBackend(LogBackend):
    racer_open = (
        "from projectionist.proxy.sessionlog.sqlite import SqliteLog\n\n"
        "def open_log(path: str) -> SqliteLog:\n"
        "    return SqliteLog(Path(path))\n"
    )

    def __init__(self, db: Path) -> None:
        super().__init__()
        self.db = db

    def _open(self, **kwargs: Any) -> SqliteLog:
        return SqliteLog(self.db, **kwargs)

    def racer_args(self) -> list[str]:
        return [str(self.db)]

    def _execute(self, sql: str, *args: Any) -> list[Any]:
        with contextlib.closing(sqlite3.connect(self.db)) as conn, conn:
            return conn.execute(sql, args).fetchall()

    async def raw_rows(self, session: str) -> list[Row]:
        rows = self._execute("SELECT seq, type, time, body FROM events WHERE session = ? ORDER BY seq", session)
        # a row of several records (``first`` to ``seq``) is each record's own row here
        return [(seq - len(parts) + at, msgspec.json.decode(part)["type"] if len(parts) > 1 else kind, time, part)
                for seq, kind, time, body in rows for parts in [split_records(bytes(body))]
                for at, part in enumerate(parts, 1)]

    async def insert_raw(self, session: str, seq: int, type_: str, time: str, body: bytes) -> None:
        self._execute("INSERT INTO events (session, seq, type, time, body) VALUES (?, ?, ?, ?, ?)",
                      session, seq, type_, time, body)

    async def fail_inserts_at(self, seq: int) -> None:
        self._execute(f"CREATE TRIGGER boom BEFORE INSERT ON events WHEN NEW.seq = {seq:d}"
                      " BEGIN SELECT RAISE(ABORT, 'boom'); END")

    async def allow_inserts(self) -> None:
        self._execute("DROP TRIGGER boom")


class PostgresBackend(LogBackend):
    pool = {"min_size": 10, "max_size": 10}
    racer_open = (
        "from projectionist.proxy.sessionlog.postgres import PostgresLog\n\n"
        "def open_log(dsn: str, schema: str) -> PostgresLog:\n"
        "    return PostgresLog(dsn, schema=schema, min_size=10, max_size=10)\n"
    )

    def __init__(self, dsn: str, schema: str) -> None:
        super().__init__()
        self.dsn, self.schema = dsn, schema
        self.table = f'"{schema}".projectionist_events'

    def _open(self, **kwargs: Any) -> PostgresLog:
        kwargs.setdefault("schema", self.schema)
        return PostgresLog(self.dsn, **kwargs)

    def racer_args(self) -> list[str]:
        return [self.dsn, self.schema]

    async def _execute(self, query: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.dsn)
        try:
            rows: list[asyncpg.Record] = await conn.fetch(query, *args)
            return rows
        finally:
            await conn.close()

    async def raw_rows(self, session: str) -> list[Row]:
        rows = await self._execute(f"SELECT seq, type, time, body FROM {self.table} WHERE session = $1 ORDER BY seq",
                                   session)
        return [(seq, kind, time, bytes(body)) for seq, kind, time, body in rows]

    async def insert_raw(self, session: str, seq: int, type_: str, time: str, body: bytes) -> None:
        await self._execute(f"INSERT INTO {self.table} (session, seq, type, time, body) VALUES ($1, $2, $3, $4, $5)",
                            session, seq, type_, time, body)

    async def fail_inserts_at(self, seq: int) -> None:
        await self._execute(
            f'CREATE FUNCTION "{self.schema}".boom() RETURNS trigger LANGUAGE plpgsql AS $$'
            f" BEGIN IF NEW.seq = {seq:d} THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$"
        )
        await self._execute(f'CREATE TRIGGER boom BEFORE INSERT ON {self.table}'
                            f' FOR EACH ROW EXECUTE FUNCTION "{self.schema}".boom()')

    async def allow_inserts(self) -> None:
        await self._execute(f"DROP TRIGGER boom ON {self.table}")


@contextlib.asynccontextmanager
async def sqlite_backend(tmp_path: Path) -> AsyncIterator[LogBackend]:
    yield SqliteBackend(tmp_path / "nested" / "dir" / "log.db")


@contextlib.asynccontextmanager
async def postgres_backend(tmp_path: Path) -> AsyncIterator[LogBackend]:
    schema = f"t_{uuid.uuid4().hex}"
    try:
        yield PostgresBackend(pg_dsn(), schema)
    finally:
        await drop_schema(schema)


BACKENDS = {"sqlite": sqlite_backend, "postgres": postgres_backend}


@pytest.fixture(params=list(BACKENDS))
async def log_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LogBackend]:
    async with BACKENDS[request.param](tmp_path) as backend:
        try:
            yield backend
        finally:
            await backend.close()  # every log instance, before its database goes


@pytest.fixture
def log(log_backend: LogBackend) -> SqliteLog | PostgresLog:
    return log_backend.make(clock=ticking_clock())


# -- protocol and basics ---------------------------------------------------------------------------


async def test_satisfies_protocol(log_backend: LogBackend) -> None:
    checked: SessionLog = log_backend.make()  # mypy checks the structural match of every backend
    assert callable(checked.read) and callable(checked.append) and callable(checked.fork)
    assert await checked.read("s") == []


async def test_append_read_round_trip(log: SessionLog) -> None:
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
    assert await log.read("s", after_seq=2) == everything[2:]
    assert await log.read("s", after_seq=3) == []
    assert await log.read("s", after_seq=99) == []
    assert await log.read("other") == []
    state = fold(everything)
    assert state.last_seq == 3
    assert set(state.quarantined) == {ID_B}
    # Folding what is read after a cached state's last seq gives the same state.
    partial = fold(await log.read("s", after_seq=0))
    fourth = await log.append("s", 3, [q(ID_C, "late.png")])
    incremental = fold(await log.read("s", after_seq=partial.last_seq), partial)
    assert incremental == fold(await log.read("s"))
    assert incremental.last_seq == 4
    assert incremental.quarantined[ID_C] == fourth[0].data


async def test_sessions_are_isolated_and_listed(log: SqliteLog | PostgresLog) -> None:
    await log.append("b", 0, [q()])
    await log.append("a", 0, [q()])
    await log.append("a", 1, [rec()])
    assert [e.seq for e in await log.read("b")] == [1]
    assert [e.seq for e in await log.read("a")] == [1, 2]
    assert await log.sessions() == ["a", "b"]


async def test_session_stats_count_every_session_in_one_query(log: SqliteLog | PostgresLog,
                                                              log_backend: LogBackend) -> None:
    assert await log.session_stats() == [] and await log.session_stats("nobody") == []
    await log.append("old", 0, [q(), rec()])                      # times :00 (both), one append
    await log.append("busy", 0, [q(ID_B)])                        # :01
    await log.append("busy", None, [record(), record()], durable=False)  # records count too: :02
    await log.append("tied", 0, [q(ID_C)])                        # :03
    await log.append("also-tied", 0, [q(ID_C)])                   # :04
    await log.fork("old", "forked", at_seq=1)                     # prefix copied as it was, marker :05
    before = log.ops.total
    stats = await log.session_stats()
    await asyncio.sleep(0.05)  # PostgreSQL's query logger counts a statement soon after it returns
    assert log.ops.total - before == 1  # one round trip, whatever the number of sessions
    # the most recently active first; the stored time of each session's latest event, verbatim
    assert [tuple(s) for s in stats] == [
        ("forked", 2, 2, "2024-01-01T00:00:05.000Z"),
        ("also-tied", 1, 1, "2024-01-01T00:00:04.000Z"),
        ("tied", 1, 1, "2024-01-01T00:00:03.000Z"),
        ("busy", 3, 3, "2024-01-01T00:00:02.000Z"),
        ("old", 2, 2, "2024-01-01T00:00:00.000Z"),
    ]
    for s in stats:
        rows = await log_backend.raw_rows(s.session)
        assert (s.events, s.last_seq, s.last_time) == (len(rows), rows[-1][0], max(r[2] for r in rows))
    assert [s.session for s in await log.session_stats(limit=2)] == ["forked", "also-tied"]
    assert await log.session_stats("busy") == [stats[3]]
    assert await log.session_stats("nobody") == []


async def test_ping_answers_on_a_fresh_and_a_used_log(log: SqliteLog | PostgresLog) -> None:
    await log.ping()
    await log.append("s", 0, [q()])
    await log.ping()


async def test_default_clock_is_utc_millis_z(log_backend: LogBackend) -> None:
    [event] = await log_backend.make().append("s", 0, [q()])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event.time), event.time


# -- conditional, atomic append --------------------------------------------------------------------


async def test_conditional_append_conflict_writes_nothing(log: SessionLog, log_backend: LogBackend) -> None:
    await log.append("s", 0, [q()])
    before = await log_backend.raw_rows("s")
    for stale in (0, 2, 5):
        with pytest.raises(AppendConflict) as info:
            await log.append("s", stale, [rec(), q(ID_B)])
        assert info.value.actual == 1
        assert info.value.expected == stale
        assert info.value.session_id == "s"
    assert await log_backend.raw_rows("s") == before
    # A fresh session's last seq is 0.
    with pytest.raises(AppendConflict) as fresh:
        await log.append("new", 3, [q()])
    assert fresh.value.actual == 0
    assert await log_backend.raw_rows("new") == []


async def test_records_never_make_a_conditional_append_conflict(log: SessionLog) -> None:
    """Evidence decides nothing: a decision made at seq 1 still holds after records came in; a
    state event after it (a quarantine, a recovery, a fork marker) is a conflict."""
    await log.append("s", 0, [q()])
    await log.append("s", None, [record(), record()])  # records appended by other requests
    landed = await log.append("s", 1, [q(ID_B)])
    assert [e.seq for e in landed] == [4]  # after the records, never over them
    with pytest.raises(AppendConflict) as info:
        await log.append("s", 1, [q("sha256:" + "c" * 64)])  # seq 4 is a state event after 1
    assert info.value.actual == 4
    assert [e.seq for e in await log.read("s")] == [1, 2, 3, 4]


async def test_whole_calls_read_back_as_the_records_they_stand_for(log: SessionLog) -> None:
    """``append_calls`` (what ``metadata`` recording appends): the calls' records after the
    session's last event, one seq each and the append's one time, read back as the events an
    ``append`` of ``calls.records()`` gives, also from inside them; a state read leaves them out
    but counts them, and they never make a conditional append conflict."""
    await log.append("s", 0, [q()])
    calls = whole_calls(5)
    assert await log.append_calls("s", calls) == 6
    events = await log.read("s")
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert all(isinstance(e, RequestEvent) for e in events[1:]) and len({e.time for e in events[1:]}) == 1
    assert [e.data for e in events[1:]] == calls.records()
    assert await log.read("s", 3) == events[3:]
    state = await log.read_state("s")
    assert (state.events, state.last_seq) == (events[:1], 6)
    assert [e.seq for e in await log.append("s", 1, [q(ID_B)])] == [7]
    alone = await log.append("t", None, calls.records(), durable=False)
    assert [encode_event(e.data) for e in await log.read("t")] == [encode_event(e.data) for e in events[1:]] \
        == [encode_event(e.data) for e in alone]


async def test_multi_event_append_is_atomic(log: SessionLog, log_backend: LogBackend) -> None:
    await log.append("s", 0, [q()])
    # Make the third row of the next batch fail inside the transaction, after two rows went in.
    await log_backend.fail_inserts_at(4)
    with pytest.raises(Unavailable) as info:
        await log.append("s", 1, [rec(), q(ID_B), rec(ID_B)])
    assert not isinstance(info.value, AppendConflict)
    assert info.value.code == "LOG_UNAVAILABLE"
    assert [e.seq for e in await log.read("s")] == [1]  # seqs 2 and 3 were rolled back
    await log_backend.allow_inserts()
    # The log is usable again: no transaction was left open, nothing was left half-written.
    again = await log.append("s", 1, [rec(), q(ID_B), rec(ID_B)])
    assert [e.seq for e in again] == [2, 3, 4]
    assert len({e.time for e in again}) == 1  # one append, one time
    rows = await log_backend.raw_rows("s")
    assert [row[0] for row in rows] == [1, 2, 3, 4]
    assert {row[2] for row in rows[1:]} == {again[0].time}


# -- races -----------------------------------------------------------------------------------------


async def test_two_instances_race_fifty_appends_one_wins(log_backend: LogBackend) -> None:
    a, b = log_backend.make(**log_backend.pool), log_backend.make(**log_backend.pool)  # like two replicas
    await a.append("s", 0, [q()])
    await b.read("s")  # both open before the race
    attempts = [(a if i % 2 else b).append("s", 1, [q(f"sha256:{i:064x}")]) for i in range(50)]
    results = await asyncio.gather(*attempts, return_exceptions=True)
    wins = [r for r in results if isinstance(r, list)]
    losses = [r for r in results if isinstance(r, AppendConflict)]
    assert len(wins) == 1, results
    assert len(losses) == 49, [r for r in results if not isinstance(r, (list, AppendConflict))]
    assert all(loss.actual == 2 and loss.expected == 1 for loss in losses)
    assert await a.read("s") == await b.read("s")
    assert [e.seq for e in await b.read("s")] == [1, 2]
    assert (await a.read("s"))[1] == wins[0][0]
    assert [row[0] for row in await log_backend.raw_rows("s")] == [1, 2]


# The racing process: argv is the repo root, its tag, its number of attempts, then open_log's args.
_RACER = """
import asyncio, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from projectionist.policy.errors import AppendConflict
from projectionist.policy.events import Quarantine
OPEN_LOG

async def main() -> None:
    tag, attempts = sys.argv[2], int(sys.argv[3])
    log = open_log(*sys.argv[4:])
    await log.read("s")  # open the log (and migrate) before the start signal
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
    results = await asyncio.gather(*(attempt(i) for i in range(attempts)))
    await log.close()
    print(" ".join(results), flush=True)

asyncio.run(main())
"""
ATTEMPTS = 15  # per process


async def test_two_processes_race_one_wins(log_backend: LogBackend) -> None:
    here = log_backend.make(**log_backend.pool)
    await here.read("s")
    racer = _RACER.replace("OPEN_LOG", log_backend.racer_open)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", racer, str(ROOT), "d", str(ATTEMPTS), *log_backend.racer_args(),
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if line.strip() != b"ready":
            raise AssertionError((line, await proc.stderr.read()))

        async def attempt(i: int) -> str:
            data = Quarantine(attachment_id="sha256:" + "c" * 64, failure="corrupt", retryable=False, name=f"c-{i}")
            try:
                await here.append("s", 0, [data])
                return "won"
            except AppendConflict as exc:
                return f"lost:{exc.actual}"

        proc.stdin.write(b"go\n")  # start both as close together as possible
        await proc.stdin.drain()
        mine = await asyncio.gather(*(attempt(i) for i in range(ATTEMPTS)))
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    theirs = out.decode().split()
    results = mine + theirs
    assert len(results) == 2 * ATTEMPTS, results
    assert results.count("won") == 1, results
    assert results.count("lost:1") == 2 * ATTEMPTS - 1, results
    rows = await log_backend.raw_rows("s")
    assert [row[0] for row in rows] == [1]
    winner_tag = "c" if "won" in mine else "d"
    assert ("sha256:" + winner_tag * 64).encode() in rows[0][3]
    assert [e.seq for e in await here.read("s")] == [1]


# -- fork ------------------------------------------------------------------------------------------


async def test_fork_copies_prefix_verbatim_and_appends_marker(
    log: SqliteLog | PostgresLog, log_backend: LogBackend
) -> None:
    await log.append("p", 0, [q(ID_A, "a.png")])
    await log.append("p", 1, [q(ID_B)])
    await log.append("p", 2, [rec(ID_A)])
    parent_rows = await log_backend.raw_rows("p")
    assert len({row[2] for row in parent_rows}) == 3  # distinct times, so a re-stamp would show

    marker = await log.fork("p", "c1", at_seq=2)
    assert isinstance(marker, ForkedEvent)
    assert marker.seq == 3
    assert marker.data == Forked(parent="p", at_seq=2)
    child_rows = await log_backend.raw_rows("c1")
    assert len(child_rows) == 3
    assert child_rows[:2] == parent_rows[:2]  # seq, type, time and body bytes identical
    assert child_rows[2][:2] == (3, FORKED)
    assert child_rows[2][2] == marker.time
    assert child_rows[2][2] not in {row[2] for row in parent_rows}  # marker got a fresh time
    assert child_rows[2][3] == encode_event(marker)
    child = await log.read("c1")
    assert child[:2] == (await log.read("p"))[:2]
    assert child[2] == marker
    assert set(fold(child).quarantined) == {ID_A, ID_B}  # recovery at p:3 is not in the fork
    assert await log_backend.raw_rows("p") == parent_rows  # parent untouched

    # Default at_seq: the parent's last seq.
    whole = await log.fork("p", "c2")
    assert whole.data == Forked(parent="p", at_seq=3)
    assert whole.seq == 4
    assert (await log_backend.raw_rows("c2"))[:3] == parent_rows
    # at_seq=0: only the marker.
    bare = await log.fork("p", "c3", at_seq=0)
    assert bare.seq == 1
    assert await log.read("c3") == [bare]
    # The child is an ordinary session afterwards.
    assert [e.seq for e in await log.append("c1", 3, [rec(ID_B)])] == [4]
    with pytest.raises(AppendConflict) as info:
        await log.append("c1", 3, [rec(ID_B)])
    assert info.value.actual == 4
    assert await log.sessions() == ["c1", "c2", "c3", "p"]


async def test_fork_of_empty_parent_at_zero(log: SessionLog) -> None:
    marker = await log.fork("nobody", "child")
    assert marker.seq == 1
    assert marker.data == Forked(parent="nobody", at_seq=0)
    assert await log.read("child") == [marker]
    explicit = await log.fork("nobody", "child2", at_seq=0)
    assert explicit.seq == 1
    assert await log.read("nobody") == []


async def test_fork_errors_write_nothing(log: SqliteLog | PostgresLog, log_backend: LogBackend) -> None:
    await log.append("p", 0, [q(), rec()])
    await log.append("taken", 0, [q(ID_B)])
    parent_rows = await log_backend.raw_rows("p")
    taken_rows = await log_backend.raw_rows("taken")

    with pytest.raises(Conflict) as exists:
        await log.fork("p", "taken")
    assert exists.value.code == "SESSION_EXISTS"
    assert exists.value.status == 409
    with pytest.raises(Conflict) as itself:
        await log.fork("p", "p", at_seq=1)
    assert itself.value.code == "SESSION_EXISTS"
    with pytest.raises(Conflict):
        await log.fork("p", "p")
    for bad in (3, 99, -1):
        with pytest.raises(InvalidRequest) as invalid:
            await log.fork("p", "fresh", at_seq=bad)
        assert invalid.value.code == "INVALID_FORK_SEQ"
        assert invalid.value.status == 400
    with pytest.raises(InvalidRequest):
        await log.fork("nobody", "fresh", at_seq=1)

    assert await log_backend.raw_rows("taken") == taken_rows
    assert await log_backend.raw_rows("p") == parent_rows
    assert await log_backend.raw_rows("fresh") == []
    assert await log_backend.raw_rows("nobody") == []
    assert [e.seq for e in await log.read("p")] == [1, 2]
    assert await log.sessions() == ["p", "taken"]
    # Nothing was left locked or half-done: the same child can be forked now.
    assert (await log.fork("p", "fresh", at_seq=2)).seq == 3


# -- evolution -------------------------------------------------------------------------------------


async def test_unknown_event_type_reads_back_and_forks_verbatim(log: SessionLog, log_backend: LogBackend) -> None:
    await log.append("s", 0, [q()])
    body = b'{"type":"future/annotation","seq":2,"time":"2030-01-01T00:00:00.000Z","data":{"x":[1,2]}}'
    await log_backend.insert_raw("s", 2, "future/annotation", "2030-01-01T00:00:00.000Z", body)
    events = await log.read("s")
    assert isinstance(events[0], QuarantineEvent)
    unknown = events[1]
    assert isinstance(unknown, UnknownEvent)
    assert (unknown.seq, unknown.type, unknown.time) == (2, "future/annotation", "2030-01-01T00:00:00.000Z")
    assert bytes(unknown.data) == b'{"x":[1,2]}'
    assert await log.read("s", after_seq=1) == [unknown]
    assert fold(events).last_seq == 2
    assert set(fold(events).quarantined) == {ID_A}
    # The log counts it: the next append must expect seq 2.
    with pytest.raises(AppendConflict) as info:
        await log.append("s", 1, [rec()])
    assert info.value.actual == 2
    assert [e.seq for e in await log.append("s", 2, [rec()])] == [3]
    await log.fork("s", "f")
    forked = await log_backend.raw_rows("f")
    assert forked[1][1:] == ("future/annotation", "2030-01-01T00:00:00.000Z", body)


async def test_known_type_with_bad_body_is_not_masked(log: SessionLog, log_backend: LogBackend) -> None:
    await log.read("s")  # create the schema
    await log_backend.insert_raw("s", 1, QUARANTINE, "t", b'{"type":"attachment/quarantine","seq":1,"time":"t","data":{}}')
    with pytest.raises(LogCorrupt) as info:
        await log.read("s")  # a known type with a bad body is corruption, never an UnknownEvent
    assert (info.value.code, info.value.status, info.value.session_id, info.value.seq) == ("LOG_CORRUPT", 503, "s", 1)
    assert isinstance(info.value.__context__, msgspec.ValidationError) and "attachment_id" in str(info.value.__context__)


async def test_a_gap_in_the_seqs_is_corruption_named_by_session_and_seq(log: SessionLog, log_backend: LogBackend) -> None:
    await log.append("s", 0, [q(), q(ID_B)])
    await log_backend.insert_raw("s", 4, QUARANTINE, "t", b'{"type":"attachment/quarantine","seq":4,"time":"t",'
                                 b'"data":{"attachment_id":"' + ID_A.encode() + b'","failure":"corrupt","retryable":false}}')
    with pytest.raises(LogCorrupt) as info:
        await log.read("s")
    assert (info.value.session_id, info.value.seq) == ("s", 3) and "missing" in info.value.message
    await log.append("t", 0, [q()])
    assert [e.seq for e in await log.read("t")] == [1]  # other sessions are untouched
