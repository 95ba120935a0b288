"""SQLite session log: the embedded default ``SessionLog`` backend (proxy layer).

One append-only table keyed by ``(session, seq)``: a rowid table, so that the key's b-tree (an
index) holds keys alone and a seek never reads a row's body (in a ``WITHOUT ROWID`` table, the
layout of versions 1 to 4 until 2026-12-05, a seek past a row of records that spills onto
overflow pages reads the whole row: 0.3 ms a lookup with rows of 200 KB). Appends and forks are ``BEGIN IMMEDIATE``
transactions on a WAL database with ``synchronous=FULL``: several processes may share the file and
nothing is acknowledged before it is durable. Every sqlite3 call runs on one dedicated worker thread.
Each job sent to a lane thread (one transaction, or one read) is one round trip, counted in ``ops``.
sqlite3's and the OS's exceptions are one table (``SQLITE_ERRORS``), applied once in ``_run``.

The records of a session written in one group commit are one row (``first`` is the seq of its
first event, ``seq`` of its last, and the body is a JSON array of the events, each encoded as it
would be alone): a busy proxy pays SQLite's cost per row once for many calls. Whole calls'
records (``append_calls``, what ``metadata`` recording writes) are a row in a shorter form, what
the calls share written once (``events.encode_calls``, a third of the bytes); a reader gets the
same events from either. Every other event is a row of its own, ``first`` NULL. What a reader, a fork or the stats see is one event per seq.

Every state event (anything but a record or a checkpoint) also leaves a row in ``state_changes``,
written by a trigger in the same transaction, so every writer of the file leaves one, forks
included. The log polls that table (``watch``, a ``sessionlog.watch.PolledWatch``) every
``watch_interval`` seconds while requests ask for it: a request whose session's fold is cached
and unchanged since then needs no read of the log at all, as with PostgreSQL's notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

import msgspec

from ...policy.errors import AppendConflict, Code, Conflict, InvalidRequest, LogCorrupt, Unavailable
from ...policy.ports import StateRead
from ..faults import FAILED, OS_FAULTS, Table, describe, map_exceptions
from ..lanes import Lane
from ..observe.logger import get_logger
from ..observe.metrics import OpCounter
from .base import (
    PRUNE_ROWS,
    GroupCommit,
    Item,
    Pruned,
    SessionStats,
    decode_rows,
    decode_states,
    join_records,
    pruned_row,
    split_records,
    utc_now,
)
from .watch import PolledWatch
from ...policy.events import (
    CHECKPOINT,
    FORKED,
    PASSIVE_TYPES,
    RECORD_TYPES,
    REQUEST,
    CallRecords,
    Event,
    EventData,
    Forked,
    ForkedEvent,
    encode_calls,
    encode_event,
    encode_events,
    envelopes,
    event_types,
)

#: 5: a row may hold whole calls' records in their short form (``events.encode_calls``), which a
#: version that knows only 4 cannot read: it refuses the file rather than find it corrupt.
SCHEMA_VERSION: Final = 5
#: The page size a new file gets (a file's own stays: SQLite fixes it when the file is made). Rows
#: of records run to tens of KB; at 16 KB a page such a row spills onto a quarter as many overflow
#: pages as at SQLite's default 4 KB, and a group commit costs about a third less CPU.
PAGE_SIZE: Final = 16384

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS events (
    session TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    type    TEXT NOT NULL,
    time    TEXT NOT NULL,
    body    BLOB NOT NULL,
    first   INTEGER,
    PRIMARY KEY (session, seq)
)
"""
#: The same table, as a file of versions 1 to 4 may still lay it out (``WITHOUT ROWID``): every
#: query is the same on both, so a process of either kind reads the other's file; opening one
#: rebuilds it as a rowid table (``_rebuild``), keeping the user version.
_OLD_LAYOUT: Final = "SELECT 1 FROM sqlite_master WHERE name = 'events' AND upper(sql) LIKE '%WITHOUT ROWID%'"
_REBUILD: Final = (
    _SCHEMA.replace("IF NOT EXISTS events", "events_rowid"),
    "INSERT INTO events_rowid (session, seq, type, time, body, first)"
    " SELECT session, seq, type, time, body, first FROM events ORDER BY session, seq",
    "DROP TABLE events",  # with its index and trigger, made again by the migration
    "ALTER TABLE events_rowid RENAME TO events",
)
#: Schema version 4: a row may hold several records (``first`` to ``seq``); NULL: one event.
_FIRST_COLUMN: Final = "ALTER TABLE events ADD COLUMN first INTEGER"
_INSERT: Final = "INSERT INTO events (session, seq, type, time, body, first) VALUES (?, ?, ?, ?, ?, ?)"
#: Rows per multi-row INSERT (6 parameters each, far below SQLite's 32,766).
_ROWS_PER_INSERT: Final = 128


Row = tuple[str, int, str, str, bytes, int | None]


def _insert(conn: sqlite3.Connection, rows: list[Row]) -> None:
    """Insert ``rows`` with one statement per ``_ROWS_PER_INSERT`` rows, not one per row.

    sqlite3 lets go of the GIL around every statement it steps; a worker thread that must take
    it back from a busy event loop waits up to the interpreter's switch interval (5 ms) each
    time, so ``executemany`` of 256 records could take a second under load and the record queue
    overflowed. One statement per chunk takes the GIL back once per chunk."""
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start:start + _ROWS_PER_INSERT]
        values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk))
        conn.execute(f"INSERT INTO events (session, seq, type, time, body, first) VALUES {values}",
                     [value for row in chunk for value in row])
def _rows(session_id: str, now: str, events: list[tuple[Event, str]]) -> list[Row]:
    """One session's events of one group commit, in seq order, as rows: each run of records one
    row, every other event a row of its own (a run of one record too)."""
    if len(events) > 1 and RECORD_TYPES.issuperset([kind for _, kind in events]):  # records alone: one row
        return [(session_id, events[-1][0].seq, events[0][1], now, encode_events([event for event, _ in events]),
                 events[0][0].seq)]
    rows: list[Row] = []
    run: list[tuple[Event, str]] = []

    def flush() -> None:
        if len(run) == 1:
            rows.append((session_id, run[0][0].seq, run[0][1], now, encode_event(run[0][0]), None))
        elif run:
            rows.append((session_id, run[-1][0].seq, run[0][1], now,  # = join_records of each one's bytes
                         encode_events([event for event, _ in run]), run[0][0].seq))
        run.clear()

    for event, kind in events:
        if kind in RECORD_TYPES:
            run.append((event, kind))
            continue
        flush()
        rows.append((session_id, event.seq, kind, now, encode_event(event), None))
    flush()
    return rows


_COPY_PREFIX: Final = (
    "INSERT INTO events (session, seq, type, time, body, first)"
    " SELECT ?, seq, type, time, body, first FROM events WHERE session = ? AND seq <= ? ORDER BY seq"
)
#: The row of records that holds seq ``?2`` and goes on past it (a fork there copies part of it).
_STRADDLING: Final = ("SELECT seq, type, time, body, first FROM events"
                      " WHERE session = ?1 AND seq > ?2 AND first <= ?2 ORDER BY seq LIMIT 1")
_LAST_SEQ: Final = "SELECT coalesce(max(seq), 0) FROM events WHERE session = ?"
#: A state event (anything but a record or a checkpoint) after the expected seq: the conditional
#: append's conflict.
_STATE_AFTER: Final = ("SELECT seq FROM events WHERE session = ? AND seq > ? AND type NOT IN ("
                       + ", ".join(f"'{t}'" for t in sorted(PASSIVE_TYPES)) + ") LIMIT 1")
_READ: Final = "SELECT seq, body FROM events WHERE session = ? AND seq > ? ORDER BY seq"
#: Not a record: the predicate of the state index, written the same in every query that should
#: use it (SQLite uses a partial index only for a query that repeats its WHERE term).
_NOT_RECORD: Final = "type NOT IN (" + ", ".join(f"'{t}'" for t in sorted(RECORD_TYPES)) + ")"
#: Schema version 2: the state events of each session, so a fold reads them without the records.
_STATE_INDEX: Final = f"CREATE INDEX IF NOT EXISTS events_state ON events (session, seq) WHERE {_NOT_RECORD}"
#: The state events in (from, to]: from the latest checkpoint in that range, else all of them
#: (found scanning the state index backwards, so it stops at the latest one). Without statistics
#: the planner prefers the primary key's range, which walks every record: hence ``INDEXED BY``.
_READ_STATE: Final = (
    f"SELECT seq, body FROM events INDEXED BY events_state WHERE session = ?1 AND {_NOT_RECORD} AND seq <= ?3"
    f" AND seq >= (SELECT coalesce((SELECT seq FROM events INDEXED BY events_state WHERE session = ?1 AND {_NOT_RECORD}"
    f" AND type = '{CHECKPOINT}' AND seq > ?2 AND seq <= ?3 ORDER BY seq DESC LIMIT 1), ?2 + 1))"
    " ORDER BY seq"
)
#: Schema version 3: a row per state event, in commit order (``BEGIN IMMEDIATE`` orders the
#: writers, and an id is the table's largest plus one), kept for the latest ``KEEP_CHANGES``.
KEEP_CHANGES: Final = 100_000
_CHANGES_TABLE: Final = "CREATE TABLE IF NOT EXISTS state_changes (id INTEGER PRIMARY KEY, session TEXT NOT NULL)"
_CHANGES_TRIGGER: Final = (
    "CREATE TRIGGER IF NOT EXISTS events_state_changes AFTER INSERT ON events WHEN NEW.type NOT IN ("
    + ", ".join(f"'{t}'" for t in sorted(PASSIVE_TYPES)) + ") BEGIN"
    " INSERT INTO state_changes (session) VALUES (NEW.session);"
    f" DELETE FROM state_changes WHERE id <= last_insert_rowid() - {KEEP_CHANGES}; END"
)
#: The changes after an id, oldest first, a bounded number per read (a poll reads until it has all).
CHANGES_PER_READ: Final = 10_000
_CHANGES: Final = f"SELECT id, session FROM state_changes WHERE id > ? ORDER BY id LIMIT {CHANGES_PER_READ}"
_LAST_CHANGE: Final = "SELECT coalesce(max(id), 0) FROM state_changes"
#: How often the watch polls while asked (seconds), and how old its latest poll may be for it to
#: vouch: another process's state change reaches this one's decisions within that.
WATCH_INTERVAL: Final = 0.025
_EXISTS: Final = "SELECT 1 FROM events WHERE session = ? LIMIT 1"
_SESSIONS: Final = "SELECT DISTINCT session FROM events"
#: Every session's count, last seq and latest time in one scan of the primary key, the most
#: recently active first (a negative LIMIT is none); the same for one session by its key range.
_COUNT: Final = "sum(seq - coalesce(first, seq) + 1)"
_STATS: Final = (f"SELECT session, {_COUNT}, max(seq), max(time) FROM events GROUP BY session ORDER BY 4 DESC, 1"
                 " LIMIT ?")
_STATS_OF: Final = f"SELECT session, {_COUNT}, max(seq), max(time) FROM events WHERE session = ? GROUP BY session"
#: The next rows of records stored before a time, after a (session, seq) key, in key order (the
#: primary key's range: a prune walks the table once however many transactions it takes).
_PRUNABLE: Final = ("SELECT rowid, session, seq, body FROM events WHERE (session, seq) > (?1, ?2)"
                    " AND (?3 IS NULL OR session = ?3) AND time < ?4 AND type IN ("
                    + ", ".join(f"'{t}'" for t in sorted(RECORD_TYPES)) + f") ORDER BY session, seq LIMIT {PRUNE_ROWS}")
_PRUNE: Final = "UPDATE events SET body = ? WHERE rowid = ?"
#: Readiness: a read transaction on the file (a bare ``SELECT 1`` would never touch it).
_PING: Final = "SELECT 1 FROM events LIMIT 1"

_T = TypeVar("_T")


def _sqlite_detail(exc: BaseException) -> str:
    """sqlite3's own words ("database is locked", "disk I/O error"): never a value of a row."""
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, sqlite3.Error) else describe(exc)


#: sqlite3's and the OS's exceptions on the log's file (``proxy.faults``): every one a fault of the
#: log (``LOG_UNAVAILABLE``, retryable), never the client's, never a quarantine. That includes an
#: ``IntegrityError`` on ``(session, seq)``: ``BEGIN IMMEDIATE`` holds the only write lock, so a
#: duplicate cannot be a race; another writer broke the rules.
SQLITE_ERRORS: Final = Table("sqlite3", {sqlite3.Error: FAILED, **OS_FAULTS}, detail=_sqlite_detail)


def _log_busy(message: str) -> Exception:
    return Unavailable(f"session log busy: {message}", code=Code.LOG_UNAVAILABLE)


class SqliteLog:
    """``policy.ports.SessionLog`` on one SQLite file, safe to share between processes.

    Reads and writes run in separate lanes (``proxy.lanes``) of daemon threads, each thread with
    its own connection: WAL lets reads go on while a write waits for another process's lock or
    a slow disk, a write that hangs (a stuck ``fsync``) times out as ``LOG_UNAVAILABLE`` and never
    holds the process at exit. Each job is one complete transaction (committed or rolled back
    before it ends), so a cancelled caller never leaves one open. sqlite3 and OS faults surface as
    ``Unavailable(code="LOG_UNAVAILABLE")`` (``SQLITE_ERRORS``).
    """

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout: float = 30.0,
        clock: Callable[[], str] | None = None,
        watch_interval: float = WATCH_INTERVAL,
    ) -> None:
        self._path = Path(path)
        self._busy_timeout = busy_timeout
        self._clock: Callable[[], str] = clock if clock is not None else utc_now
        limit = 2 * busy_timeout  # the lock wait, then as long again for the write (a stuck fsync ends here)
        self._writes = Lane("log writes", 1, limit, busy_timeout, busy=_log_busy)
        self._reads = Lane("log reads", 2, limit, busy_timeout, busy=_log_busy)
        #: Jobs sent to the database (each one transaction or one read), by operation.
        self.ops = OpCounter()
        self._local = threading.local()  # each lane thread's own connection
        self._migrated = threading.Lock()
        self._closed = False
        #: Group commit of records (appends "at the end"): each batch one transaction.
        self._records = GroupCommit(self._write_records)
        #: The state changes polled (``watch_interval`` 0: none, every request reads its state).
        self.watch_interval = watch_interval
        self.watch = PolledWatch(time.monotonic, max_age=4 * watch_interval) if watch_interval > 0 else None
        self._poller: asyncio.Task[None] | None = None

    @property
    def path(self) -> Path:
        return self._path

    # -- SessionLog ------------------------------------------------------------------------------

    async def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        return await self._run(partial(self._read_job, session_id, after_seq), self._reads, op="read")

    async def read_state(self, session_id: str, after_seq: int = 0) -> StateRead:
        return await self._run(partial(self._read_state_job, session_id, after_seq), self._reads, op="read_state")

    async def append(
        self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *, durable: bool = True
    ) -> list[Event]:
        items = list(data)
        if not items:
            raise ValueError("append needs at least one event")
        if expected_seq is not None and expected_seq < 0:
            raise ValueError(f"expected_seq must be >= 0, got {expected_seq}")
        try:
            types = event_types(items)
        except KeyError as exc:
            raise TypeError(f"not event data: {exc}") from None
        if expected_seq is None and not durable:
            return await self._append_at_end(session_id, items, types)
        return await self._run(partial(self._append_job, session_id, expected_seq, items, types, durable),
                               op="append")

    async def _append_at_end(self, session_id: str, items: list[EventData], types: list[str]) -> list[Event]:
        """Records in group commits: every batch is one transaction (``GroupCommit``)."""
        if self._closed:
            raise RuntimeError("SqliteLog is closed")
        return await self._records.append(session_id, items, types)

    async def append_calls(self, session_id: str, calls: CallRecords) -> int:
        """Whole calls' records in the records' group commit, as one row of their own whose
        repeated parts are written once (``events.encode_calls``)."""
        if self._closed:
            raise RuntimeError("SqliteLog is closed")
        if not calls.calls:
            raise ValueError("append_calls needs at least one call")
        return await self._records.append_calls(session_id, calls)

    async def _write_records(self, batch: list[Item]) -> list[list[Event] | int]:
        return await self._run(partial(self._batch_job, batch), op="append_records")

    async def fork(self, parent: str, child: str, at_seq: int | None = None) -> ForkedEvent:
        return await self._run(partial(self._transaction, partial(self._fork_tx, parent, child, at_seq)), op="fork")

    # -- extras ----------------------------------------------------------------------------------

    async def sessions(self) -> list[str]:
        """All session ids that have at least one event, sorted."""
        return await self._run(self._sessions_job, self._reads, op="sessions")

    async def session_stats(self, session: str | None = None, limit: int | None = None) -> list[SessionStats]:
        """Each session's count, last seq and latest time (see ``base.Log``), on the read lane."""
        return await self._run(partial(self._stats_job, session, limit), self._reads, op="session_stats")

    async def prune(self, before: str, session: str | None = None) -> Pruned:
        """Every record stored before ``before`` pruned (``base.Log``), ``PRUNE_ROWS`` rows per
        transaction on the write lane: appends wait for one such transaction at most."""
        done, after = Pruned(), ("", 0)
        sessions: set[str] = set()
        while True:
            step, seen, after = await self._run(partial(self._transaction, partial(
                self._prune_tx, before, session, after)), op="prune")
            done += step
            sessions |= seen
            if not after[0]:
                return done._replace(sessions=len(sessions))

    def _prune_tx(self, before: str, session: str | None, after: tuple[str, int],
                  conn: sqlite3.Connection) -> tuple[Pruned, set[str], tuple[str, int]]:
        """One transaction of ``prune``: what it pruned, in which sessions, and the key to go on
        from (``("", 0)`` when it reached the end)."""
        rows = conn.execute(_PRUNABLE, (*after, session, before)).fetchall()
        done, seen = Pruned(), set()
        for rowid, session_id, seq, body in rows:
            try:
                new = pruned_row(seq, bytes(body))
            except (msgspec.DecodeError, TypeError):  # damaged: left as it is, for an operator to mend
                get_logger().warning("prune_skipped_damaged_row", session=session_id, seq=seq)
                done += Pruned(damaged=1)
                continue
            if new is None:
                continue
            conn.execute(_PRUNE, (new, rowid))
            seen.add(session_id)
            done += Pruned(len(split_records(new)), 0, len(body), len(new))
        return done, seen, (rows[-1][1], rows[-1][2]) if len(rows) == PRUNE_ROWS else ("", 0)

    async def ping(self) -> None:
        """One read on the read lane: it answers only if a read lane thread is free and the file
        can be read (not locked out, not on a hung disk)."""
        await self._run(lambda conn: conn.execute(_PING).fetchall(), self._reads, op="ping")

    async def start(self) -> None:
        """Open the file and create its schema now rather than on the first request, and each
        read lane thread's connection with the state read prepared on it (the first request's
        state read would pay for them)."""
        await self._run(lambda conn: None, op="open")
        await asyncio.gather(*(self._run(partial(self._read_state_job, "", 0), self._reads, op="open")
                               for _ in range(self._reads.size)))
        if self.watch is not None and self._poller is None:
            last = await self._run(lambda conn: int(conn.execute(_LAST_CHANGE).fetchone()[0]), self._reads, op="watch")
            self._poller = asyncio.get_running_loop().create_task(self._poll(last))

    async def _poll(self, last: int) -> None:
        """Read the state changes after ``last`` every ``watch_interval`` while the watch is asked
        for (``PolledWatch``); a poll that fails makes it vouch for nothing until one succeeds."""
        watch = self.watch
        assert watch is not None
        failing = False
        while not self._closed:
            if watch.idle:
                watch.demand.clear()
                await watch.demand.wait()
            began = watch.clock()
            try:
                last = await self._poll_once(watch, began, last)
            except Exception as exc:  # the watch vouches for nothing until a poll succeeds
                if not failing:  # logged once per failing spell, not every interval; a bug with its trace
                    if isinstance(exc, (Unavailable, TimeoutError)):
                        get_logger().warning("session_log_watch_lost", error=type(exc).__name__)
                    else:
                        get_logger().exception("session_log_watch_failed")
                failing = True
                watch.lost()
            else:
                failing = False
            await asyncio.sleep(self.watch_interval)

    async def _poll_once(self, watch: PolledWatch, began: float, last: int) -> int:
        """One poll begun at ``began``: every change after ``last``, read in bounded chunks, and
        only then the watch told it is current (a chunk alone would vouch for changes still
        unread). A table whose newest id is below ``last`` (the file restored from a copy) or
        whose next row is not ``last + 1`` (pruned) is a gap: no earlier mark stands."""
        while True:
            rows, top = await self._run(partial(self._changes_job, last), self._reads, op="watch")
            gap = top < last or bool(rows) and rows[0][0] != last + 1
            complete = len(rows) < CHANGES_PER_READ
            watch.polled(began, [session for _, session in rows], gap=gap, complete=complete)
            last = rows[-1][0] if rows else min(last, top)
            if complete:
                return last

    async def close(self) -> None:
        """Let queued jobs finish, close the connections and stop the lanes. Idempotent."""
        if self._closed:
            return
        await self._records.close()
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        for lane in (self._writes, self._reads):
            for _ in range(lane.size):  # each thread closes its own connection (a hung one is left)
                with contextlib.suppress(Exception):
                    await lane.run(self._close_connection, timeout=1.0)
            lane.close()

    # -- event-loop side -------------------------------------------------------------------------

    async def _run(self, job: Callable[[sqlite3.Connection], _T], lane: Lane | None = None, *, op: str = "other") -> _T:
        """Run ``job`` in a lane (writes unless told). Its whole wait, in the queue behind other
        jobs and for another process's write lock, is bounded by ``busy_timeout``: the k-th of k
        waiting calls never waits k times as long; a job that hangs past that and its own write
        is ``LOG_UNAVAILABLE``."""
        if self._closed:
            raise RuntimeError("SqliteLog is closed")
        deadline = time.monotonic() + self._busy_timeout
        with map_exceptions(SQLITE_ERRORS, Code.LOG_UNAVAILABLE, f"session log {op}"):
            return await (lane or self._writes).run(partial(self._call, job, deadline, op))

    # -- worker thread only ----------------------------------------------------------------------

    def _call(self, job: Callable[[sqlite3.Connection], _T], deadline: float, op: str) -> _T:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unavailable("session log busy: its write lock was held too long", code=Code.LOG_UNAVAILABLE)
        self.ops.add(op)  # the one place a job reaches the database
        conn = self._connection()
        wait_ms = max(1, int(left * 1000))
        if abs(getattr(self._local, "busy_ms", -1000) - wait_ms) > 100:  # within 0.1 s of the budget left
            conn.execute(f"PRAGMA busy_timeout = {wait_ms}")
            self._local.busy_ms = wait_ms
        return job(conn)

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            with self._migrated:  # the first connection sets up WAL and the schema, one at a time
                conn = self._local.conn = self._open()
        return conn

    def _open(self) -> sqlite3.Connection:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,  # no implicit transactions: every one is explicit below
            check_same_thread=False,  # created and used only on the worker thread
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # a new file only: before WAL, which fixes it
            self._enable_wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
            self._local.synchronous, self._local.busy_ms = "FULL", int(self._busy_timeout * 1000)
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        # Switching to WAL needs an exclusive lock; with several processes opening a fresh file
        # at once it can report busy without consulting the busy handler, so retry until timeout.
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                busy = (exc.sqlite_errorcode & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not busy or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"cannot enable WAL journal mode (got {mode!r})")

    def _migrate(self, conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION \
                and conn.execute(_OLD_LAYOUT).fetchone() is None:
            return
        self._transaction(self._migrate_tx, conn)

    @staticmethod
    def _migrate_tx(conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version in (0, 1, 2, 3, 4, 5):  # 0: a new file; 1 -> 2: the state index; 2 -> 3: the state
            conn.execute(_SCHEMA)  # changes; 3 -> 4: rows of several records; 4 -> 5: rows of whole calls;
            # any: a rowid table
            if "first" not in {row[1] for row in conn.execute("PRAGMA table_info(events)")}:
                conn.execute(_FIRST_COLUMN)
            if conn.execute(_OLD_LAYOUT).fetchone() is not None:
                for statement in _REBUILD:
                    conn.execute(statement)
            conn.execute(_STATE_INDEX)
            conn.execute(_CHANGES_TABLE)
            conn.execute(_CHANGES_TRIGGER)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version != SCHEMA_VERSION:
            raise Unavailable(
                f"session log schema version {version} is not supported (expected {SCHEMA_VERSION})",
                code=Code.LOG_UNAVAILABLE,
                retryable=False,
            )

    def _transaction(self, tx: Callable[[sqlite3.Connection], _T], conn: sqlite3.Connection,
                     durable: bool = True) -> _T:
        """Run ``tx`` in one ``BEGIN IMMEDIATE`` transaction: committed, or rolled back on any error.

        A ``durable`` commit waits for the disk (``synchronous = FULL``); any other is ordered in
        the WAL and flushed by the next durable commit or checkpoint (``NORMAL``). The setting is
        changed only when the kind of commit changes, not twice per batch of records."""
        level = "FULL" if durable else "NORMAL"
        if getattr(self._local, "synchronous", None) != level:
            conn.execute(f"PRAGMA synchronous = {level}")
            self._local.synchronous = level
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = tx(conn)
            conn.execute("COMMIT")
        except BaseException:
            self._rollback(conn)
            raise
        return result

    def _rollback(self, conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            # The connection's state is unknown: drop it; the next job opens a fresh one.
            self._close_connection()

    def _close_connection(self) -> None:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        self._local.conn = self._local.synchronous = self._local.busy_ms = None
        if conn is not None:
            conn.close()

    @staticmethod
    def _last_seq(conn: sqlite3.Connection, session_id: str) -> int:
        last: int = conn.execute(_LAST_SEQ, (session_id,)).fetchone()[0]
        return last

    @staticmethod
    def _read_job(session_id: str, after_seq: int, conn: sqlite3.Connection) -> list[Event]:
        return decode_rows(session_id, after_seq, conn.execute(_READ, (session_id, after_seq)).fetchall())

    @staticmethod
    def _read_state_job(session_id: str, after_seq: int, conn: sqlite3.Connection) -> StateRead:
        """The last seq first, then the state events up to it: rows at or below a seq one has
        seen are never added later (a session's rows are always a prefix), so the two agree
        without a read transaction."""
        last = SqliteLog._last_seq(conn, session_id)
        rows = conn.execute(_READ_STATE, (session_id, after_seq, last)).fetchall()
        return StateRead(decode_states(session_id, after_seq, rows), last)

    @staticmethod
    def _changes_job(after: int, conn: sqlite3.Connection) -> tuple[list[tuple[int, str]], int]:
        """The changes after ``after`` and the newest id, in one read transaction (one snapshot)."""
        conn.execute("BEGIN")
        try:
            rows = [(int(i), str(session)) for i, session in conn.execute(_CHANGES, (after,)).fetchall()]
            top = int(conn.execute(_LAST_CHANGE).fetchone()[0])
        finally:
            conn.execute("COMMIT")
        return rows, top

    @staticmethod
    def _sessions_job(conn: sqlite3.Connection) -> list[str]:
        return sorted(session for (session,) in conn.execute(_SESSIONS).fetchall())

    @staticmethod
    def _stats_job(session: str | None, limit: int | None, conn: sqlite3.Connection) -> list[SessionStats]:
        rows = conn.execute(_STATS, (-1 if limit is None else limit,)) if session is None else \
            conn.execute(_STATS_OF, (session,))
        return [SessionStats(*row) for row in rows.fetchall()]

    def _append_job(
        self,
        session_id: str,
        expected_seq: int | None,
        items: list[EventData],
        types: list[str],
        durable: bool,
        conn: sqlite3.Connection,
    ) -> list[Event]:
        return self._transaction(partial(self._append_tx, session_id, expected_seq, items, types), conn, durable)

    def _append_tx(
        self,
        session_id: str,
        expected_seq: int | None,
        items: list[EventData],
        types: list[str],
        conn: sqlite3.Connection,
    ) -> list[Event]:
        actual = self._last_seq(conn, session_id)
        if expected_seq is not None and (expected_seq > actual or actual != expected_seq and
                                         conn.execute(_STATE_AFTER, (session_id, expected_seq)).fetchone()):
            raise AppendConflict(session_id, expected_seq, actual)
        now = self._clock()
        events = envelopes(actual, now, items)
        _insert(conn, [(session_id, event.seq, kind, now, encode_event(event), None)
                       for event, kind in zip(events, types)])
        return events

    def _batch_job(self, batch: list[Item], conn: sqlite3.Connection) -> list[list[Event] | int]:
        return self._transaction(partial(self._batch_tx, batch), conn, durable=False)

    def _batch_tx(self, batch: list[Item], conn: sqlite3.Connection) -> list[list[Event] | int]:
        now = self._clock()
        last: dict[str, int] = {}
        written: list[list[Event] | int] = []
        groups: dict[str, list[tuple[Event, str]]] = {}  # each session's records, in seq order
        rows: list[Row] = []
        for session_id, items, types in batch:
            seq = last[session_id] if session_id in last else self._last_seq(conn, session_id)
            if types is None:  # whole calls' records (``append_calls``): a row of their own
                assert isinstance(items, CallRecords)
                if session_id in groups:  # the session's records before them: rows of seqs before these
                    rows += _rows(session_id, now, groups.pop(session_id))
                count = len(items.calls)
                rows.append((session_id, seq + count, REQUEST, now, encode_calls(seq + 1, now, items),
                             seq + 1 if count > 1 else None))
                last[session_id] = seq + count
                written.append(seq + count)
                continue
            assert isinstance(items, list)
            events = envelopes(seq, now, items)
            last[session_id] = seq + len(items)
            groups.setdefault(session_id, []).extend(zip(events, types))
            written.append(events)
        _insert(conn, rows + [row for session_id, group in groups.items() for row in _rows(session_id, now, group)])
        return written

    def _fork_tx(self, parent: str, child: str, at_seq: int | None, conn: sqlite3.Connection) -> ForkedEvent:
        if child == parent or conn.execute(_EXISTS, (child,)).fetchone() is not None:
            raise Conflict(f"session {child!r} already exists", code=Code.SESSION_EXISTS)
        last = self._last_seq(conn, parent)
        at = last if at_seq is None else at_seq
        if not 0 <= at <= last:
            raise InvalidRequest(
                f"cannot fork {parent!r} at seq {at}: its last seq is {last}", code=Code.INVALID_FORK_SEQ
            )
        conn.execute(_COPY_PREFIX, (child, parent, at))  # verbatim: same type, time and body bytes
        straddling = conn.execute(_STRADDLING, (parent, at)).fetchone()
        if straddling is not None:  # the records up to ``at`` of a row that goes on past it, each verbatim
            seq, kind, time_, body, first = straddling
            try:  # a row of whole calls is cut as the events it reads as, so it must read
                kept = split_records(bytes(body))[:at - first + 1]
            except (msgspec.DecodeError, TypeError, ValueError):
                raise LogCorrupt(parent, seq, "does not decode") from None
            _insert(conn, [(child, at, kind, time_, join_records(kept), first if len(kept) > 1 else None)])
        marker = ForkedEvent(seq=at + 1, time=self._clock(), data=Forked(parent=parent, at_seq=at))
        conn.execute(_INSERT, (child, marker.seq, FORKED, marker.time, encode_event(marker), None))
        return marker
