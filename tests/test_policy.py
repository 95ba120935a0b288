"""Policy semantics (DESIGN.md §1), table-driven against in-memory Protocol implementations."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, strategies as st

from policy.errors import CORRUPT, INVALID_REF, NOT_FOUND, READ_FAILED, AttachmentError, Conflict, InternalError
from policy.events import Quarantine, QuarantineEvent, Recovered, RecoveredEvent, envelope
from policy.fold import EMPTY, fold, placeholder
from policy.model import ImageRef, Resolved, Unavailable, parse_file_id, parse_url_ref
from policy.projection import project, recover
from tests.memory import MemoryLog, MemoryStore, image

GOOD = image(b"good-bytes")
OTHER = image(b"other-bytes")
MISSING = "sha256:" + "ab" * 32
SID = "s1"


def fails(code: str, times: int = 99):
    async def script(aid: str, n: int) -> None:
        if n <= times:
            raise AttachmentError(code, attachment_id=aid)
    return script


async def run(store: MemoryStore, log: MemoryLog, *ids: str, session: str | None = SID, **kw):
    return await project([ImageRef(i) for i in ids], store=store, log=log, session_id=session, **kw)


@pytest.mark.parametrize(
    ("code", "failure", "retryable", "reads"),
    [(NOT_FOUND, "not_found", False, 1), (CORRUPT, "corrupt", False, 1), (READ_FAILED, "read_failed", True, 2)],
)
async def test_failure_is_quarantined_once_with_the_right_class(code, failure, retryable, reads) -> None:
    store, log = MemoryStore(GOOD), MemoryLog()
    store.script = fails(code)
    result = await run(store, log, GOOD.id)
    assert store.total == reads
    assert result.recorded == (Quarantine(GOOD.id, failure, retryable),)
    [event] = log.sessions[SID]
    assert isinstance(event, QuarantineEvent) and event.data.failure == failure and event.data.retryable is retryable
    assert result.outcomes == (Unavailable(failure, f"[image unavailable: {failure} ({GOOD.id[:15]})]"),)


async def test_second_request_derives_placeholder_from_log_without_reading() -> None:
    store, log = MemoryStore(), MemoryLog()
    first = await run(store, log, MISSING)
    second = await run(store, log, MISSING)
    assert store.total == 1 and len(log.sessions[SID]) == 1
    assert first.outcomes == second.outcomes
    assert second.recorded == () and second.reads == 0


async def test_read_failed_then_success_sends_the_image_and_records_nothing() -> None:
    store, log = MemoryStore(GOOD), MemoryLog()
    store.script = fails(READ_FAILED, times=1)
    result = await run(store, log, GOOD.id)
    assert result.outcomes == (Resolved(GOOD),)
    assert store.reads[GOOD.id] == 2 and log.sessions.get(SID, []) == []


async def test_cancellation_during_first_read_records_nothing() -> None:
    store, log = MemoryStore(), MemoryLog()
    started = asyncio.Event()

    async def slow(aid: str, n: int) -> None:
        started.set()
        await asyncio.sleep(10)

    store.script = slow
    task = asyncio.create_task(run(store, log, MISSING))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log.sessions.get(SID, []) == []


async def test_cancellation_during_the_retry_records_nothing() -> None:
    store, log = MemoryStore(), MemoryLog()
    in_retry = asyncio.Event()

    async def flaky_then_slow(aid: str, n: int) -> None:
        if n == 1:
            raise AttachmentError(READ_FAILED)
        in_retry.set()
        await asyncio.sleep(10)

    store.script = flaky_then_slow
    task = asyncio.create_task(run(store, log, MISSING))
    await in_retry.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.reads[MISSING] == 2 and log.sessions.get(SID, []) == []


async def test_unclassified_error_fails_clearly_and_records_nothing() -> None:
    store, log = MemoryStore(GOOD), MemoryLog()

    async def broken(aid: str, n: int) -> None:
        raise RuntimeError("driver bug")

    store.script = broken
    with pytest.raises(InternalError) as info:
        await run(store, log, GOOD.id, MISSING)
    assert info.value.code == "UNCLASSIFIED_ERROR" and info.value.status == 500
    assert log.sessions.get(SID, []) == []


async def test_several_failures_in_one_request_are_one_atomic_append() -> None:
    store, log = MemoryStore(GOOD), MemoryLog()
    missing2 = "sha256:" + "cd" * 32
    result = await run(store, log, MISSING, GOOD.id, missing2)
    assert log.appends == 1 and [e.seq for e in log.sessions[SID]] == [1, 2]
    assert [q.attachment_id for q in result.recorded] == [MISSING, missing2]
    assert isinstance(result.outcomes[1], Resolved)


async def test_repeated_references_are_all_replaced_and_read_once() -> None:
    store, log = MemoryStore(GOOD), MemoryLog()
    refs = [ImageRef(MISSING, "a.png"), ImageRef(GOOD.id), ImageRef(MISSING), ImageRef(GOOD.id), ImageRef(MISSING, "b.png")]
    result = await project(refs, store=store, log=log, session_id=SID)
    assert store.reads == {MISSING: 1, GOOD.id: 1}
    texts = [o.text for o in result.outcomes if isinstance(o, Unavailable)]
    short = MISSING[:15]
    # the reference's own name wins; the recorded name (first seen) fills in otherwise
    assert texts == [f'[image unavailable: not_found; "a.png" ({short})]',
                     f'[image unavailable: not_found; "a.png" ({short})]',
                     f'[image unavailable: not_found; "b.png" ({short})]']
    assert result.recorded[0].name == "a.png"
    assert result.outcomes[1] == result.outcomes[3] == Resolved(GOOD)


@pytest.mark.parametrize(("code", "status"), [(NOT_FOUND, 422), (CORRUPT, 422), (READ_FAILED, 503)])
async def test_sessionless_fail_raises_the_attachment_error(code: str, status: int) -> None:
    store, log = MemoryStore(GOOD), MemoryLog()
    store.script = fails(code)
    with pytest.raises(AttachmentError) as info:
        await run(store, log, GOOD.id, session=None)
    assert (info.value.code, info.value.status) == (code, status)
    assert log.sessions == {}


async def test_sessionless_placeholder_mode_projects_without_recording() -> None:
    store, log = MemoryStore(), MemoryLog()
    result = await run(store, log, MISSING, session=None, sessionless="placeholder")
    assert isinstance(result.outcomes[0], Unavailable) and result.recorded == ()
    assert log.sessions == {}


async def test_invalid_reference_code_from_store_is_the_clients_error() -> None:
    store, log = MemoryStore(), MemoryLog()
    store.script = fails(INVALID_REF)
    with pytest.raises(AttachmentError) as info:
        await run(store, log, MISSING)
    assert info.value.status == 400 and log.sessions.get(SID, []) == []


@pytest.mark.parametrize("shared_lock", [True, False], ids=["one-process", "two-processes"])
async def test_fifty_concurrent_requests_make_one_event(shared_lock: bool) -> None:
    store, log = MemoryStore(), MemoryLog()
    lock = asyncio.Lock()
    locks = [lock if shared_lock else asyncio.Lock() for _ in range(50)]
    results = await asyncio.gather(*(run(store, log, MISSING, lock=lk) for lk in locks))
    assert len(log.sessions[SID]) == 1
    assert sum(len(r.recorded) for r in results) == 1
    assert len({r.outcomes for r in results}) == 1


async def test_projection_is_deterministic_for_the_same_log() -> None:
    store, log = MemoryStore(GOOD, OTHER), MemoryLog()
    ids = (GOOD.id, MISSING, OTHER.id, MISSING)
    first = await run(store, log, *ids)
    again = await run(store, log, *ids)
    other_log = MemoryLog()
    other_log.sessions[SID] = list(log.sessions[SID])
    replayed = await run(MemoryStore(GOOD, OTHER), other_log, *ids)
    assert first.outcomes == again.outcomes == replayed.outcomes


async def test_recover_requires_a_verified_read_and_appends_once() -> None:
    store, log = MemoryStore(), MemoryLog()
    await run(store, log, GOOD.id)  # GOOD is not in the store yet: quarantined not_found
    with pytest.raises(Conflict) as refused:
        await recover(GOOD.id, store=store, log=log, session_id=SID)
    assert (refused.value.code, refused.value.status) == (NOT_FOUND, 409)
    assert len(log.sessions[SID]) == 1
    store.images[GOOD.id] = GOOD  # repaired by re-admission
    done = await recover(GOOD.id, store=store, log=log, session_id=SID)
    assert isinstance(done.event, RecoveredEvent)
    assert done.event.data == Recovered(GOOD.id, GOOD.bytes, GOOD.media_type, GOOD.width, GOOD.height)
    result = await run(store, log, GOOD.id)
    assert result.outcomes == (Resolved(GOOD),)


async def test_recover_of_a_reference_not_quarantined_appends_nothing_and_reads_nothing() -> None:
    store, log = MemoryStore(GOOD), MemoryLog()
    result = await recover(GOOD.id, store=store, log=log, session_id=SID)
    assert result.event is None and store.total == 0 and log.sessions.get(SID, []) == []


@pytest.mark.parametrize("shared_lock", [True, False], ids=["one-process", "two-processes"])
async def test_concurrent_recoveries_make_one_event(shared_lock: bool) -> None:
    store, log = MemoryStore(), MemoryLog()
    await run(store, log, GOOD.id)
    store.images[GOOD.id] = GOOD
    lock = asyncio.Lock()
    results = await asyncio.gather(*(
        recover(GOOD.id, store=store, log=log, session_id=SID, lock=lock if shared_lock else asyncio.Lock())
        for _ in range(10)
    ))
    assert sum(r.event is not None for r in results) == 1
    assert [type(e).__name__ for e in log.sessions[SID]] == ["QuarantineEvent", "RecoveredEvent"]


async def test_fork_keeps_the_quarantine_state() -> None:
    store, log = MemoryStore(GOOD), MemoryLog()
    parent = await run(store, log, GOOD.id, MISSING)
    await log.fork(SID, "child")
    child = await run(store, log, GOOD.id, MISSING, session="child")
    assert child.outcomes == parent.outcomes and child.recorded == ()


def test_placeholder_text_is_pinned() -> None:
    q = Quarantine("sha256:1a2b3c4d" + "0" * 56, "not_found", False, "shot.png")
    assert placeholder(ImageRef(q.attachment_id), q) == '[image unavailable: not_found; "shot.png" (sha256:1a2b3c4d)]'
    nameless = Quarantine(q.attachment_id, "read_failed", True)
    assert placeholder(ImageRef(q.attachment_id), nameless) == "[image unavailable: read_failed (sha256:1a2b3c4d)]"
    quoted = placeholder(ImageRef(q.attachment_id, 'a "b"\n.png'), nameless)
    assert quoted == '[image unavailable: read_failed; "a \\"b\\"\\n.png" (sha256:1a2b3c4d)]'


@pytest.mark.parametrize(
    "url",
    ["attachment:sha256:" + "A" * 64, "attachment:sha256:" + "a" * 63, "attachment:md5:" + "a" * 32,
     "attachment:sha256:" + "a" * 64 + "?other=1", "attachment:sha256:" + "a" * 64 + "?name=a&name=b",
     "attachment:sha256:../../etc/passwd", "attachment:"],
)
def test_malformed_reference_is_invalid_ref(url: str) -> None:
    with pytest.raises(AttachmentError) as info:
        parse_url_ref(url)
    assert info.value.code == INVALID_REF and info.value.status == 400


def test_references_parse_and_foreign_urls_pass() -> None:
    hexd = "0f" * 32
    assert parse_url_ref(f"attachment:sha256:{hexd}?name=a%20b.png") == ImageRef(f"sha256:{hexd}", "a b.png")
    assert parse_url_ref("https://example.com/x.png") is None
    assert parse_url_ref("data:image/png;base64,AAAA") is None
    assert parse_file_id("file-abc") is None
    assert parse_file_id(f"sha256:{hexd}") == ImageRef(f"sha256:{hexd}")


events_strategy = st.lists(
    st.tuples(st.sampled_from(["q", "r"]), st.integers(0, 3), st.sampled_from(["not_found", "corrupt", "read_failed"])),
    max_size=30,
)


@given(events_strategy, st.integers(0, 30))
def test_fold_in_chunks_equals_fold_in_one_go(spec: list[tuple[str, int, str]], cut: int) -> None:
    ids = ["sha256:" + f"{i:02x}" * 32 for i in range(4)]
    events = [
        envelope(n + 1, "t", Quarantine(ids[i], f, f == "read_failed") if kind == "q" else Recovered(ids[i], 1, "image/png", 1, 1))  # type: ignore[arg-type]
        for n, (kind, i, f) in enumerate(spec)
    ]
    whole = fold(events)
    assert fold(events[cut:], fold(events[:cut])) == whole
    assert whole.last_seq == len(events)
    for aid in ids:
        last = [e for e in events if e.data.attachment_id == aid]  # type: ignore[union-attr]
        assert (aid in whole.quarantined) == bool(last and isinstance(last[-1], QuarantineEvent))


def test_fold_rejects_a_gap() -> None:
    with pytest.raises(ValueError):
        fold([envelope(2, "t", Quarantine(MISSING, "corrupt", False))], EMPTY)
