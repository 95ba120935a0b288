"""The failure table (``policy/failures.py``): one row per kind, the Literals and the attachment
codes agree with it, each fact its rows state is what the code does (and is read from the row),
and a kind a newer version recorded reads as ``unavailable`` rather than a corrupt log."""

from __future__ import annotations

from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import get_args

import msgspec
import pytest

from projectionist.policy import failures
from projectionist.policy.budget import within
from projectionist.policy.decide import Ask, Done, Progress, Read, Record, decide
from projectionist.policy.errors import ATTACHMENT_CODES, INVALID_REF, AttachmentError
from projectionist.policy.events import (QUARANTINE, REJECTED, Learnt, Quarantine, QuarantineEvent, Rejected,
                                         decode_event, encode_event, envelope, event_type)
from projectionist.policy.failures import (BY_CODE, FAILURES, LASTING, NO_IMAGE, UNAVAILABLE, Failure, Kind,
                                           StoreFailure, Unfetched, of)
from projectionist.policy.fold import EMPTY, SessionState, checkpoint_of, fold, placeholder_text
from projectionist.policy.model import ImageFacts, ImageRef, Inlined, Placeholder, Resolved, StoredImage
from projectionist.policy.probe import Prober
from projectionist.policy.profile import Profile, Rejection
from projectionist.policy.reads import read_many
from projectionist.policy.rejection import unfetched
from projectionist.policy.transitions import lift
from tests.memory import MemoryLog

A, B = ("sha256:" + c * 64 for c in "ab")
THEN = datetime(2026, 1, 1, tzinfo=UTC)
#: A kind a newer version may record; this one has no row for it.
FUTURE = "some_future_kind"
#: Every kind an ``attachment/quarantine`` event carries, spelled as it is written.
QUARANTINED = [row.name if row is not UNAVAILABLE else FUTURE for row in FAILURES.values()
               if row.event == QUARANTINE]


def image(aid: str) -> StoredImage:
    return StoredImage(aid, "image/png", 1, 1, 1, b"x")


def held(*quarantines: Quarantine) -> SessionState:
    return fold([envelope(n, THEN.isoformat(), q) for n, q in enumerate(quarantines, 1)])


def swapped(monkeypatch: pytest.MonkeyPatch, name: str, **facts: object) -> None:
    """The table with one row's facts changed, where every reader looks it up."""
    row = FAILURES[name]._replace(**facts)
    monkeypatch.setattr(failures, "FAILURES", MappingProxyType({**FAILURES, name: row}))
    if row.code is not None:
        monkeypatch.setattr(failures, "BY_CODE", MappingProxyType({**BY_CODE, row.code: row}))


# --- one source ---------------------------------------------------------------------------------

def test_every_failure_value_has_exactly_one_row_and_each_literal_names_its_rows() -> None:
    assert list(FAILURES) == list(get_args(Failure))  # the same kinds, in the same order, each once
    assert len(failures._ROWS) == len(FAILURES) and all(FAILURES[row.name] is row for row in failures._ROWS)
    assert set(get_args(StoreFailure)) == {row.name for row in FAILURES.values() if row.code is not None}
    assert set(get_args(Unfetched)) == {row.name for row in FAILURES.values() if row.fetched}
    assert [row.name for row in FAILURES.values() if row.inline] == [NO_IMAGE.name] == ["corrupt"]


def test_the_import_check_names_a_table_that_drifted(monkeypatch: pytest.MonkeyPatch) -> None:
    failures._table_agrees()
    monkeypatch.setattr(failures, "_ROWS", failures._ROWS[:-1])  # ``unavailable`` dropped: Failure names it
    with pytest.raises(AssertionError, match="unavailable"):
        failures._table_agrees()
    monkeypatch.setattr(failures, "_ROWS", (*failures._ROWS, FAILURES["unavailable"]._replace(probed=True)))
    with pytest.raises(AssertionError, match="probed but not retryable"):
        failures._table_agrees()


def test_the_store_failures_are_the_attachment_codes_and_answer_as_retryable_as_their_rows() -> None:
    assert set(BY_CODE) == ATTACHMENT_CODES - {INVALID_REF}
    for code, row in BY_CODE.items():
        assert AttachmentError(code).retryable is row.retryable
    assert LASTING == {code for code, row in BY_CODE.items() if not row.retryable}


# --- each fact is what the code does --------------------------------------------------------------

@pytest.mark.parametrize("code", sorted(BY_CODE))
def test_a_failed_read_is_recorded_as_its_row_says(code: str) -> None:
    row = BY_CODE[code]
    step = decide(Ask([ImageRef(A, "a.png")], recording=True), Progress(EMPTY, {A: AttachmentError(code)}))
    assert step == Record((Quarantine(A, row.name, retryable=row.retryable, name="a.png"),))
    assert step.quarantines[0].kind == row.name


class _Failing:
    """A store whose every read fails with one code."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.reads = 0

    async def read_image(self, attachment_id: str) -> StoredImage:
        self.reads += 1
        raise AttachmentError(self.code, attachment_id=attachment_id)


@pytest.mark.parametrize("code", sorted(BY_CODE))
async def test_only_a_retryable_failure_is_read_again_at_once(code: str) -> None:
    store = _Failing(code)
    (result, count), = (await read_many(store, [A], 1)).values()
    assert isinstance(result, AttachmentError) and result.code == code
    assert count == store.reads == (2 if BY_CODE[code].retryable else 1)


@pytest.mark.parametrize("failure", QUARANTINED)
def test_a_quarantine_is_probed_exactly_when_its_row_says(failure: str) -> None:
    """Each written ``retryable``: the row decides (a newer kind's is never probed)."""
    state = held(Quarantine(A, failure, retryable=True))
    prober = Prober(60, now=lambda: THEN + timedelta(hours=1))
    assert (prober.due(state, [A]) == {A}) is of(failure).probed
    assert state.quarantined[A].probed is of(failure).probed


async def test_the_prober_and_the_lift_read_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swap a row's fact, and what the probe and the lift do follows it."""
    log = MemoryLog()
    await log.append("s", 0, [Quarantine(A, "not_found", retryable=True)])
    state = fold(await log.read("s"))
    prober = Prober(60, now=lambda: THEN + timedelta(hours=1))
    assert prober.due(held(Quarantine(A, "not_found", retryable=True)), [A]) == frozenset()
    assert (await lift(log, "s", state, [image(A)], nullcontext()))[1] == ()
    swapped(monkeypatch, "not_found", retryable=True, probed=True)
    assert prober.due(held(Quarantine(A, "not_found", retryable=True)), [A]) == {A}
    assert (await lift(log, "s", state, [image(A)], nullcontext()))[1] == (A,)


@pytest.mark.parametrize("code", sorted(BY_CODE))
async def test_the_immediate_retry_reads_the_table(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    row = BY_CODE[code]
    swapped(monkeypatch, row.name, retryable=not row.retryable)
    store = _Failing(code)
    await read_many(store, [A], 1)
    assert store.reads == (1 if row.retryable else 2)


def _holds_for_the_session(failure: str) -> None:
    state = held(Quarantine(A, failure, retryable=False, name="a.png"))
    for fmt in ("openai", "anthropic", None):
        step = decide(Ask([ImageRef(A)], recording=True, upstream_format=fmt), Progress(state))
        assert isinstance(step, Done) and step.outcomes[0] == Placeholder(
            of(failure).name, f'[image unavailable: {of(failure).name}; "a.png" (sha256:aaaaaaaa)]')


def _holds_for_the_format(failure: str) -> None:
    state = fold([envelope(1, "t", Rejected(A, "openai", 1, "sha256:0"))])
    assert state.standing(A, "openai") is not None and state.standing(A, "anthropic") is None
    refused = decide(Ask([ImageRef(A)], recording=True, upstream_format="openai"), Progress(state))
    assert isinstance(refused, Done) and refused.outcomes[0] == Placeholder(
        "rejected", placeholder_text(ImageRef(A), failure))  # type: ignore[arg-type]
    assert decide(Ask([ImageRef(A)], recording=True, upstream_format="anthropic"), Progress(state)) == Read((A,))


def _holds_for_the_model(failure: str) -> None:
    state = fold([envelope(1, "t", Learnt("up", "m", "no_images"))])
    there = decide(Ask([ImageRef(A)], recording=True, upstream="up", model="m"), Progress(state))
    assert isinstance(there, Done) and there.outcomes[0] == Placeholder(
        "unsupported", placeholder_text(ImageRef(A), failure))  # type: ignore[arg-type]
    assert decide(Ask([ImageRef(A)], recording=True, upstream="up", model="other"), Progress(state)) == Read((A,))
    assert decide(Ask([ImageRef(A)], recording=True, upstream="other", model="m"), Progress(state)) == Read((A,))


def _holds_for_the_request(failure: str) -> None:
    one = Profile("p", ("image/png",), max_images=1)
    facts = ImageFacts("image/png", 10, 1, 1)
    images = [Inlined(A, facts), Inlined(B, facts)]
    assert within(one, 0, 2, (), images, [None, None]) == (
        Placeholder("over_limit", placeholder_text(ImageRef(A), failure)), None)  # type: ignore[arg-type]
    assert within(one, 0, 1, (), images[:1], [None]) == (None,)  # the next request that fits: the image again


HOLDS = {"session": _holds_for_the_session, "format": _holds_for_the_format, "model": _holds_for_the_model,
         "request": _holds_for_the_request}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_each_kind_holds_for_what_its_row_says(failure: str) -> None:
    row = FAILURES[failure]
    HOLDS[row.holds](failure if row is not UNAVAILABLE else FUTURE)


@pytest.mark.parametrize("failure", list(FAILURES))
def test_each_recorded_kind_is_carried_by_its_event_and_the_others_by_none(failure: str) -> None:
    row = FAILURES[failure]
    assert (failures.QUARANTINE_EVENT, failures.REJECTED_EVENT) == (QUARANTINE, REJECTED)
    if row.event == QUARANTINE:
        assert event_type(Quarantine(A, failure, row.retryable)) == row.event
    elif row.event == REJECTED:
        assert Rejected(A, "openai", 1, "sha256:0").kind == failure and row.event == event_type(
            Rejected(A, "openai", 1, "sha256:0"))
        assert Rejected(A, "openai", 1, "sha256:0").retryable is row.retryable
    else:
        assert row.holds in ("model", "request")  # derived from the state and the request each time


@pytest.mark.parametrize("failure", ["rejected", *get_args(Unfetched)])
def test_a_could_not_fetch_answer_is_recorded_only_as_a_fetched_kind(failure: str) -> None:
    rejection = Rejection("could not fetch", failure=failure)  # type: ignore[arg-type]
    row = FAILURES[failure]
    if not row.fetched:
        with pytest.raises(ValueError):
            unfetched(rejection, [A], {})
        return
    assert unfetched(rejection, [A], {A: "cat.png"}) == (
        Quarantine(A, failure, row.retryable, "cat.png", url=True, suspects=1),)


def test_bytes_a_client_inlined_that_are_no_image_are_quarantined_as_the_inline_kind() -> None:
    ask = Ask([], recording=True, upstream_format="openai", profile=Profile("p", ("image/png",)),
              inline=[Inlined(A, ImageFacts(None, 9))])
    assert decide(ask, Progress(EMPTY)) == Record((Quarantine(A, NO_IMAGE.name, NO_IMAGE.retryable, inline=True),))


@pytest.mark.parametrize("failure", [*FAILURES, FUTURE])
def test_the_placeholder_names_the_row(failure: str) -> None:
    shown = of(failure).name
    assert placeholder_text(ImageRef(A), of(failure).name) == f"[image unavailable: {shown} (sha256:aaaaaaaa)]"
    assert shown == (failure if failure in FAILURES else "unavailable")


# --- a newer version's kind ----------------------------------------------------------------------

def raw_quarantine(seq: int, failure: str, retryable: bool = True, name: str = "a.png") -> bytes:
    """An ``attachment/quarantine`` event as a newer replica writes it."""
    return (b'{"type":"attachment/quarantine","seq":%d,"time":"2026-01-01T00:00:00.000Z","data":{"attachment_id":"%s",'
            b'"failure":"%s","retryable":%s,"name":"%s"}}') % (seq, A.encode(), failure.encode(),
                                                               b"true" if retryable else b"false", name.encode())


def test_an_older_reader_tolerates_a_kind_a_newer_version_recorded() -> None:
    """It decodes (no LOG_CORRUPT), is kept as written, and reads as ``unavailable``: the generic
    placeholder, never probed or lifted by a probe though the newer version called it retryable."""
    raw = raw_quarantine(1, FUTURE)
    event = decode_event(raw)
    assert isinstance(event, QuarantineEvent) and event.data.failure == FUTURE and event.data.kind == "unavailable"
    assert encode_event(event) == raw  # kept as written, byte for byte
    state = fold([event])
    assert Prober(60, now=lambda: THEN + timedelta(hours=1)).due(state, [A]) == frozenset()
    step = decide(Ask([ImageRef(A), ImageRef(B)], recording=True, upstream_format="openai"),
                  Progress(state, {B: image(B)}))
    assert step == Done((Placeholder("unavailable", '[image unavailable: unavailable; "a.png" (sha256:aaaaaaaa)]'),
                         Resolved(image(B))))
    # a checkpoint this version writes restates it unchanged, for the newer replica to read
    checkpoint = checkpoint_of(state)
    assert checkpoint.quarantined[0].quarantine.failure == FUTURE
    again = decode_event(encode_event(envelope(2, "t", checkpoint)))
    assert fold([again], state).quarantined[A] == event.data


def test_a_newer_kind_decodes_as_fast_and_every_known_one_encodes_as_before() -> None:
    decoder = msgspec.json.Decoder(Quarantine)
    for failure in get_args(StoreFailure):
        written = Quarantine(A, failure, FAILURES[failure].retryable)
        raw = b'{"attachment_id":"%s","failure":"%s","retryable":%s}' % (
            A.encode(), failure.encode(), b"true" if FAILURES[failure].retryable else b"false")
        assert msgspec.json.encode(written) == raw and decoder.decode(raw) == written
    with pytest.raises(msgspec.ValidationError):  # a missing field is still a damaged event
        decoder.decode(b'{"attachment_id":"%s","retryable":false}' % A.encode())


def test_a_row_the_table_lacks_is_unavailable_and_kind_is_total() -> None:
    assert of(FUTURE) is UNAVAILABLE and of("") is UNAVAILABLE
    assert all(of(name) is row for name, row in FAILURES.items())
    assert isinstance(UNAVAILABLE, Kind) and not UNAVAILABLE.retryable and not UNAVAILABLE.probed
