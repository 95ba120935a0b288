"""Checkpoints and the state fold (policy layer, pure): folding from the latest checkpoint and the
state events after it gives the state of folding the whole log from scratch, whatever the mix of
records, quarantines, recoveries, forks, unknown types and checkpoints, and wherever a cached
fold stops."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from projectionist.policy.events import (
    RECORD_TYPES,
    Checkpoint,
    CheckpointEvent,
    Event,
    EventData,
    Forked,
    Quarantine,
    Recovered,
    Rejected,
    RequestEvent,
    RequestRecorded,
    ResponseEvent,
    ResponseRecorded,
    UnknownEvent,
    Variant,
    decode_event,
    encode_event,
    envelope,
)
from projectionist.policy.fold import (
    CHECKPOINT_EVERY,
    EMPTY,
    SessionState,
    checkpoint_due,
    checkpoint_of,
    fold,
    fold_states,
)

IDS = ["sha256:" + f"{i:02x}" * 32 for i in range(5)]

#: One step of a session: a kind and its parameters; "c" asks for a checkpoint of the fold so far.
steps = st.lists(
    st.tuples(st.sampled_from(["q", "r", "rec", "req", "rec", "fork", "unknown", "c", "rj", "v"]), st.integers(0, 4),
              st.sampled_from(["not_found", "corrupt", "read_failed"])),
    max_size=60,
)


def _data(kind: str, index: int, failure: str) -> EventData:
    if kind == "q":
        return Quarantine(IDS[index], failure, failure == "read_failed", name=f"n{index}.png")  # type: ignore[arg-type]
    if kind == "r":
        return Recovered(IDS[index], 1, "image/png", 1, 1)
    if kind == "rj":  # a rejection, for one of two formats (picked by the failure drawn)
        fmt = "openai" if failure == "corrupt" else "anthropic"
        return Rejected(IDS[index], fmt, 1, "sha256:" + "0" * 64)
    if kind == "v":  # a variant pin, for one of two targets, re-pinned to another object now and then
        target = "anthropic@2000" if failure == "corrupt" else "openai@any"
        return Variant(IDS[index], target, IDS[(index + len(failure)) % 5], "image/png", 9, 2, 2, "v1")
    if kind == "fork":
        return Forked("parent", index)
    if kind == "req":
        return RequestRecorded(f"r{index}", "openai_chat", "openai_chat", "openai", "POST", "/v1/chat/completions",
                               0, "sha256:" + "1" * 64, "sha256:" + "1" * 64)
    return ResponseRecorded(request_id=f"r{index}", request_seq=1, status=200, latency_ms=1.0)


def build(spec: list[tuple[str, int, str]], checkpoints: bool) -> list[Event]:
    """The session the steps describe, each event at its own time; with ``checkpoints`` each "c"
    appends the checkpoint of the fold so far (as ``CachedLog`` would), else it is skipped."""
    events: list[Event] = []
    for step, (kind, index, failure) in enumerate(spec):
        seq, time = len(events) + 1, f"2024-01-01T00:{step // 60:02d}:{step % 60:02d}.000Z"
        if kind == "c":
            if checkpoints:
                events.append(envelope(seq, time, checkpoint_of(fold(events))))
        elif kind == "unknown":
            events.append(UnknownEvent(seq, "future/state", time, msgspec.Raw(b"{}")))
        else:
            events.append(envelope(seq, time, _data(kind, index, failure)))
    return events


def state_read(events: list[Event], after_seq: int) -> list[Event]:
    """What a backend's ``read_state`` returns past ``after_seq``: no records, from the latest
    checkpoint on."""
    states = [e for e in events if e.seq > after_seq and not isinstance(e, (RequestEvent, ResponseEvent))]
    marks = [i for i, e in enumerate(states) if isinstance(e, CheckpointEvent)]
    return states[marks[-1]:] if marks else states


def same_quarantines(a: SessionState, b: SessionState) -> bool:
    return (dict(a.quarantined) == dict(b.quarantined) and dict(a.since) == dict(b.since)
            and dict(a.rejected) == dict(b.rejected) and dict(a.variants) == dict(b.variants))


@settings(max_examples=300)
@given(steps, st.integers(0, 60))
def test_folding_from_the_latest_checkpoint_equals_folding_from_scratch(
        spec: list[tuple[str, int, str]], cut: int) -> None:
    events = build(spec, checkpoints=True)
    whole = fold(events)
    last = len(events)
    # A cold fold: the latest checkpoint and the state events after it.
    assert fold_states(state_read(events, 0), last) == whole
    # A cached fold that stopped anywhere, refreshed by a state read past it.
    cut = min(cut, last)
    cached = fold(events[:cut])
    assert fold_states(state_read(events, cut), last, cached) == whole
    # The same session never checkpointed holds the same quarantines, since-times included.
    plain = fold(build(spec, checkpoints=False))
    assert same_quarantines(whole, plain)
    assert whole.last_seq == last


@given(steps)
def test_a_checkpoint_restates_the_fold_and_round_trips_as_json(spec: list[tuple[str, int, str]]) -> None:
    state = fold(build(spec, checkpoints=True))
    marker = envelope(state.last_seq + 1, "2030-01-01T00:00:00.000Z", checkpoint_of(state))
    assert decode_event(encode_event(marker)) == marker
    after = fold([marker], state)
    assert same_quarantines(after, state)
    assert list(after.quarantined) == list(state.quarantined)  # fold order kept
    assert after.unsaved == 0
    assert isinstance(marker.data, Checkpoint) and marker.data.state_seq == state.last_seq


def test_unsaved_counts_state_events_only_and_a_checkpoint_resets_it() -> None:
    events = build([("q", 0, "corrupt"), ("rec", 0, ""), ("fork", 1, ""), ("unknown", 0, ""), ("rec", 1, ""),
                    ("r", 0, "")], checkpoints=True)
    assert "response/recorded" in RECORD_TYPES
    assert fold(events).unsaved == 4  # quarantine, fork, unknown, recovered; not the records
    events = build([("q", 0, "corrupt"), ("c", 0, ""), ("q", 1, "corrupt"), ("rec", 0, "")], checkpoints=True)
    assert fold(events).unsaved == 1


@pytest.mark.parametrize("kind", sorted(RECORD_TYPES))
def test_records_count_for_nothing_whether_this_version_decoded_them_or_not(kind: str) -> None:
    """Records, as their own classes or as ``UnknownEvent`` of a record type, change no state and
    leave ``unsaved`` as it was; an unknown type that is no record counts."""
    events = build([("q", 0, "corrupt"), ("req", 1, ""), ("rec", 1, "")], checkpoints=True)
    assert [type(e) for e in events[1:]] == [RequestEvent, ResponseEvent]
    events.append(UnknownEvent(4, kind, "2024-01-01T00:01:00.000Z", msgspec.Raw(b"{}")))
    state = fold(events)
    assert state.unsaved == 1 and state.last_seq == 4 and list(state.quarantined) == [IDS[0]]
    assert fold(events[1:], fold(events[:1])) == state
    assert fold([UnknownEvent(5, "future/state", "t", msgspec.Raw(b"{}"))], state).unsaved == 2


def test_a_checkpoint_is_due_every_k_state_events_and_never_more_often_than_its_size() -> None:
    assert not checkpoint_due(SessionState(unsaved=CHECKPOINT_EVERY - 1))
    assert checkpoint_due(SessionState(unsaved=CHECKPOINT_EVERY))
    assert checkpoint_due(SessionState(unsaved=3), every=3)
    many = {f"sha256:{i:064x}": Quarantine(f"sha256:{i:064x}", "not_found", False) for i in range(20)}
    big = SessionState(unsaved=3, quarantined=many)
    assert not checkpoint_due(big, every=3)  # a checkpoint of 20 entries waits for 20 / 4 state events
    assert checkpoint_due(msgspec.structs.replace(big, unsaved=5), every=3)


def test_fold_states_refuses_events_out_of_order_or_past_the_last_seq() -> None:
    q = Quarantine(IDS[0], "corrupt", False)
    with pytest.raises(ValueError):
        fold_states([envelope(3, "t", q), envelope(2, "t", q)], 5)
    with pytest.raises(ValueError):
        fold_states([envelope(6, "t", q)], 5)
    with pytest.raises(ValueError):
        fold_states([envelope(2, "t", q)], 5, SessionState(last_seq=2))
    assert fold_states([], 7, EMPTY).last_seq == 7
    assert fold_states([], 1, SessionState(last_seq=4)).last_seq == 4  # a read behind the cache keeps it
