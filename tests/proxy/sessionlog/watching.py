"""What the tests of the logs' state-change watches share: the events they append, waiting for a
condition, and reading a session until its watch vouches for the fold."""

from __future__ import annotations

import asyncio

from projectionist.policy.errors import AttachmentError
from projectionist.policy.events import Quarantine, RequestRecorded
from projectionist.policy.model import ImageRef
from projectionist.policy.projection import ProjectionContext, project
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


async def a_stale_decision_records_one_transition(a: CachedLog, b: CachedLog, session_id: str) -> None:
    """``b`` quarantines ``ID`` in ``session_id`` while ``a``'s watch has not seen it (the caller
    holds its notices back): ``a`` decides on its stale fold, and its own quarantine meets the
    conditional append and gives way. One transition in the log."""
    await b.append(session_id, 0, [quarantine()])

    class Missing:
        async def read_image(self, attachment_id: str) -> object:
            raise AttachmentError("ATTACHMENT_NOT_FOUND", "gone", attachment_id=attachment_id)

    stale = a.fresh(session_id)
    assert stale is not None and not stale.quarantined  # A decides on a fold without B's quarantine
    projection = await project([ImageRef(ID)], ProjectionContext(store=Missing(), log=a,  # type: ignore[arg-type]
                                                                 session_id=session_id, lock=a.lock(session_id),
                                                                 state=stale, fresh=True))
    assert projection.recorded == ()  # its own quarantine met the conditional append and gave way
    assert ID in projection.state.quarantined
    events = await b.read(session_id, 0)
    assert [type(e).__name__ for e in events] == ["QuarantineEvent"]  # one transition
