"""The policy semantics table (DESIGN.md §1), written once: every test here takes an ``env`` fixture
(a counting, scriptable store and a log on one backend) that the module importing the tests supplies.

``tests/policy/test_policy.py`` runs the table on the in-memory doubles (pure, in the fast loop);
``tests/system/test_policy_backends.py`` runs the same tests on the embedded filesystem store +
SQLite log and on the replicated S3 bucket + PostgreSQL log.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from projectionist.policy.errors import CORRUPT, INVALID_REF, NOT_FOUND, READ_FAILED, AttachmentError, Conflict, InternalError
from projectionist.policy.events import Event, Quarantine, QuarantineEvent, Recovered, RecoveredEvent
from projectionist.policy.model import ImageRef, Resolved, StoredImage, Placeholder
from projectionist.policy.ports import SessionLog
from projectionist.policy.projection import ProjectionContext, project, recover
from projectionist.proxy.sessionlog.base import Log
from tests.fakes import CountingStore
from tests.imaging import make_image, ref_id

GOOD_BYTES = make_image(color=1)
OTHER_BYTES = make_image(5, 2, color=2)
GOOD, OTHER = ref_id(GOOD_BYTES), ref_id(OTHER_BYTES)
MISSING = "sha256:" + "ab" * 32
SID = "s1"


@dataclass
class Env:
    """A store (counting, scriptable) and a log on one backend, plus a way to open a second log."""

    store: CountingStore
    log: Log
    reopen: Any

    async def add(self, data: bytes) -> StoredImage:
        return await self.store.admit(data)

    async def events(self, session: str = SID) -> list[Event]:
        return await self.log.read(session)


def fails(code: str, times: int = 99) -> Any:
    async def script(aid: str, n: int) -> None:
        if n <= times:
            raise AttachmentError(code, attachment_id=aid)
    return script


async def run(env: Env, *ids: str, session: str | None = SID, log: SessionLog | None = None, **kw: Any) -> Any:
    context = ProjectionContext(store=env.store, log=log or env.log, session_id=session, **kw)
    return await project([ImageRef(i) for i in ids], context)


@pytest.mark.parametrize(
    ("code", "failure", "retryable", "reads"),
    [(NOT_FOUND, "not_found", False, 1), (CORRUPT, "corrupt", False, 1), (READ_FAILED, "read_failed", True, 2)],
)
async def test_failure_is_quarantined_once_with_the_right_class(
    env: Env, code: str, failure: str, retryable: bool, reads: int
) -> None:
    await env.add(GOOD_BYTES)
    env.store.script = fails(code)
    result = await run(env, GOOD)
    assert env.store.total == reads
    assert result.recorded == (Quarantine(GOOD, failure, retryable),)  # type: ignore[arg-type]
    [event] = await env.events()
    assert isinstance(event, QuarantineEvent) and event.data.failure == failure and event.data.retryable is retryable
    assert result.outcomes == (Placeholder(failure, f"[image unavailable: {failure} ({GOOD[:15]})]"),)  # type: ignore[arg-type]


async def test_a_real_missing_object_is_not_found(env: Env) -> None:
    result = await run(env, MISSING)
    assert [q.failure for q in result.recorded] == ["not_found"] and env.store.total == 1


async def test_second_request_derives_placeholder_from_log_without_reading(env: Env) -> None:
    first = await run(env, MISSING)
    second = await run(env, MISSING)
    assert env.store.total == 1 and len(await env.events()) == 1
    assert first.outcomes == second.outcomes
    assert second.recorded == () and second.reads == 0


async def test_read_failed_then_success_sends_the_image_and_records_nothing(env: Env) -> None:
    good = await env.add(GOOD_BYTES)
    env.store.script = fails(READ_FAILED, times=1)
    result = await run(env, GOOD)
    assert result.outcomes == (Resolved(good),)
    assert env.store.reads[GOOD] == 2 and await env.events() == []


async def test_cancellation_during_first_read_records_nothing(env: Env) -> None:
    started = asyncio.Event()

    async def slow(aid: str, n: int) -> None:
        started.set()
        await asyncio.sleep(10)

    env.store.script = slow
    task = asyncio.create_task(run(env, MISSING))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await env.events() == []


async def test_cancellation_during_the_retry_records_nothing(env: Env) -> None:
    in_retry = asyncio.Event()

    async def flaky_then_slow(aid: str, n: int) -> None:
        if n == 1:
            raise AttachmentError(READ_FAILED)
        in_retry.set()
        await asyncio.sleep(10)

    env.store.script = flaky_then_slow
    task = asyncio.create_task(run(env, MISSING))
    await in_retry.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert env.store.reads[MISSING] == 2 and await env.events() == []


async def test_unclassified_error_fails_clearly_and_records_nothing(env: Env) -> None:
    await env.add(GOOD_BYTES)

    async def broken(aid: str, n: int) -> None:
        raise RuntimeError("driver bug")

    env.store.script = broken
    with pytest.raises(InternalError) as info:
        await run(env, GOOD, MISSING)
    assert info.value.code == "UNCLASSIFIED_ERROR" and info.value.status == 500
    assert await env.events() == []


async def test_several_failures_in_one_request_are_one_atomic_append(env: Env) -> None:
    await env.add(GOOD_BYTES)
    missing2 = "sha256:" + "cd" * 32
    result = await run(env, MISSING, GOOD, missing2)
    events = await env.events()
    assert [e.seq for e in events] == [1, 2] and events[0].time == events[1].time  # one append
    assert [q.attachment_id for q in result.recorded] == [MISSING, missing2]
    assert isinstance(result.outcomes[1], Resolved)


async def test_repeated_references_are_all_replaced_and_read_once(env: Env) -> None:
    good = await env.add(GOOD_BYTES)
    refs = [ImageRef(MISSING, "a.png"), ImageRef(GOOD), ImageRef(MISSING), ImageRef(GOOD), ImageRef(MISSING, "b.png")]
    result = await project(refs, ProjectionContext(store=env.store, log=env.log, session_id=SID))
    assert env.store.reads == {MISSING: 1, GOOD: 1}
    texts = [o.text for o in result.outcomes if isinstance(o, Placeholder)]
    short = MISSING[:15]
    # the reference's own name wins; the recorded name (first seen) fills in otherwise
    assert texts == [f'[image unavailable: not_found; "a.png" ({short})]',
                     f'[image unavailable: not_found; "a.png" ({short})]',
                     f'[image unavailable: not_found; "b.png" ({short})]']
    assert result.recorded[0].name == "a.png"
    assert result.outcomes[1] == result.outcomes[3] == Resolved(good)


@pytest.mark.parametrize(("code", "status"), [(NOT_FOUND, 422), (CORRUPT, 422), (READ_FAILED, 503)])
async def test_sessionless_fail_raises_the_attachment_error(env: Env, code: str, status: int) -> None:
    await env.add(GOOD_BYTES)
    env.store.script = fails(code)
    with pytest.raises(AttachmentError) as info:
        await run(env, GOOD, session=None)
    assert (info.value.code, info.value.status) == (code, status)


async def test_sessionless_placeholder_mode_projects_without_recording(env: Env) -> None:
    result = await run(env, MISSING, session=None, sessionless="placeholder")
    assert isinstance(result.outcomes[0], Placeholder) and result.recorded == ()
    assert await env.events() == []


async def test_invalid_reference_code_from_store_is_the_clients_error(env: Env) -> None:
    env.store.script = fails(INVALID_REF)
    with pytest.raises(AttachmentError) as info:
        await run(env, MISSING)
    assert info.value.status == 400 and await env.events() == []


@pytest.mark.parametrize("shared_lock", [True, False], ids=["one-process", "two-processes"])
async def test_fifty_concurrent_requests_make_one_event(env: Env, shared_lock: bool) -> None:
    lock = asyncio.Lock()
    second = env.reopen()  # a second log connection, as another process would have
    results = await asyncio.gather(*(
        run(env, MISSING, lock=lock if shared_lock else asyncio.Lock(), log=second if i % 2 else None)
        for i in range(50)))
    assert len(await env.events()) == 1
    assert sum(len(r.recorded) for r in results) == 1
    assert len({r.outcomes for r in results}) == 1


async def test_projection_is_deterministic_for_the_same_log(env: Env) -> None:
    await env.add(GOOD_BYTES)
    await env.add(OTHER_BYTES)
    ids = (GOOD, MISSING, OTHER, MISSING)
    first = await run(env, *ids)
    again = await run(env, *ids)
    restarted = await run(env, *ids, log=env.reopen())
    assert first.outcomes == again.outcomes == restarted.outcomes
    assert again.reads == restarted.reads == 2  # the quarantined one is never read again


async def test_recover_requires_a_verified_read_and_appends_once(env: Env) -> None:
    await run(env, GOOD)  # not in the store yet: quarantined not_found
    with pytest.raises(Conflict) as refused:
        await recover(GOOD, store=env.store, log=env.log, session_id=SID)
    assert (refused.value.code, refused.value.status) == (NOT_FOUND, 409)
    assert len(await env.events()) == 1
    good = await env.add(GOOD_BYTES)  # repaired by re-admission
    done = await recover(GOOD, store=env.store, log=env.log, session_id=SID)
    assert isinstance(done.event, RecoveredEvent)
    assert done.event.data == Recovered(GOOD, good.bytes, good.media_type, good.width, good.height)
    result = await run(env, GOOD)
    assert result.outcomes == (Resolved(good),)


async def test_recover_of_a_corrupt_object_is_refused(env: Env) -> None:
    await env.add(GOOD_BYTES)
    env.store.script = fails(CORRUPT)
    await run(env, GOOD)
    with pytest.raises(Conflict) as refused:
        await recover(GOOD, store=env.store, log=env.log, session_id=SID)
    assert refused.value.code == CORRUPT and len(await env.events()) == 1


async def test_recover_of_a_reference_not_quarantined_appends_nothing_and_reads_nothing(env: Env) -> None:
    await env.add(GOOD_BYTES)
    result = await recover(GOOD, store=env.store, log=env.log, session_id=SID)
    assert result.event is None and env.store.total == 0 and await env.events() == []


@pytest.mark.parametrize("shared_lock", [True, False], ids=["one-process", "two-processes"])
async def test_concurrent_recoveries_make_one_event(env: Env, shared_lock: bool) -> None:
    await run(env, GOOD)
    await env.add(GOOD_BYTES)
    lock = asyncio.Lock()
    second = env.reopen()
    results = await asyncio.gather(*(
        recover(GOOD, store=env.store, log=second if i % 2 else env.log, session_id=SID,
                lock=lock if shared_lock else asyncio.Lock())
        for i in range(10)))
    assert sum(r.event is not None for r in results) == 1
    assert [type(e).__name__ for e in await env.events()] == ["QuarantineEvent", "RecoveredEvent"]


async def test_fork_keeps_the_quarantine_state(env: Env) -> None:
    await env.add(GOOD_BYTES)
    parent = await run(env, GOOD, MISSING)
    await env.log.fork(SID, "child")
    child = await run(env, GOOD, MISSING, session="child")
    assert child.outcomes == parent.outcomes and child.recorded == ()
