"""Policy semantics (DESIGN.md §1), table-driven, on the in-memory doubles: the table of
``tests/policy_table.py`` (which ``tests/system/test_policy_backends.py`` runs on the embedded and
the replicated backends), placeholder text, reference parsing and the fold."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, strategies as st

from projectionist.policy.errors import INVALID_REF, AttachmentError
from projectionist.policy.events import _ENVELOPES, Quarantine, QuarantineEvent, Recovered, envelope, envelopes
from projectionist.policy.fold import EMPTY, fold, placeholder
from projectionist.policy.model import ImageRef, parse_file_id, parse_url_ref
from projectionist.policy.projection import ProjectionContext, project
from tests.fakes import CountingStore
from tests.memory import MemoryLog, MemoryStore
from tests.policy_table import MISSING, Env
from tests.policy_table import (  # noqa: F401  (the table's tests, collected here on this module's env)
    test_failure_is_quarantined_once_with_the_right_class, test_a_real_missing_object_is_not_found,
    test_second_request_derives_placeholder_from_log_without_reading,
    test_read_failed_then_success_sends_the_image_and_records_nothing,
    test_cancellation_during_first_read_records_nothing, test_cancellation_during_the_retry_records_nothing,
    test_unclassified_error_fails_clearly_and_records_nothing,
    test_several_failures_in_one_request_are_one_atomic_append,
    test_repeated_references_are_all_replaced_and_read_once,
    test_sessionless_fail_raises_the_attachment_error,
    test_sessionless_placeholder_mode_projects_without_recording,
    test_invalid_reference_code_from_store_is_the_clients_error,
    test_fifty_concurrent_requests_make_one_event, test_projection_is_deterministic_for_the_same_log,
    test_recover_requires_a_verified_read_and_appends_once, test_recover_of_a_corrupt_object_is_refused,
    test_recover_of_a_reference_not_quarantined_appends_nothing_and_reads_nothing,
    test_concurrent_recoveries_make_one_event, test_fork_keeps_the_quarantine_state,
)


@pytest.fixture(params=["memory"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    memory_log = MemoryLog()
    yield Env(CountingStore(MemoryStore()), memory_log, lambda: memory_log)


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


class _NoLock:
    """A lock that fails the test when taken: a projection with no reference records nothing."""

    def __call__(self) -> Any:
        raise AssertionError("a projection with no reference took the session's lock")


async def test_a_projection_with_no_reference_gives_the_log_s_state_and_reads_nothing(env: Env) -> None:
    """The state decides what the images a client inlined itself become (``decide.held_inline``):
    it is refreshed from the log unless vouched for, and nothing is read, locked or recorded."""
    aid = "sha256:" + "ab" * 32
    await env.log.append("s-none", None, [Quarantine(aid, "not_found", False)])
    stale = EMPTY
    found = await project([], ProjectionContext(store=env.store, log=env.log, session_id="s-none", state=stale,
                                                lock=_NoLock()))  # type: ignore[arg-type]
    assert found.outcomes == () and found.reads == 0 and found.recorded == ()
    assert found.state.standing(aid, "openai") is not None, "the cached state was not refreshed from the log"
    vouched = await project([], ProjectionContext(store=env.store, log=env.log, session_id="s-none", state=stale,
                                                  fresh=True, lock=_NoLock()))  # type: ignore[arg-type]
    assert vouched.state is stale, "a state the caller vouched for was read again"
    alone = await project([], ProjectionContext(store=env.store, log=None, session_id=None))
    assert alone.state is EMPTY
    assert env.store.reads == {} and len(await env.log.read("s-none")) == 1


async def test_a_projection_gives_one_outcome_per_linked_image_from_the_log_without_reading_it(env: Env) -> None:
    """The images the provider fetches by URL are slots of the request too: ``project`` returns an
    outcome for each (its quarantine's placeholder, or None: as it came), from the refreshed state,
    and never reads, locks or records for them."""
    gone, kept = "sha256:" + "cd" * 32, "sha256:" + "ef" * 32
    await env.log.append("s-links", None, [Quarantine(gone, "not_found", False, "cat.png", url=True, suspects=1)])
    found = await project([], ProjectionContext(
        store=env.store, log=env.log, session_id="s-links", state=EMPTY, upstream_format="openai",
        lock=_NoLock(), links=[ImageRef(kept, "dog.png"), ImageRef(gone, "cat.png")]))  # type: ignore[arg-type]
    assert found.outcomes == () and found.reads == 0 and found.recorded == ()
    assert found.links[0] is None
    assert found.links[1] is not None and found.links[1].failure == "not_found" and "cat.png" in found.links[1].text
    without = await project([], ProjectionContext(store=env.store, log=env.log, session_id="s-links"))
    assert without.links == ()  # no linked image, no outcome
    assert env.store.reads == {} and len(await env.log.read("s-links")) == 1


def test_every_envelope_is_seq_time_data_so_a_batch_is_enveloped_positionally() -> None:
    # ``envelopes`` builds each event positionally (a batch of records makes one per record):
    # an envelope with another field order would put a seq where its time goes.
    for event_type in _ENVELOPES.values():
        assert event_type.__struct_fields__ == ("seq", "time", "data"), event_type
    quarantine = Quarantine(attachment_id="sha256:" + "a" * 64, failure="missing", retryable=False)
    [event] = envelopes(6, "2026-12-07T00:00:00.000Z", [quarantine])
    assert (event.seq, event.time, event.data) == (7, "2026-12-07T00:00:00.000Z", quarantine)
    assert event == envelope(7, "2026-12-07T00:00:00.000Z", quarantine)
