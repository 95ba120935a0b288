"""PostgreSQL session log for many replicas (proxy layer).

One table keyed by ``(session, seq)``, so the database itself enforces the conditional append:
two replicas can never both write seq N. An append is one autocommitted statement, durable when
it returns. The schema is created or migrated idempotently under an advisory lock, with its
version recorded. Connection faults surface as ``Unavailable(LOG_UNAVAILABLE)`` (a retryable
503; ``PG_ERRORS``, applied once in ``_run``), never as anything the policy could mistake for a
quarantine; the pool reconnects by itself
once the database is back. Every statement a pooled connection sends is one round trip, counted
in ``ops`` by the connection's query logger.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar, cast

import asyncpg
import msgspec

from ...policy.errors import AppendConflict, Code, Conflict, InvalidRequest, Unavailable
from ...policy.events import (
    CHECKPOINT,
    FORKED,
    PASSIVE_TYPES,
    RECORD_TYPES,
    CallRecords,
    Event,
    EventData,
    Forked,
    ForkedEvent,
    encode_event,
    envelope,
    envelopes,
    event_types,
)
from ...policy.ports import StateRead
from ..faults import FAILED, LOST, OS_FAULTS, Table, map_exceptions
from ..observe.logger import get_logger
from ..observe.metrics import OpCounter
from .base import (
    PRUNE_ROWS,
    GroupCommit,
    Item,
    Pruned,
    SessionStats,
    append_calls_as_events,
    decode_rows,
    decode_states,
    pruned_row,
    utc_now,
)
from .watch import StateWatch

SCHEMA_VERSION: Final = 3
#: Event data as the body's ``data`` member (the server wraps it in the envelope).
_DATA: Final = msgspec.json.Encoder()
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_T = TypeVar("_T")

#: asyncpg's and the OS's exceptions (``proxy.faults``). Database faults: unreachable, shut down,
#: read-only after a failover, out of space, timed out. None is the client's doing and none is a
#: quarantine: all are a retryable 503 LOG_UNAVAILABLE. A unique violation is no fault: it is a
#: write losing a race (``LOST``), which ``append`` and ``fork`` read themselves.
PG_ERRORS: Final = Table("asyncpg", {
    asyncpg.UniqueViolationError: LOST,
    asyncpg.PostgresError: FAILED,
    asyncpg.InterfaceError: FAILED,
    **OS_FAULTS,
})


def _sql_list(types: frozenset[str]) -> str:
    return ", ".join(f"'{t}'" for t in sorted(types))


#: Not a record: the predicate of the state index (schema version 3), repeated in the queries
#: that should use it.
_NOT_RECORD: Final = f"type NOT IN ({_sql_list(RECORD_TYPES)})"


class PostgresLog:
    """``policy.ports.SessionLog`` on PostgreSQL via an asyncpg pool, shared by many replicas."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 10.0,
        clock: Callable[[], str] | None = None,
    ) -> None:
        if _SCHEMA_NAME.fullmatch(schema) is None:
            raise InvalidRequest(f"invalid PostgreSQL schema name {schema!r}", code=Code.INVALID_CONFIG)
        self._dsn = dsn
        self._schema = schema
        self._min_size, self._max_size, self._timeout = min_size, max_size, timeout
        self._clock = clock or utc_now
        self._pool: asyncpg.Pool | None = None
        self._closed = False
        self._opening = asyncio.Lock()
        #: Group commit of records (appends "at the end"): each batch one statement.
        self._records = GroupCommit(self._write_records)
        #: Statements sent to the database, by operation (the query logger of every connection).
        self.ops = OpCounter()
        #: State-change notices (LISTEN on ``channel``): which cached folds need no state read.
        self.watch = StateWatch()
        self.channel = f"projectionist_state:{schema}"
        self.ping_every = 5.0
        self._listener: asyncio.Task[None] | None = None
        table = f'"{schema}".projectionist_events'
        self._sql = {
            "read": f"SELECT seq, body FROM {table} WHERE session = $1 AND seq > $2 ORDER BY seq",
            "last": f"SELECT coalesce(max(seq), 0) FROM {table} WHERE session = $1",
            "append": f'SELECT "{schema}".projectionist_append($1, $2, $3, $4, $5, $6)',
            "append_records": f'SELECT "{schema}".projectionist_append_records($1, $2, $3, $4)',
            "exists": f"SELECT 1 FROM {table} WHERE session = $1 LIMIT 1",
            "copy": f"INSERT INTO {table} (session, seq, type, time, body)"
                    f" SELECT $1, seq, type, time, body FROM {table} WHERE session = $2 AND seq <= $3",
            "insert": f"INSERT INTO {table} (session, seq, type, time, body) VALUES ($1, $2, $3, $4, $5)",
            "sessions": f"SELECT DISTINCT session FROM {table} ORDER BY session",
            # every session's count, last seq and latest time, the most recently active first
            # (LIMIT NULL is none); the same for one session by its key range
            "stats": f"SELECT session, count(*), max(seq), max(time) FROM {table} GROUP BY session"
                     ' ORDER BY max(time) COLLATE "C" DESC, session COLLATE "C" LIMIT $1',
            "stats_of": f"SELECT session, count(*), max(seq), max(time) FROM {table} WHERE session = $1"
                        " GROUP BY session",
            # the next records stored before a time after a (session, seq) key, in key order (the
            # primary key's range: a prune walks the table once), and their rewrite
            "prunable": f"SELECT session, seq, body FROM {table} WHERE (session, seq) > ($1, $2)"
                        f" AND ($3::text IS NULL OR session = $3) AND time < $4 AND type IN ({_sql_list(RECORD_TYPES)})"
                        f' ORDER BY session, seq LIMIT {PRUNE_ROWS}',
            "prune": f"UPDATE {table} AS e SET body = u.body FROM unnest($1::text[], $2::bigint[], $3::bytea[])"
                     f" AS u(session, seq, body) WHERE e.session = u.session AND e.seq = u.seq",
            "notify": "SELECT pg_notify($1, $2)",
            "watch": "SELECT 1 /* projectionist watch */",
            "listen": f'LISTEN "{self.channel}"',
            # One statement, so one snapshot: the last seq, and the state events up to it from
            # the latest checkpoint past $2 on (a row of NULLs for last alone when there is none).
            "read_state":
                f"WITH last AS (SELECT coalesce(max(seq), 0) AS n FROM {table} WHERE session = $1),"
                f" mark AS (SELECT coalesce((SELECT c.seq FROM {table} c WHERE c.session = $1 AND c.{_NOT_RECORD}"
                f" AND c.type = '{CHECKPOINT}' AND c.seq > $2 AND c.seq <= (SELECT n FROM last)"
                f" ORDER BY c.seq DESC LIMIT 1), $2 + 1) AS s)"  # backwards: stops at the latest one
                f" SELECT last.n, e.seq, e.body FROM last LEFT JOIN LATERAL (SELECT x.seq, x.body FROM {table} x, mark"
                f" WHERE x.session = $1 AND x.{_NOT_RECORD} AND x.seq >= mark.s AND x.seq <= last.n) e ON true"
                f" ORDER BY e.seq",
        }
        self._ops = {sql: op for op, sql in self._sql.items()}

    # -- SessionLog ------------------------------------------------------------------------------

    async def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        rows = await self._run(lambda conn: conn.fetch(self._sql["read"], session_id, after_seq))
        return decode_rows(session_id, after_seq, ((row[0], row[1]) for row in rows))

    async def read_state(self, session_id: str, after_seq: int = 0) -> StateRead:
        """One round trip, one snapshot; the rows come through the state index, records never."""
        rows = await self._run(lambda conn: conn.fetch(self._sql["read_state"], session_id, after_seq))
        last = int(rows[0][0]) if rows else 0
        events = decode_states(session_id, after_seq, ((row[1], row[2]) for row in rows if row[1] is not None))
        return StateRead(events, last)

    async def append(
        self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *, durable: bool = True
    ) -> list[Event]:
        """One round trip: ``projectionist_append`` takes the session's advisory lock, checks that
        no state event came after ``expected_seq``, and inserts after the last event, so records
        and decisions never race on a seq and records never make a decision conflict."""
        if not data:
            raise ValueError("append needs at least one event")
        if expected_seq is not None and expected_seq < 0:
            raise ValueError(f"expected_seq must be >= 0, got {expected_seq}")
        types = event_types(data)
        if expected_seq is None and not durable:
            return await self._append_at_end(session_id, list(data), types)
        now = self._clock()
        bodies = [_DATA.encode(d) for d in data]
        try:
            first = int(await self._run(lambda conn: conn.fetchval(
                self._sql["append"], session_id, expected_seq, types, now, bodies, durable)))
        except asyncpg.UniqueViolationError:  # a writer that does not take the session's lock
            first = -int(await self._run(lambda conn: conn.fetchval(self._sql["last"], session_id))) - 1
        if first < 0:
            raise AppendConflict(session_id, expected_seq or 0, -first - 1)
        return envelopes(first - 1, now, data)

    async def append_calls(self, session_id: str, calls: CallRecords) -> int:
        """Each call's record an event row of its own, in the records' group commit."""
        return await append_calls_as_events(self, session_id, calls)

    async def _append_at_end(self, session_id: str, items: list[EventData], types: list[str]) -> list[Event]:
        """Records in group commits: a batch is one statement for all its sessions
        (``projectionist_append_records``), so a replica pays one round trip for the records of
        many calls in many sessions."""
        if self._closed:
            raise RuntimeError("PostgresLog is closed")
        return await self._records.append(session_id, items, types)

    async def _write_records(self, items_batch: list[Item]) -> list[list[Event] | int]:
        # every item is events' data: ``append_calls`` appends its calls' records as events
        batch = cast(list[tuple[str, list[EventData], list[str]]], items_batch)
        now = self._clock()
        sessions = [sid for sid, items, _ in batch for _ in items]
        types = [t for _, _, kinds in batch for t in kinds]
        bodies = [_DATA.encode(item) for _, items, _ in batch for item in items]
        seqs = await self._run(lambda conn: conn.fetchval(self._sql["append_records"], sessions, types, now, bodies))
        written: list[list[Event] | int] = []
        index = 0
        for _, items, _ in batch:
            written.append([envelope(int(seqs[index + i]), now, item) for i, item in enumerate(items)])
            index += len(items)
        return written

    async def fork(self, parent: str, child: str, at_seq: int | None = None) -> ForkedEvent:
        async def tx(conn: Any) -> ForkedEvent:
            async with conn.transaction():
                # the child's append lock: a fork and an append to the new session never interleave
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))", child)
                if child == parent or await conn.fetchval(self._sql["exists"], child):
                    raise Conflict(f"session {child!r} already exists", code=Code.SESSION_EXISTS)
                last = int(await conn.fetchval(self._sql["last"], parent))
                at = last if at_seq is None else at_seq
                if not 0 <= at <= last:
                    raise InvalidRequest(f"cannot fork {parent!r} at seq {at}: its last seq is {last}",
                                         code=Code.INVALID_FORK_SEQ)
                await conn.execute(self._sql["copy"], child, parent, at)  # verbatim bodies and times
                marker = ForkedEvent(seq=at + 1, time=self._clock(), data=Forked(parent=parent, at_seq=at))
                await conn.execute(self._sql["insert"], child, marker.seq, FORKED, marker.time, encode_event(marker))
                await conn.execute(self._sql["notify"], self.channel, child)  # delivered at commit
                return marker

        try:
            return await self._run(tx)
        except asyncpg.UniqueViolationError:
            raise Conflict(f"session {child!r} already exists", code=Code.SESSION_EXISTS) from None

    # -- extras ----------------------------------------------------------------------------------

    async def sessions(self) -> list[str]:
        rows = await self._run(lambda conn: conn.fetch(self._sql["sessions"]))
        return [row[0] for row in rows]

    async def session_stats(self, session: str | None = None, limit: int | None = None) -> list[SessionStats]:
        """Each session's count, last seq and latest time (see ``base.Log``), in one statement."""
        if session is None:
            rows = await self._run(lambda conn: conn.fetch(self._sql["stats"], limit))
        else:
            rows = await self._run(lambda conn: conn.fetch(self._sql["stats_of"], session))
        return [SessionStats(row[0], int(row[1]), int(row[2]), row[3]) for row in rows]

    async def prune(self, before: str, session: str | None = None) -> Pruned:
        """Every record stored before ``before`` pruned (``base.Log``), ``PRUNE_ROWS`` rows per
        transaction: a read of the next rows, then one statement that rewrites them."""
        done, after = Pruned(), ("", 0)
        sessions: set[str] = set()
        while True:
            async def tx(conn: Any, after: tuple[str, int] = after) -> tuple[Pruned, set[str], tuple[str, int]]:
                async with conn.transaction():
                    rows = await conn.fetch(self._sql["prunable"], *after, session, before)
                    pruned, damaged = [], 0
                    for row in rows:
                        try:
                            pruned.append((row[0], row[1], pruned_row(row[1], row[2]), len(row[2])))
                        except (msgspec.DecodeError, TypeError):  # damaged: left as it is, for an operator
                            get_logger().warning("prune_skipped_damaged_row", session=row[0], seq=row[1])
                            damaged += 1
                    todo = [(s, seq, new, size) for s, seq, new, size in pruned if new is not None]
                    if todo:
                        await conn.execute(self._sql["prune"], [t[0] for t in todo], [t[1] for t in todo],
                                           [t[2] for t in todo])
                    step = Pruned(len(todo), 0, sum(t[3] for t in todo), sum(len(t[2]) for t in todo if t[2]), damaged)
                    return step, {t[0] for t in todo}, (rows[-1][0], rows[-1][1]) if len(rows) == PRUNE_ROWS else ("", 0)

            step, seen, after = await self._run(tx)
            done += step
            sessions |= seen
            if not after[0]:
                return done._replace(sessions=len(sessions))

    async def ping(self) -> None:
        """``SELECT 1`` on a pooled connection: the pool has one to give and the server answers."""
        await self._run(lambda conn: conn.fetchval("SELECT 1"))

    async def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        await self._records.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def start(self) -> None:
        """Open the pool and create or migrate the schema now (the app calls this at startup).

        A database that is down does not stop the replica from starting: the failure is logged
        and the pool is opened on first use instead. An unsupported schema version does."""
        try:
            await self._open()
        except PG_ERRORS.types as exc:
            get_logger().warning("session_log_unavailable_at_startup", error=type(exc).__name__,
                                 retry="on first use")
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(self._listen())

    # -- plumbing --------------------------------------------------------------------------------

    async def _run(self, job: Callable[[Any], Awaitable[_T]]) -> _T:
        """``job`` on a pooled connection; waiting for the connection and the job together take at
        most ``timeout`` (they used to take it each). The log's boundary: a lost race goes on as
        it is, for ``append`` and ``fork``."""
        with map_exceptions(PG_ERRORS, Code.LOG_UNAVAILABLE, "session log"):
            pool = await self._open()
            async with asyncio.timeout(self._timeout):
                async with pool.acquire() as conn:
                    return await job(conn)

    async def _open(self) -> asyncpg.Pool:
        """The pool, created (and the schema migrated) at startup or, if the database was down
        then, on first use."""
        if self._pool is not None:
            return self._pool
        if self._closed:
            raise RuntimeError("PostgresLog is closed")
        async with self._opening:
            if self._pool is None:
                pool = await asyncpg.create_pool(self._dsn, min_size=self._min_size, max_size=self._max_size,
                                                 timeout=self._timeout, command_timeout=self._timeout,
                                                 init=self._init_connection, reset=_keep_session)
                try:
                    async with pool.acquire() as conn:
                        await self._migrate(conn)
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
        return self._pool

    async def _listen(self) -> None:
        """Keep one connection LISTENing for state-change notices, outside the pool. A connection
        that ends, or fails its ping every ``ping_every`` seconds, makes the watch vouch for
        nothing until a new one listens (then every cached fold is read once more)."""
        delay = 0.5
        while not self._closed:
            conn: Any = None
            try:
                await self._open()  # the schema (and so the functions that notify) first
                conn = await asyncpg.connect(self._dsn, timeout=self._timeout)
                conn.add_query_logger(self._sent)
                ended = asyncio.Event()
                conn.add_termination_listener(lambda _conn: ended.set())
                await asyncio.wait_for(conn.add_listener(self.channel, self._notice), self._timeout)
                self.watch.renewed()
                delay = 0.5
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can turn the task's own
                # cancellation into a TimeoutError, which the suppress below then swallowed, and a
                # closing log waited for this loop forever. ``_closed`` is checked too, so a
                # swallowed cancellation still ends the loop within one ping period.
                while not ended.is_set() and not self._closed:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.ping_every):
                            await ended.wait()
                        break
                    async with asyncio.timeout(self._timeout):
                        await conn.fetchval(self._sql["watch"])
            except Exception as exc:  # (never a cancellation: that is no Exception) retried, forever
                get_logger().warning("session_log_watch_lost", error=type(exc).__name__, retry_s=delay)
            finally:
                self.watch.lost()
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    def _notice(self, _conn: Any, _pid: int, _channel: str, session_id: str) -> None:
        self.watch.notified(session_id)

    async def _init_connection(self, conn: Any) -> None:
        conn.add_query_logger(self._sent)

    def _sent(self, query: Any) -> None:
        """Count one statement a connection sent (asyncpg's query logger, called soon after)."""
        text = str(query.query)
        op = self._ops.get(text)
        if op is None:
            head = text.lstrip().split(None, 1)[0].upper() if text.strip() else ""
            op = ("transaction" if head.rstrip(";") in ("BEGIN", "COMMIT", "ROLLBACK") else
                  "reset" if "pg_advisory_unlock_all" in text else "other")
        self.ops.add(op)

    async def _migrate(self, conn: Any) -> None:
        schema = f'"{self._schema}"'
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('projectionist.migrate'))")
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            await conn.execute(f"CREATE TABLE IF NOT EXISTS {schema}.projectionist_meta"
                               " (key text PRIMARY KEY, value text NOT NULL)")
            await conn.execute(f"CREATE TABLE IF NOT EXISTS {schema}.projectionist_events ("
                               " session text NOT NULL, seq bigint NOT NULL, type text NOT NULL,"
                               " time text NOT NULL, body bytea NOT NULL, PRIMARY KEY (session, seq))")
            await conn.execute(f"INSERT INTO {schema}.projectionist_meta VALUES ('schema_version', $1)"
                               " ON CONFLICT (key) DO NOTHING", str(SCHEMA_VERSION))
            version = await conn.fetchval(f"SELECT value FROM {schema}.projectionist_meta WHERE key = 'schema_version'")
            if int(version) <= SCHEMA_VERSION:  # the rows stay as they are in every step
                # 1 -> 2: the append function (re-created on every start: its passive types are this version's)
                await conn.execute(_APPEND_FUNCTION.format(schema=schema, passive=_sql_list(PASSIVE_TYPES),
                                                           channel=self.channel))
                # the records' group commit (re-created on every start, as the append function)
                await conn.execute(_APPEND_RECORDS_FUNCTION.format(schema=schema))
                # 2 -> 3: the state index, so a fold reads state events without the records. Built
                # inside the migration (it blocks appends to the table while it builds, once); looked
                # up first, since CREATE INDEX IF NOT EXISTS would lock the table on every start.
                if await conn.fetchval("SELECT to_regclass($1)", f"{schema}.projectionist_events_state") is None:
                    await conn.execute(f"CREATE INDEX projectionist_events_state"
                                       f" ON {schema}.projectionist_events (session, seq) WHERE {_NOT_RECORD}")
                await conn.execute(f"UPDATE {schema}.projectionist_meta SET value = $1 WHERE key = 'schema_version'",
                                   str(SCHEMA_VERSION))
                version = SCHEMA_VERSION
        if int(version) != SCHEMA_VERSION:
            raise Unavailable(f"session log schema version {version} is not supported (expected {SCHEMA_VERSION})",
                              code=Code.LOG_UNAVAILABLE, retryable=False)


async def _keep_session(conn: Any) -> None:
    """The pool's reset on release: nothing to send. asyncpg's default sends one more statement
    (unlock advisory locks, close cursors, unlisten, reset settings) after every job, doubling
    the round trips; this log leaves no such state behind (its locks are transaction-scoped, its
    settings ``set_config(..., true)``, no LISTEN, no cursor outside a transaction), and asyncpg
    still rolls back a transaction left open before calling this."""


#: The append, server side, in one round trip. Under the session's transaction-scoped advisory
#: lock (so appends of every kind to one session are serialised across replicas and never race on
#: a seq): the conditional check (no state event after the expected seq; records and checkpoints
#: never conflict),
#: then the insert after the last event, each body the envelope around the event's data. Returns
#: the first new seq, or on a conflict -(last seq + 1).
_APPEND_FUNCTION: Final = """
CREATE OR REPLACE FUNCTION {schema}.projectionist_append(
    p_session text, p_expected bigint, p_types text[], p_time text, p_datas bytea[], p_durable boolean)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    last_seq bigint;
BEGIN
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(p_session, 7));
    SELECT coalesce(max(seq), 0) INTO last_seq FROM {schema}.projectionist_events WHERE session = p_session;
    IF p_expected IS NOT NULL AND (p_expected > last_seq OR last_seq <> p_expected AND EXISTS (
        SELECT 1 FROM {schema}.projectionist_events
        WHERE session = p_session AND seq > p_expected AND type NOT IN ({passive}))) THEN
        RETURN -last_seq - 1;
    END IF;
    INSERT INTO {schema}.projectionist_events (session, seq, type, time, body)
    SELECT p_session, last_seq + u.ord, u.type, p_time,
           convert_to('{{"type":' || to_json(u.type)::text || ',"seq":' || (last_seq + u.ord)::text
                      || ',"time":' || to_json(p_time)::text || ',"data":', 'UTF8') || u.data || '\\x7d'::bytea
    FROM unnest(p_types, p_datas) WITH ORDINALITY AS u(type, data, ord);
    IF EXISTS (SELECT 1 FROM unnest(p_types) AS t WHERE t NOT IN ({passive})) THEN
        PERFORM pg_notify('{channel}', p_session);  -- a state change: replicas' folds go stale
    END IF;
    RETURN last_seq + 1;
END
$fn$
"""


#: Records of many sessions in one round trip (the group commit of ``_append_at_end``). Under every
#: session's advisory lock, taken in one sorted order (two batches can never wait on each other),
#: each item goes after its session's last event, items of one session in the order given.
#: Records never conflict, so there is no expected seq. Returns each item's seq, in input order.
_APPEND_RECORDS_FUNCTION: Final = """
CREATE OR REPLACE FUNCTION {schema}.projectionist_append_records(
    p_sessions text[], p_types text[], p_time text, p_datas bytea[])
RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
    s text;
    result bigint[];
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    FOR s IN SELECT DISTINCT x COLLATE "C" FROM unnest(p_sessions) AS x ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(s, 7));
    END LOOP;
    WITH items AS (
        SELECT u.ord, u.session, u.type, u.data,
               l.last + row_number() OVER (PARTITION BY u.session ORDER BY u.ord) AS seq
        FROM unnest(p_sessions, p_types, p_datas) WITH ORDINALITY AS u(session, type, data, ord)
        JOIN (SELECT d.session, (SELECT coalesce(max(e.seq), 0) FROM {schema}.projectionist_events e
                                 WHERE e.session = d.session) AS last
              FROM (SELECT DISTINCT x AS session FROM unnest(p_sessions) AS x) d) l ON l.session = u.session
    ), written AS (
        INSERT INTO {schema}.projectionist_events (session, seq, type, time, body)
        SELECT session, seq, type, p_time,
               convert_to('{{"type":' || to_json(type)::text || ',"seq":' || seq::text
                          || ',"time":' || to_json(p_time)::text || ',"data":', 'UTF8') || data || '\\x7d'::bytea
        FROM items
        RETURNING 1
    )
    SELECT array_agg(seq ORDER BY ord) INTO result FROM items;
    RETURN result;
END
$fn$
"""
