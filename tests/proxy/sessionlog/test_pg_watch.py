"""The PostgreSQL log's state-change watch: a cached fold is handed out without a read only while
the listening connection stays up and no notice for its session arrived; another replica's
quarantine, recovery or fork voids it; records and checkpoints do not; a lost listener sends
every request back to the log until it listens again; a decision made in the notice's flight
still meets the conditional append and records one transition."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from projectionist.proxy.sessionlog.cached import CachedLog
from projectionist.proxy.sessionlog.postgres import PostgresLog
from projectionist.proxy.sessionlog.watch import StateWatch
from tests.backends import pg_dsn
from tests.conftest import drop_schema
from tests.proxy.sessionlog.watching import a_stale_decision_records_one_transition, ID, quarantine, record, until

def own_dsn(name: str) -> str:
    """The test server's DSN with ``application_name`` set to ``name`` (asyncpg sends the DSN's
    other query parameters as server settings)."""
    dsn = pg_dsn()
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={name}"


def schema_of(log: CachedLog) -> str:
    """The schema of a replica's log (its channel names it), which is its connections' ``application_name``."""
    assert isinstance(log.inner, PostgresLog)
    return log.inner.channel.removeprefix("projectionist_state:")


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[CachedLog, CachedLog]]:
    """Two replicas' logs on one schema of their own, both listening; their connections carry the
    schema as their ``application_name``, so a test can find them among every other run's."""
    schema = f"w_{uuid.uuid4().hex[:12]}"
    dsn = own_dsn(schema)
    a, b = PostgresLog(dsn, schema=schema), PostgresLog(dsn, schema=schema)
    for log in (a, b):
        log.ping_every = 0.2
        await log.start()
    try:
        await until(lambda: a.watch.healthy and b.watch.healthy, "both watches to listen")
        yield CachedLog(a), CachedLog(b)
    finally:
        await a.close()
        await b.close()
        await drop_schema(schema)


async def test_a_read_fold_stays_fresh_until_another_replica_changes_the_session(
        replicas: tuple[CachedLog, CachedLog]) -> None:
    a, b = replicas
    await a.read_state("s", 0)
    assert a.fresh("s") is not None  # vouched: no notice since the read
    await b.append("s", None, [record("r1")], durable=False)  # records change no state: no notice
    await asyncio.sleep(0.3)
    assert a.fresh("s") is not None
    seen = a.watch.notices if a.watch else 0
    await b.append("s", 1, [quarantine()])  # a state change: a notice to every replica
    await until(lambda: a.watch is not None and a.watch.notices > seen, "the notice")
    assert a.fresh("s") is None  # the next request reads
    read = await a.read_state("s", a.states.get("s").last_seq)  # type: ignore[union-attr]
    assert [e.data for e in read.events] == [quarantine()]
    fresh = a.fresh("s")
    assert fresh is not None and ID in fresh.quarantined


async def test_a_fork_by_another_replica_voids_a_cached_empty_fold(replicas: tuple[CachedLog, CachedLog]) -> None:
    a, b = replicas
    await b.append("parent", None, [quarantine()])
    await a.read_state("child", 0)  # the child does not exist yet: an empty fold, vouched
    assert a.fresh("child") is not None
    await b.fork("parent", "child")
    await until(lambda: a.fresh("child") is None, "the fork's notice")
    await a.read_state("child", 0)
    state = a.fresh("child")
    assert state is not None and ID in state.quarantined


async def test_a_lost_listener_vouches_for_nothing_until_it_listens_again(
        replicas: tuple[CachedLog, CachedLog]) -> None:
    a, _ = replicas
    watch = a.watch
    assert watch is not None
    await a.read_state("s", 0)
    assert a.fresh("s") is not None
    conn = await asyncpg.connect(pg_dsn())
    try:  # what a failover or a network cut does to the listening connection: this test's own only
        # (tests run in parallel, and other runs may share the server: their listeners stay up)
        killed = await conn.fetchval("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                     " WHERE pid <> pg_backend_pid() AND application_name = $1"
                                     " AND (query LIKE 'LISTEN%' OR query LIKE '%projectionist watch%')",
                                     schema_of(a))
    finally:
        await conn.close()
    assert killed >= 1
    await until(lambda: not watch.healthy, "the watch to notice the lost connection")
    assert a.fresh("s") is None  # meanwhile every request reads the log
    await until(lambda: watch.healthy, "the watch to listen again", seconds=10)
    assert a.fresh("s") is None  # marks from before the loss stay void (notices may have been missed)
    await a.read_state("s", 0)
    assert a.fresh("s") is not None


async def test_a_decision_made_before_the_notice_arrives_still_records_one_transition(
        replicas: tuple[CachedLog, CachedLog]) -> None:
    a, b = replicas
    assert a.watch is not None
    await a.read_state("race", 0)
    a.watch.notified = lambda session_id: None  # type: ignore[method-assign]  # the notice is in flight
    await a_stale_decision_records_one_transition(a, b, "race")  # B quarantined it first


def test_the_watch_forgets_old_sessions_conservatively() -> None:
    watch = StateWatch(capacity=2)
    watch.renewed()
    mark = watch.mark()
    watch.notified("x")
    for name in ("y", "z", "w"):  # x is evicted: its notice must still count
        watch.notified(name)
    assert not watch.unchanged("x", mark)
    assert not watch.unchanged("never-notified", mark)  # anything older than the forgotten ones is suspect
    later = watch.mark()
    assert watch.unchanged("x", later) and watch.unchanged("never-notified", later)
    watch.lost()
    assert watch.mark() is None and not watch.unchanged("x", later)
