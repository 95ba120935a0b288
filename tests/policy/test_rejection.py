"""Rejections and variants in the pure policy: who the suspects are, what the log says was
accepted, how a rejection folds per format, and the decision table's variant steps."""

from __future__ import annotations

from types import MappingProxyType

import msgspec

from projectionist.policy.decide import Ask, Done, Pin, Progress, Read, Record, Vary, decide
from projectionist.policy.errors import NOT_FOUND, AttachmentError
from projectionist.policy.events import (
    Quarantine,
    Recovered,
    RefRecord,
    Rejected,
    RequestRecorded,
    ResponseRecorded,
    Variant,
    envelope,
)
from projectionist.policy.fold import EMPTY, SessionState, fold
from projectionist.policy.model import ImageRef, Placeholder, Resolved, StoredImage
from projectionist.policy.profile import Profile, Rejection, breaks
from projectionist.policy.rejection import Acceptance, message_digest, quarantines, suspects

A, B, C, V = ("sha256:" + c * 64 for c in "abcd")
PROFILE = Profile("anthropic", ("image/png", "image/jpeg"), max_image_bytes=100, max_side=8000, many_images=2,
                  many_images_max_side=50)


def image(aid: str, size: int = 10, side: int = 10, media_type: str = "image/png") -> StoredImage:
    return StoredImage(aid, media_type, size, side, side, b"x")


def test_a_named_site_is_exact_and_unnamed_means_every_never_accepted_image() -> None:
    carried = [("/messages/0/content/1/image_url/url", A), ("/messages/0/content/2/content/0/source/data", B),
               ("/messages/1/content/0/image_url/url", C), ("/messages/2/content/0/image_url/url", A)]
    assert suspects(Rejection("x", "/messages/0/content/2/content/0"), carried, ()) == (B,)
    assert suspects(Rejection("x", "/messages/0/content/2"), carried, ()) == (B,)  # a part holding it
    assert suspects(Rejection("x", "/messages/0/content/1"), carried, {A}) == ()  # accepted before: never
    assert suspects(Rejection("x", "/messages/9/content/0"), carried, ()) == ()  # names nothing carried
    assert suspects(Rejection("x", "/messages/0/content/10"), carried, ()) == ()  # a prefix is not a parent
    assert suspects(Rejection("x"), carried, {C}) == (A, B)  # each once, in order


def _request(seq: int, rid: str, adapter: str, *refs: tuple[str, str]) -> object:
    return envelope(seq, "t", RequestRecorded(rid, "r", adapter, "u", "POST", "/p", 0, "d", "d",
                                              tuple(RefRecord(f"/{i}", aid, outcome) for i, (aid, outcome) in enumerate(refs))))


def test_accepted_images_are_the_inlined_refs_of_successful_calls_of_the_same_format() -> None:
    fmt = {"openai_chat": "openai", "anthropic_messages": "anthropic"}.get
    events = [
        _request(1, "r1", "openai_chat", (A, "inlined"), (B, "placeholder")),
        envelope(2, "t", ResponseRecorded("r1", 1, 200, 1.0)),
        _request(3, "r2", "anthropic_messages", (C, "inlined")),
        envelope(4, "t", ResponseRecorded("r2", 3, 200, 1.0)),
        _request(5, "r3", "openai_chat", (C, "inlined")),
        envelope(6, "t", ResponseRecorded("r3", 5, 400, 1.0)),  # refused: accepted nothing
        _request(7, "r4", "openai_chat", (V, "inlined")),
        envelope(8, "t", ResponseRecorded("r4", 0, 200, 1.0)),  # same append: joined by id
    ]
    for upstream_format, expected in (("openai", {A, V}), ("anthropic", {C})):
        folded = Acceptance(upstream_format, fmt)
        folded.add(events[:3])  # folded as the events come: a response may follow in a later read
        folded.add(events[3:])  # type: ignore[arg-type]
        assert folded.accepted == expected


def test_a_call_recorded_in_one_row_counts_by_the_outcome_it_carries() -> None:
    fmt = {"openai_chat": "openai"}.get

    def whole(seq: int, rid: str, status: int, aid: str) -> object:
        request = _request(seq, rid, "openai_chat", (aid, "inlined")).data  # type: ignore[attr-defined]
        return envelope(seq, "t", msgspec.structs.replace(request, response=ResponseRecorded(rid, 0, status, 1.0)))

    folded = Acceptance("openai", fmt)
    folded.add([whole(1, "r1", 200, A), whole(2, "r2", 400, B),  # type: ignore[list-item]
                _request(3, "r3", "openai_chat", (C, "inlined"))])  # still running: no outcome yet
    assert folded.accepted == {A}
    folded.add([envelope(4, "t", ResponseRecorded("r3", 3, 200, 1.0))])
    assert folded.accepted == {A, C}


def test_a_rejection_holds_for_its_format_and_recovery_lifts_all_of_an_images_quarantines() -> None:
    [rejected] = quarantines(Rejection("Could not process image"), [A], "anthropic", {A: "a.png"})
    assert rejected == Rejected(A, "anthropic", 1, message_digest("Could not process image"), "a.png")
    state = fold([envelope(1, "t", rejected), envelope(2, "t", Quarantine(B, "not_found", False))])
    assert state.standing(A, "anthropic") == rejected
    assert state.standing(A, "openai") is None and state.standing(A, None) is None
    assert state.standing(B, "openai") is not None  # a store failure holds everywhere
    refs = [ImageRef(A)]
    assert decide(Ask(refs, recording=True, upstream_format="openai"), Progress(state)) == Read((A,))
    step = decide(Ask(refs, recording=True, upstream_format="anthropic"), Progress(state))
    assert step == Done((Placeholder("rejected", f'[image unavailable: rejected; "a.png" ({A[:15]})]'),))
    lifted = fold([envelope(3, "t", Recovered(A, 1, "image/png", 1, 1))], state)
    assert lifted.standing(A, "anthropic") is None and not lifted.rejected


def test_an_image_that_breaks_the_profile_is_varied_then_pinned_then_sent_as_its_variant() -> None:
    big = image(A, size=500)
    refs = [ImageRef(A)]
    assert breaks(PROFILE, "image/png", 500, 10, 10) == "bytes"
    ask = Ask(refs, recording=True, profile=PROFILE)
    step = decide(ask, Progress(EMPTY, {A: big}))
    assert step == Vary((big,), PROFILE, 1)
    pin = Variant(A, PROFILE.target(1), V, "image/png", 50, 10, 10, "v1")
    results = {A: big, V: image(V, 50)}
    assert decide(ask, Progress(EMPTY, results, made={A: pin})) == Pin((pin,))
    pinned = SessionState(1, variants=MappingProxyType({(A, pin.target): pin}))
    # pinned: the variant is read instead of the original
    assert decide(ask, Progress(pinned)) == Read((V,))
    assert decide(ask, Progress(pinned, {V: image(V, 50)})) == Done((Resolved(image(V, 50)),))
    # a pin that will not read falls back to the original, which is varied again; never quarantined
    gone = {V: AttachmentError(NOT_FOUND)}
    assert decide(ask, Progress(pinned, gone)) == Read((A,))
    assert decide(ask, Progress(pinned, {**gone, A: big})) == Vary((big,), PROFILE, 1)


def test_a_fitting_image_is_sent_as_it_is_and_one_without_a_variant_too() -> None:
    refs = [ImageRef(A)]
    ask = Ask(refs, recording=True, profile=PROFILE)
    assert decide(ask, Progress(EMPTY, {A: image(A)})) == Done((Resolved(image(A)),))
    big = image(A, size=500)
    assert decide(ask, Progress(EMPTY, {A: big}, made={A: None})) == Done((Resolved(big),))


def test_the_many_image_rule_is_its_own_target() -> None:
    assert PROFILE.target(2) == "anthropic@8000" and PROFILE.target(3) == "anthropic@50"
    wide = image(A, side=60)
    refs = [ImageRef(A), ImageRef(B), ImageRef(C)]
    step = decide(Ask(refs, recording=True, profile=PROFILE), Progress(EMPTY, {A: wide, B: image(B), C: image(C)}))
    assert step == Vary((wide,), PROFILE, 3)
    assert decide(Ask(refs[:1], recording=True, profile=PROFILE), Progress(EMPTY, {A: wide})) == Done((Resolved(wide),))


def test_a_store_failure_of_the_original_is_still_a_quarantine_with_a_profile() -> None:
    ask = Ask([ImageRef(A)], recording=True, profile=PROFILE)
    step = decide(ask, Progress(EMPTY, {A: AttachmentError(NOT_FOUND)}))
    assert step == Record((Quarantine(A, "not_found", retryable=False),))
