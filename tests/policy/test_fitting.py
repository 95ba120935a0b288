"""Fitting the images a client inlines, the rules refusals teach, and settling a refusal by evidence,
as tables (pure: no store, no log)."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from projectionist.adapters import anthropic_messages, openai_chat
from projectionist.policy.decide import Ask, Done, Pin, Progress, Read, Record, Vary, at_once, decide
from projectionist.policy.events import Learnt, LearntEvent, Quarantine, Rejected, RejectedEvent, Variant
from projectionist.policy.evidence import MAX_CALLS, Evidence, Probe, Settle, Unproven
from projectionist.policy.fold import EMPTY, SessionState, assuming, checkpoint_of, fold
from projectionist.policy.model import ImageFacts, ImageRef, Inlined, Placeholder, Resolved, Respelled, StoredImage
from projectionist.policy.profile import Rejection, takes_images, under
from projectionist.policy.rejection import learnt, stands

A, B, V = ("sha256:" + c * 64 for c in "abf")
PROFILE = anthropic_messages.PROFILE
PNG = ImageFacts("image/png", 1000, 2400, 1400)


def inline(aid: str = A, facts: ImageFacts = PNG, form: str = "") -> Inlined:
    return Inlined(aid, facts, form)


def ask(*images: Inlined, count: int = 1, refs: tuple[ImageRef, ...] = (), **kw: object) -> Ask:
    target: dict[str, object] = {"upstream": "anthropic", "model": "m", **kw}
    return Ask(list(refs), recording=True, upstream_format="anthropic", profile=PROFILE, images=count,
               inline=list(images), **target)  # type: ignore[arg-type]


def stored(aid: str, side: int) -> StoredImage:
    return StoredImage(aid, "image/png", 100, side, side * 7 // 12, b"x")


def with_variant(variant: Variant, state: SessionState = EMPTY) -> SessionState:
    return SessionState(state.last_seq + 1, variants=MappingProxyType({(variant.attachment_id, variant.target): variant}))


PIN = Variant(A, "anthropic@2000", V, "image/png", 90, 2000, 1166, "v1")


def test_an_image_that_fits_goes_as_it_came() -> None:
    assert decide(ask(inline()), Progress(EMPTY)) == Done((), (None,))


def test_a_mislabelled_image_that_fits_goes_respelled_under_its_true_type() -> None:
    step = decide(ask(inline(form="labelled image/jpeg"), inline(form="non-canonical base64")), Progress(EMPTY))
    assert step == Done((), (Respelled("image/png"), Respelled("image/png")))


def test_over_the_many_image_rule_it_is_read_from_the_request_varied_and_pinned() -> None:
    first = ask(inline(), count=21)
    assert decide(first, Progress(EMPTY)) == Read((A,))
    original = stored(A, 2400)
    step = decide(first, Progress(EMPTY, {A: original}))
    assert step == Vary((original,), PROFILE, 21)
    made = Progress(EMPTY, {A: original, V: stored(V, 2000)}, made={A: PIN})
    assert decide(first, made) == Pin((PIN,))
    pinned = Progress(with_variant(PIN), {A: original, V: stored(V, 2000)}, made={A: PIN})
    assert decide(first, pinned) == Done((), (Resolved(stored(V, 2000)),))


def test_a_pinned_variant_is_read_instead_of_the_original() -> None:
    state = with_variant(PIN)
    assert decide(ask(inline(), count=21), Progress(state)) == Read((V,))
    assert decide(ask(inline(), count=21), Progress(state, {V: stored(V, 2000)})) == Done((), (Resolved(stored(V, 2000)),))


def test_no_variant_could_be_made_so_it_goes_as_it_came() -> None:
    step = decide(ask(inline(), count=21), Progress(EMPTY, {A: stored(A, 2400)}, made={A: None}))
    assert step == Done((), (None,))


def test_bytes_that_are_no_image_are_quarantined_once_then_their_placeholder() -> None:
    broken = inline(facts=ImageFacts(None, 12))
    step = decide(ask(broken), Progress(EMPTY))
    quarantine = Quarantine(A, "corrupt", retryable=False, inline=True)
    assert step == Record((quarantine,))
    state = SessionState(1, MappingProxyType({A: quarantine}))
    assert decide(ask(broken), Progress(state)) == Done((), (Placeholder("corrupt", f"[image unavailable: corrupt "
                                                                                   f"({A[:15]})]"),))


def test_a_store_quarantine_of_the_same_id_never_holds_for_the_clients_bytes() -> None:
    state = SessionState(1, MappingProxyType({A: Quarantine(A, "not_found", retryable=False)}))
    assert decide(ask(inline()), Progress(state)) == Done((), (None,))


@pytest.mark.parametrize(("recorded_form", "sent_form", "fit", "holds"), [
    ("", "", True, True),
    ("", "labelled image/jpeg", False, True),                       # refused as it is: every form
    ("labelled image/jpeg", "labelled image/jpeg", False, True),    # the same form again
    ("labelled image/jpeg", "", False, False),                      # sent right: not held
    ("labelled image/jpeg", "labelled image/jpeg", True, False),    # fitted: it goes respelled, right
])
def test_a_rejection_holds_for_the_form_it_was_refused_in(recorded_form: str, sent_form: str, fit: bool,
                                                         holds: bool) -> None:
    rejected = Rejected(A, "anthropic", 1, "sha256:" + "0" * 64, form=recorded_form)
    state = SessionState(1, rejected=MappingProxyType({("anthropic", A): rejected}))
    [outcome] = decide(ask(inline(form=sent_form), fit=fit), Progress(state)).inline  # type: ignore[union-attr]
    assert isinstance(outcome, Placeholder) == holds


def test_without_fitting_an_image_goes_as_it_came_whatever_it_breaks() -> None:
    assert decide(ask(inline(facts=ImageFacts(None, 3)), count=21, fit=False), Progress(EMPTY)) == Done((), (None,))


def test_a_model_that_takes_no_images_gets_placeholders_and_nothing_is_read() -> None:
    rule = Learnt("anthropic", "m", "no_images")
    state = SessionState(1, learnt=MappingProxyType({("anthropic", "m", "no_images"): rule}))
    step = decide(ask(inline(), refs=(ImageRef(B, "b.png"),), count=2), Progress(state))
    assert step == Done((Placeholder("unsupported", f'[image unavailable: unsupported; "b.png" ({B[:15]})]'),),
                        (Placeholder("unsupported", f"[image unavailable: unsupported ({A[:15]})]"),), vision=False)
    other_model = ask(inline(), model="vision")
    assert decide(other_model, Progress(state)) == Done((), (None,))


def test_a_learnt_many_image_rule_narrows_the_profile_for_its_upstream_and_model_only() -> None:
    rule = Learnt("anthropic", "m", "many_images", images=4, side=1000)
    state = SessionState(1, learnt=MappingProxyType({("anthropic", "m", "many_images"): rule}))
    facts = ImageFacts("image/png", 100, 1200, 800)
    assert decide(ask(inline(facts=facts), count=4), Progress(state)) == Read((A,))
    assert decide(ask(inline(facts=facts), count=3), Progress(state)) == Done((), (None,))
    assert decide(ask(inline(facts=facts), count=4, upstream="bedrock"), Progress(state)) == Done((), (None,))


# --- profiles narrowed by rules -------------------------------------------------------------------

def test_under_takes_the_stricter_of_the_rule_and_the_profile() -> None:
    assert under(PROFILE, ()) is PROFILE
    narrowed = under(PROFILE, [Learnt("u", "m", "many_images", images=6, side=1000)])
    assert (narrowed.many_images, narrowed.many_images_max_side, narrowed.target(6)) == (5, 1000, "anthropic@1000")
    assert under(PROFILE, [Learnt("u", "m", "many_images", images=30, side=2500)]) == PROFILE
    side = under(PROFILE, [Learnt("u", "m", "image_side", side=4000)])
    assert (side.max_side, side.target(1)) == (4000, "anthropic@4000")
    size = under(PROFILE, [Learnt("u", "m", "image_bytes", bytes=3_932_160)])
    assert (size.max_image_bytes, size.target(1)) == (3_932_160, "anthropic-b3932160@8000")  # its variants apart
    assert under(openai_chat.PROFILE, [Learnt("u", "m", "later_rule", images=1)]) == openai_chat.PROFILE
    assert not takes_images([Learnt("u", "m", "no_images")]) and takes_images([])


def test_a_refusal_teaches_a_rule_only_with_what_it_needs() -> None:
    many = Rejection("m", context="many_images", side=2000)
    assert learnt(many, "up", "m", 21) == Learnt("up", "m", "many_images", images=21, side=2000,
                                                 message_digest=learnt(many, "up", "m", 21).message_digest)  # type: ignore[union-attr]
    assert learnt(Rejection("m", context="many_images"), "up", "m", 21) is None  # no side said
    assert learnt(Rejection("m", context="image_bytes"), "up", None, 1) is None
    assert learnt(Rejection("m", context="no_images"), "up", None, 1).model == ""  # type: ignore[union-attr]
    assert learnt(Rejection("m"), "up", "m", 1) is None


def test_a_rule_as_strict_stands() -> None:
    known = Learnt("u", "m", "many_images", images=10, side=1000)
    assert stands(Learnt("u", "m", "many_images", images=12, side=2000), known)
    assert not stands(Learnt("u", "m", "many_images", images=8, side=1000), known)
    assert not stands(known, None)


def test_rules_fold_and_checkpoint_like_every_state_event() -> None:
    rule = Learnt("u", "m", "no_images", message_digest="sha256:" + "1" * 64)
    state = fold([LearntEvent(seq=1, time="t", data=rule)])
    assert state.rules("u", "m") == (rule,) and state.rules("u", "other") == () and state.rules(None, "m") == ()
    from projectionist.policy.events import CheckpointEvent
    again = fold([CheckpointEvent(seq=2, time="t", data=checkpoint_of(state))], state)
    assert again.learnt == state.learnt


def test_assumed_rejections_change_the_state_not_the_log() -> None:
    rejected = Rejected(A, "openai", 1, "sha256:" + "0" * 64)
    state = fold([RejectedEvent(seq=1, time="t", data=Rejected(B, "openai", 1, "sha256:" + "0" * 64))])
    assumed = assuming(state, [rejected])
    assert set(assumed.rejected) == {("openai", A), ("openai", B)} and set(state.rejected) == {("openai", B)}
    assert assuming(state, []) is state


# --- evidence ---------------------------------------------------------------------------------------

def settle(suspects: int, causes: set[int]) -> tuple[Settle | Unproven, int]:
    """Run the plan against an upstream that refuses every call still carrying one of ``causes``."""
    evidence = Evidence([str(n) for n in range(suspects)])
    step: Probe | Settle | Unproven = evidence.first()
    while isinstance(step, Probe):
        step = evidence.answered(causes <= {int(n) for n in step.out})
    return step, evidence.calls + (isinstance(step, Settle) and step.again)


@pytest.mark.parametrize("suspects", range(1, 9))
def test_one_cause_among_up_to_four_is_found_exactly_and_never_past_the_budget(suspects: int) -> None:
    for cause in range(suspects):
        step, calls = settle(suspects, {cause})
        assert isinstance(step, Settle) and str(cause) in step.out and calls <= MAX_CALLS
        if suspects <= 4:
            assert step.out == (str(cause),)


def test_a_refusal_leaving_every_suspect_out_does_not_help_proves_nothing() -> None:
    assert settle(3, {7}) == (Unproven(), 1)


def test_two_causes_settle_on_a_set_that_holds_both() -> None:
    step, calls = settle(4, {0, 3})
    assert isinstance(step, Settle) and {"0", "3"} <= set(step.out) and calls <= MAX_CALLS


def test_evidence_needs_a_suspect() -> None:
    with pytest.raises(ValueError):
        Evidence([])


# --- the fast path is the table's answer ---------------------------------------------------------

_IDS = [A, B, V]
_FACTS = [PNG, ImageFacts("image/png", 10, 100, 80), ImageFacts(None, 4), ImageFacts("image/bmp", 10, 20, 20)]
_FORMS = ["", "labelled image/jpeg"]


def _state(rejected: list[tuple[str, str]], broken: list[str]) -> SessionState:
    rejections = {("anthropic", aid): Rejected(aid, "anthropic", 1, "sha256:" + "0" * 64, form=form)
                  for aid, form in rejected}
    quarantines = {aid: Quarantine(aid, "corrupt", retryable=False, inline=True) for aid in broken}
    return SessionState(3, MappingProxyType(quarantines), rejected=MappingProxyType(rejections))


@given(facts=st.lists(st.sampled_from(_FACTS), min_size=3, max_size=3),
       images=st.lists(st.tuples(st.sampled_from(range(3)), st.sampled_from(_FORMS)), max_size=6),
       rejected=st.lists(st.tuples(st.sampled_from(_IDS), st.sampled_from(_FORMS)), max_size=3),
       broken=st.lists(st.sampled_from(_IDS), max_size=2), fit=st.booleans(), count=st.integers(1, 30))
def test_at_once_answers_as_the_table_does_whenever_it_answers(facts: list[ImageFacts], images: list[tuple[int, str]],
                                                               rejected: list[tuple[str, str]], broken: list[str],
                                                               fit: bool, count: int) -> None:
    inlined = [Inlined(_IDS[n], facts[n], form) for n, form in images]  # the same bytes: the same facts
    asked = ask(*inlined, count=count, fit=fit)
    state = _state(rejected, broken)
    fast = at_once(asked, state)
    if fast is not None:
        assert fast == decide(asked, Progress(state))
    elif fit:  # only something to read, record or pin sends it the long way
        assert not isinstance(decide(asked, Progress(state)), Done)


# --- found by the red team ---------------------------------------------------------------------------

def test_no_variant_made_still_goes_respelled() -> None:
    step = decide(ask(inline(form="labelled image/jpeg"), count=21), Progress(EMPTY, {A: stored(A, 2400)}, made={A: None}))
    assert step == Done((), (Respelled("image/png"),))


def test_bytes_that_are_no_image_stay_placeholders_when_a_checkpoint_dropped_inline() -> None:
    """An older replica's checkpoint restates the quarantine without ``inline``: its failure holds."""
    state = SessionState(1, MappingProxyType({A: Quarantine(A, "corrupt", retryable=False)}))
    [outcome] = decide(ask(inline(facts=ImageFacts(None, 5))), Progress(state)).inline  # type: ignore[union-attr]
    assert outcome == Placeholder("corrupt", f"[image unavailable: corrupt ({A[:15]})]")


def test_one_request_varies_at_most_so_many_images() -> None:
    from projectionist.policy.decide import MAX_VARIED

    ids = ["sha256:%064x" % n for n in range(MAX_VARIED + 6)]
    read = {aid: stored(aid, 2400) for aid in ids}
    step = decide(ask(*(inline(aid) for aid in ids), count=len(ids)), Progress(EMPTY, read))
    assert isinstance(step, Vary) and len(step.images) == MAX_VARIED
    made = {aid: None for aid in ids[:MAX_VARIED]}
    done = decide(ask(*(inline(aid) for aid in ids), count=len(ids)), Progress(EMPTY, read, made=made))
    assert isinstance(done, Done) and done.inline[-1] is None  # the rest go as they came this time


def test_past_a_requests_limits_the_oldest_inlined_images_give_way() -> None:
    from projectionist.policy.budget import PLACEHOLDER_BYTES, base64_size, within
    from projectionist.policy.profile import Profile

    profile = Profile("p", ("image/png",), max_request_bytes=10_000, max_images=3)
    images = [Inlined("sha256:%064x" % n, ImageFacts("image/png", 1500, 10, 10)) for n in range(4)]
    over = Placeholder("over_limit", f"[image unavailable: over_limit ({images[0].id[:15]})]")
    assert within(profile, 100 + 4 * base64_size(1500), 4, (), images, [None] * 4)[0] == over  # 4 images > 3
    kept = within(profile, 8_000, 3, (), images[:3], [None] * 3)
    assert kept == (None, None, None)
    # a variant larger than its original: the body grows past 10,000 bytes, the oldest gives way
    bigger = Resolved(StoredImage(V, "image/png", 3000, 9, 9, b""))
    out = within(profile, 8_100, 3, (), images[:3], [None, None, bigger])
    assert isinstance(out[0], Placeholder) and out[1:] == (None, bigger)
    assert 8_100 - base64_size(1500) * 3 + base64_size(1500) * 2 + base64_size(3000) > 10_000 >= \
        8_100 - base64_size(1500) * 3 + PLACEHOLDER_BYTES + base64_size(1500) + base64_size(3000)
    assert within(profile, 8_000, 3, (), images[:3], [None, None, bigger]) == (None, None, bigger)  # just fits
    assert within(None, 10**9, 10**3, (), images, [None] * 4) == (None,) * 4
