"""``decide``: the projection's next step from what is known, as a table, and the probe's clock (pure: no store, no log)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from projectionist.policy.errors import CORRUPT, INVALID_REF, NOT_FOUND, READ_FAILED, AttachmentError
from projectionist.policy.events import Quarantine
from projectionist.policy.fold import EMPTY, SessionState
from projectionist.policy.model import ImageRef, Resolved, StoredImage, Placeholder
from projectionist.policy.decide import Ask, Done, Fail, Lift, Progress, Read, Record, decide

A, B, C = ("sha256:" + c * 64 for c in "abc")


def image(aid: str) -> StoredImage:
    return StoredImage(aid, "image/png", 1, 1, 1, b"x")


def quarantined(*quarantines: Quarantine) -> SessionState:
    return SessionState(len(quarantines), MappingProxyType({q.attachment_id: q for q in quarantines}))


GONE_A = Quarantine(A, "not_found", retryable=False, name="a.png")


def test_nothing_read_yet_reads_each_unquarantined_id_once_in_order() -> None:
    refs = [ImageRef(B), ImageRef(A), ImageRef(B), ImageRef(C)]
    state = quarantined(Quarantine(C, "corrupt", retryable=False))
    assert decide(Ask(refs, recording=True), Progress(state)) == Read((B, A))


def test_every_read_verified_is_done_with_the_images() -> None:
    step = decide(Ask([ImageRef(A), ImageRef(A)], recording=True), Progress(EMPTY, {A: image(A)}))
    assert step == Done((Resolved(image(A)), Resolved(image(A))))


@pytest.mark.parametrize(("code", "failure", "retryable"), [(NOT_FOUND, "not_found", False),
                                                            (CORRUPT, "corrupt", False),
                                                            (READ_FAILED, "read_failed", True)])
def test_a_failed_read_with_a_session_is_recorded_with_the_first_name_given(
        code: str, failure: str, retryable: bool) -> None:
    refs = [ImageRef(A), ImageRef(A, "shot.png"), ImageRef(A, "other.png")]
    step = decide(Ask(refs, recording=True), Progress(EMPTY, {A: AttachmentError(code)}))
    assert step == Record((Quarantine(A, failure, retryable=retryable, name="shot.png"),))  # type: ignore[arg-type]


def test_without_a_session_a_failure_fails_the_request_by_default() -> None:
    error = AttachmentError(NOT_FOUND)
    assert decide(Ask([ImageRef(A)], recording=False), Progress(EMPTY, {A: error})) == Fail(error)


def test_without_a_session_the_placeholder_policy_projects_without_recording() -> None:
    ask = Ask([ImageRef(A, "a.png"), ImageRef(B)], recording=False, sessionless="placeholder")
    step = decide(ask, Progress(EMPTY, {A: AttachmentError(NOT_FOUND), B: image(B)}))
    assert step == Done((Placeholder("not_found", '[image unavailable: not_found; "a.png" (sha256:aaaaaaaa)]'),
                         Resolved(image(B))))


def test_a_bad_reference_fails_even_with_a_session() -> None:
    error = AttachmentError(INVALID_REF)
    step = decide(Ask([ImageRef(A), ImageRef(B)], recording=True), Progress(EMPTY, {A: image(A), B: error}))
    assert step == Fail(error)


def test_a_quarantined_reference_is_a_placeholder_and_never_read() -> None:
    step = decide(Ask([ImageRef(A), ImageRef(B)], recording=True), Progress(quarantined(GONE_A), {B: image(B)}))
    assert step == Done((Placeholder("not_found", '[image unavailable: not_found; "a.png" (sha256:aaaaaaaa)]'),
                         Resolved(image(B))))


def test_a_failure_someone_else_already_recorded_is_not_recorded_again() -> None:
    # the log now holds A's quarantine: the stale read result no longer matters
    step = decide(Ask([ImageRef(A)], recording=True), Progress(quarantined(GONE_A), {A: AttachmentError(NOT_FOUND)}))
    assert isinstance(step, Done) and isinstance(step.outcomes[0], Placeholder)


def test_a_due_probe_of_a_retryable_quarantine_is_read_then_lifted_if_it_verifies() -> None:
    flaky = Quarantine(A, "read_failed", retryable=True)
    state = quarantined(flaky)
    ask, due = Ask([ImageRef(A)], recording=True), frozenset({A})
    assert decide(ask, Progress(state, due=due)) == Read((A,))
    assert decide(ask, Progress(state, {A: image(A)}, due=due)) == Lift((image(A),))
    failed = decide(ask, Progress(state, {A: AttachmentError(READ_FAILED)}, due=due))
    assert isinstance(failed, Done) and isinstance(failed.outcomes[0], Placeholder)  # nothing new recorded
    # not due: never read
    assert isinstance(decide(ask, Progress(state)), Done)


def test_the_prober_waits_its_period_and_never_probes_what_cannot_come_back() -> None:
    from datetime import UTC, datetime, timedelta

    from projectionist.policy.probe import Prober

    clock = [datetime(2026, 1, 1, tzinfo=UTC)]
    ticks = [0.0]
    prober = Prober(300, now=lambda: clock[0], monotonic=lambda: ticks[0])
    flaky, gone = Quarantine(A, "read_failed", retryable=True), Quarantine(B, "not_found", retryable=False)
    state = SessionState(2, MappingProxyType({A: flaky, B: gone}),
                         MappingProxyType({A: "2026-01-01T00:00:00.000Z", B: "2026-01-01T00:00:00.000Z"}))
    assert prober.due(state, [A, B]) == frozenset()
    clock[0] += timedelta(seconds=300)
    assert prober.due(state, [A, B]) == {A}  # not_found is never probed
    prober.failed(A)
    ticks[0] += 299
    assert prober.due(state, [A]) == frozenset()  # another full period after a failed probe
    ticks[0] += 1
    assert prober.due(state, [A]) == {A}
    assert Prober(0).due(state, [A]) == frozenset()  # 0 turns probing off
