"""Session summaries on both backends: counts and times from one query, standing quarantines from
the fold (rejections included, recoveries lifting them), and a fold this process already holds
costs no read."""

from __future__ import annotations

from projectionist.policy.events import Rejected, Variant
from projectionist.proxy.sessionlog.cached import CachedLog
from projectionist.proxy.sessionlog.postgres import PostgresLog
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.sessionlog.summary import SessionSummary, summaries, summary
from tests.proxy.sessionlog.test_long_session import CountingLog
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


def rejected(attachment_id: str) -> Rejected:
    return Rejected(attachment_id=attachment_id, format="anthropic", suspects=1, message_digest="sha256:" + "0" * 64)


async def test_summaries_count_events_and_standing_quarantines(log: SqliteLog | PostgresLog,
                                                              log_backend: LogBackend) -> None:
    # written behind the cached log's back (another process, another replica): it must read them
    await log.append("a", 0, [q(ID_A), q(ID_B), rec(ID_A)])        # :00 one standing (B)
    await log.append("a", None, [record()], durable=False)          # :01 a record: counted, not a quarantine
    await log.append("b", 0, [q(ID_C), rejected(ID_A)])              # :02 a store failure and a rejection
    variant = Variant(ID_B, "anthropic@2000", ID_C, "image/png", 10, 1, 1, "r")
    await log.append("c", 0, [variant])                              # :03 nothing quarantined
    counting = CountingLog(log)
    cached = CachedLog(counting)  # type: ignore[arg-type]

    found = await summaries(cached)
    assert found == [
        SessionSummary("c", events=1, quarantined=0, last_seq=1, last_activity="2024-01-01T00:00:03.000Z"),
        SessionSummary("b", events=2, quarantined=2, last_seq=2, last_activity="2024-01-01T00:00:02.000Z"),
        SessionSummary("a", events=4, quarantined=1, last_seq=4, last_activity="2024-01-01T00:00:01.000Z"),
    ]
    assert counting.state_reads == 3
    # asked again: every fold is cached at its session's last seq, nothing is read but the counts
    assert await summaries(cached) == found and counting.state_reads == 3
    assert await summary(cached, "b") == found[1] and counting.state_reads == 3
    assert [s.session for s in await summaries(cached, limit=1)] == ["c"]

    # a recovery elsewhere: the next summary reads just what came after its fold
    await log.append("b", 2, [rec(ID_C)])
    after = await summary(cached, "b")
    assert after is not None and (after.events, after.quarantined, after.last_seq) == (3, 1, 3)
    assert counting.state_reads == 4
    assert await summary(cached, "nobody") is None


async def test_a_fork_summarises_its_own_prefix(log: SqliteLog | PostgresLog) -> None:
    await log.append("p", 0, [q(ID_A)])
    await log.append("p", 1, [q(ID_B)])
    await log.fork("p", "child", at_seq=1)
    cached = CachedLog(log)
    child = await summary(cached, "child")
    parent = await summary(cached, "p")
    assert child is not None and parent is not None
    assert (child.events, child.quarantined, child.last_seq) == (2, 1, 2)
    assert (parent.events, parent.quarantined) == (2, 2)
