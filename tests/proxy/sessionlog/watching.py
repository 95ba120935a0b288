"""What the tests of the logs' state-change watches share: the events they append, waiting for a
condition, and reading a session until its watch vouches for the fold."""

from __future__ import annotations

import asyncio

from projectionist.policy.events import Quarantine, RequestRecorded
from projectionist.proxy.sessionlog.cached import CachedLog
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.sessionlog.watch import PolledWatch

ID = "sha256:" + "ab" * 32


def quarantine(attachment_id: str = ID) -> Quarantine:
    return Quarantine(attachment_id=attachment_id, failure="not_found", retryable=False)


def record(request_id: str) -> RequestRecorded:
    return RequestRecorded(request_id=request_id, route="openai_chat", adapter="openai_chat", upstream="openai",
                           method="POST", path="/v1/chat/completions", log_seq=0, inbound_digest="sha256:0",
                           projected_digest="sha256:0", refs=(), shape=())


async def until(condition: object, what: str, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def vouched(log: CachedLog, session_id: str, interval: float) -> None:
    """Read ``session_id``'s state until the watch vouches for the fold (its first ask wakes the
    poller: a read before any recent poll is not vouched)."""
    for _ in range(200):
        await log.read_state(session_id, 0)
        if log.fresh(session_id) is not None:
            return
        await asyncio.sleep(interval)
    raise AssertionError("the watch never vouched")


def watch_of(log: CachedLog) -> PolledWatch:
    """The polled watch of a SQLite log's cache."""
    inner = log.inner
    assert isinstance(inner, SqliteLog) and isinstance(inner.watch, PolledWatch)
    return inner.watch
