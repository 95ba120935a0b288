"""What a projection does next, from what it knows: a pure decision table (policy layer, pure).

``decide`` looks at what the projection is asked (``Ask``: the request's references, the images
its client inlined itself, and the facts that hold while it runs) and what it has learnt so far
(``Progress``: the folded session state and the reads), and names the next step: read these ids,
record these quarantines, lift these retryable quarantines whose probe verified, make variants of
images the upstream's profile does not take, pin the variants made, fail the request, or done
with every outcome. Each row of the table is a small rule (``_RULES``, first match wins); none
touches a store or a log, so it is tested as a table (``tests/policy/test_decide.py``);
``project`` is the short loop that carries the steps out.

An image the client inlined is fitted like a reference: its bytes are known (``Inlined.facts``),
so one that breaks the profile is read from the request itself and varied, one spelled otherwise
than it is goes respelled, and bytes that are no image get their placeholder and one durable
quarantine before the upstream is asked. What the upstream taught about the request's context
(``events.Learnt``) narrows the profile for that upstream and model, or, for a model that takes
no images, makes every image a placeholder there and nothing is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, Final, Literal

import msgspec

from .errors import INVALID_REF, AttachmentError
from .events import Quarantine, Rejected, Variant
from .failures import NO_IMAGE, by_code
from .fold import EMPTY, SessionState, placeholder, placeholder_text
from .model import ImageFacts, ImageRef, Inlined, InlineOutcome, Outcome, Placeholder, Resolved, Respelled, StoredImage
from .budget import within
from .profile import Profile, breaks, takes_images, under

Sessionless = Literal["fail", "placeholder"]
#: The most images one request has varied: a render is CPU in a shared lane of two threads, and
#: one request may not hold it for minutes; past this many, its misfits go as they came this time
#: (each later request makes the next ones, and pins stay).
MAX_VARIED: Final = 64


def _quarantine_for(error: AttachmentError, attachment_id: str, name: str | None) -> Quarantine:
    """The quarantine a store failure asks for: its kind and whether it is retryable, from its row."""
    row = by_code(error.code)
    assert row is not None, error.code  # a bad reference fails the request before (``_failed``)
    return Quarantine(attachment_id, row.name, retryable=row.retryable, name=name)


class Read(msgspec.Struct, frozen=True):
    """Next: read these ids (none of them quarantined, none read yet)."""

    ids: tuple[str, ...]


class Record(msgspec.Struct, frozen=True):
    """Next: append these quarantines (the session's log decides them, once)."""

    quarantines: tuple[Quarantine, ...]


class Lift(msgspec.Struct, frozen=True):
    """Next: lift these retryable quarantines, whose probe read verified (``attachment/recovered``,
    ``automatic``)."""

    images: tuple[StoredImage, ...]


class Vary(msgspec.Struct, frozen=True):
    """Next: make the variant of these verified images that fits ``profile`` in a request of
    ``count`` images (its ``target``); none is pinned for them yet, or the pinned one is unreadable."""

    images: tuple[StoredImage, ...]
    profile: Profile
    count: int


class Pin(msgspec.Struct, frozen=True):
    """Next: append these variants (``attachment/variant``), so every later request, a restart, a
    fork and a replay send the same bytes."""

    variants: tuple[Variant, ...]


class Fail(msgspec.Struct, frozen=True):
    """Next: fail the request with this error (a bad reference, or a sessionless failure)."""

    error: Any


class Done(msgspec.Struct, frozen=True):
    """The outcome of every reference, aligned with the request's references, and of every image
    the client inlined, aligned with ``Ask.inline``."""

    outcomes: tuple[Outcome, ...]
    inline: tuple[InlineOutcome, ...] = ()
    vision: bool = True


Step = Read | Record | Lift | Vary | Pin | Fail | Done


class Ask(msgspec.Struct, frozen=True):
    """What one projection is asked, fixed while it runs.

    ``refs`` are the request's references; ``recording`` says whether there is a session log to
    record quarantines in (without one, ``sessionless`` says whether a failure fails the request
    or projects its placeholder); ``upstream_format`` is the format of the upstream the request
    goes to (its rejections hold); with its ``profile``, an image that does not fit is sent as its
    variant. ``images`` is how many images the request holds in all (its references and any the
    client inlined itself: what a many-image rule counts); by default its references.
    ``inline`` are the images the client inlined itself, in document order; with ``fit`` they are
    fitted to the profile (else they go as they came, or as the placeholder a rejection holds).
    ``upstream`` and ``model`` name what the request goes to: the rules learnt for them apply.
    The request stays within the profile's images and bytes per request (``budget.within``)."""

    refs: Sequence[ImageRef]
    recording: bool
    sessionless: Sessionless = "fail"
    upstream_format: str | None = None
    profile: Profile | None = None
    images: int | None = None
    inline: Sequence[Inlined] = ()
    fit: bool = True
    upstream: str | None = None
    model: str | None = None
    #: The size of the body as the client sent it (0: not known): what a limit of bytes per request counts.
    request_bytes: int = 0


class Progress(msgspec.Struct):
    """What one projection has learnt and done so far: the one object its steps change.

    ``decide`` reads ``state`` (the folded session), ``results`` (the verified read, or its
    failure, of each id read so far), ``due`` (the retryable quarantines whose probe is due: they
    are read, and lifted if the read verifies) and ``made`` (the variants made, by original id;
    None where none could be made, which sends the original). The tallies after them are what
    ``Projection`` reports; ``rounds`` counts the steps that wrote to the log."""

    state: SessionState = EMPTY
    results: dict[str, StoredImage | AttachmentError] = {}
    due: frozenset[str] = frozenset()
    made: dict[str, Variant | None] = {}
    reads: int = 0
    retries: int = 0
    rounds: int = 0
    recorded: tuple[Quarantine | Rejected, ...] = ()
    lifted: tuple[str, ...] = ()
    pinned: tuple[Variant, ...] = ()


def decide(ask: Ask, progress: Progress) -> Step:
    """The next step of a projection, from what is known so far (pure; see ``project``).

    The first rule of ``_RULES`` that applies names it, else every reference is done: a read
    before anything is decided on it; a lift of a probed quarantine; a bad reference fails, a
    store failure is recorded (or, without a session, fails or becomes a placeholder); a misfit
    is varied, and what was made is pinned. An image that does not fit the profile is sent as
    its variant: the pinned one for the request's target, read instead of the original; else
    one made and pinned."""
    view = _View(ask, progress)
    for rule in _RULES:
        if (step := rule(view)) is not None:
            return step
    return _done(view)


class _View:
    """What one decision looks at: each referenced id once with its display name, the profile and
    target of the request's variants (narrowed by what was learnt for its upstream and model),
    the ids still open (not quarantined here, or due for a probe), the images the client inlined
    that are to be fitted, and the pin to read for each id."""

    def __init__(self, ask: Ask, progress: Progress) -> None:
        self.ask = ask
        self.progress = progress
        self.names = names_of(ask.refs)
        self.count = max(ask.images or 0, len(ask.refs))
        rules = progress.state.rules(ask.upstream, ask.model) if ask.upstream is not None else ()
        self.vision = takes_images(rules)
        self.profile = under(ask.profile, rules) if ask.profile is not None and rules else ask.profile
        self.target = self.profile.target(self.count) if self.profile is not None else None
        state, due = progress.state, progress.due
        self.open = [aid for aid in self.names if state.standing(aid, ask.upstream_format) is None or aid in due] \
            if self.vision else []
        self.pins = {aid: self._pinned(aid) for aid in self.names}
        self.pins.update((aid, self._pinned(aid)) for aid in self.misfits)

    def _pinned(self, aid: str) -> Variant | None:
        """The variant to read for ``aid``: pinned for this target and not found unreadable."""
        variants = self.progress.state.variants
        variant = variants.get((aid, self.target)) if self.target is not None and variants else None
        if variant is None or aid in self.progress.due or isinstance(self.progress.results.get(variant.variant_id),
                                                                     AttachmentError):
            return None
        return variant

    def form(self, image: Inlined) -> str:
        """The form ``image`` goes upstream in: canonical when fitted (respelled), else its own."""
        return "" if self.ask.fit else image.form

    @cached_property
    def fitted(self) -> dict[str, Inlined]:
        """The images the client inlined that are fitted here (each id once): fitting is on, the
        model takes images, and no quarantine holds for them."""
        ask = self.ask
        if not ask.inline or not ask.fit or not self.vision:
            return {}
        state, fmt = self.progress.state, ask.upstream_format or ""
        return {image.id: image for image in ask.inline if state.held_inline(image.id, fmt, "") is None}

    @cached_property
    def misfits(self) -> tuple[str, ...]:
        """The fitted images whose bytes are an image that does not fit the profile as it is."""
        profile = self.profile
        if profile is None:
            return ()
        return tuple(aid for aid, image in self.fitted.items() if (facts := image.facts).media_type is not None
                     and breaks(profile, facts.media_type, facts.bytes, facts.width, facts.height, self.count))

    @cached_property
    def failures(self) -> dict[str, AttachmentError]:
        """The open ids whose own read failed, not yet quarantined in the log."""
        results, quarantined = self.progress.results, self.progress.state.quarantined
        return {aid: result for aid in self.open
                if aid not in quarantined and aid in results and self.pins[aid] is None
                and isinstance(result := results[aid], AttachmentError)}

    @cached_property
    def quarantines(self) -> tuple[Quarantine, ...]:
        """The quarantine each of ``failures`` asks for, with the first display name given, and
        one for each fitted image whose bytes are no image (not recorded yet)."""
        found = tuple(_quarantine_for(error, aid, self.names[aid]) for aid, error in self.failures.items())
        quarantined = self.progress.state.quarantined
        return found + tuple(Quarantine(aid, NO_IMAGE.name, retryable=NO_IMAGE.retryable, inline=True)
                             for aid, image in self.fitted.items()
                             if image.facts.media_type is None and aid not in quarantined)


def _unread(view: _View) -> Read | None:
    """Read each open id not read yet, once: its pinned variant instead where one is to be read;
    and each misfit the client inlined (from the request) that has no pin to read."""
    wanted = dict.fromkeys(pin.variant_id if (pin := view.pins[aid]) is not None else aid
                           for aid in (*view.open, *view.misfits))
    pending = tuple(i for i in wanted if i not in view.progress.results)
    return Read(pending) if pending else None


def _probed(view: _View) -> Lift | None:
    """With a session, lift each due retryable quarantine whose probe read verified."""
    if not view.ask.recording:
        return None
    progress = view.progress
    lifts = tuple(image for aid in view.names if aid in progress.due and aid in progress.state.quarantined
                  and isinstance(image := progress.results[aid], StoredImage))
    return Lift(lifts) if lifts else None


def _failed(view: _View) -> Fail | Record | None:
    """A bad reference fails the request, even with a session; a store failure is recorded with a
    session; without one it fails the request (``sessionless="fail"``), or its placeholder is
    projected unrecorded (see ``_done``)."""
    failures = view.failures
    bad = next((error for error in failures.values() if error.code == INVALID_REF), None)
    if bad is not None:
        return Fail(bad)
    if not view.quarantines:
        return None
    if view.ask.recording:
        return Record(view.quarantines)
    if failures and view.ask.sessionless == "fail":
        return Fail(next(iter(failures.values())))
    return None


def _misfit(view: _View) -> Vary | None:
    """Vary each verified image that does not fit the profile and has no pin or variant yet (the
    misfits the client inlined were read from the request)."""
    profile = view.profile
    if profile is None:
        return None
    results, made = view.progress.results, view.progress.made
    misfits = tuple(found for aid in dict.fromkeys((*view.open, *view.misfits))
                    if view.pins[aid] is None and aid not in made
                    and isinstance(found := results.get(aid), StoredImage)
                    and breaks(profile, found.media_type, found.bytes, found.width, found.height, view.count))
    misfits = misfits[:max(0, MAX_VARIED - len(made))]  # the rest go as they came this time
    return Vary(misfits, profile, view.count) if misfits else None


def _unpinned(view: _View) -> Pin | None:
    """With a session, pin each variant made that the log does not pin for its target yet."""
    if view.profile is None or not view.ask.recording:
        return None
    variants = view.progress.state.variants
    new = tuple(v for aid, v in view.progress.made.items() if v is not None and variants.get((aid, v.target)) != v)
    return Pin(new) if new else None


#: The decision table's rows, in order: the first that names a step wins; else ``_done``.
_RULES: Final[tuple[Callable[[_View], Step | None], ...]] = (_unread, _probed, _failed, _misfit, _unpinned)


def _done(view: _View) -> Done:
    """Every reference's outcome, and every inlined image's: a pure function of the state, the
    reads and what was made."""
    unrecorded = {q.attachment_id: q for q in view.quarantines}
    ask = view.ask
    refs = tuple(_outcome(view, ref, unrecorded) for ref in ask.refs)
    inline = within(view.profile, ask.request_bytes, view.count, refs, ask.inline,
                    [_inline_outcome(view, image, unrecorded) for image in ask.inline])
    return Done(refs, inline, view.vision)


def _outcome(view: _View, ref: ImageRef, unrecorded: Mapping[str, Quarantine]) -> Outcome:
    """One reference's outcome: the placeholder of the quarantine that holds for it (or of its
    failure, unrecorded without a session), else its image: the variant to send, or the original.
    A model that takes no images gets the placeholder of each."""
    quarantine = view.progress.state.standing(ref.id, view.ask.upstream_format) or unrecorded.get(ref.id)
    if quarantine is not None:
        return Placeholder(quarantine.kind, placeholder(ref, quarantine))
    if not view.vision:
        return Placeholder("unsupported", placeholder_text(ref, "unsupported"))
    variant = view.pins[ref.id]
    if variant is None:
        variant = view.progress.made.get(ref.id)  # made, not pinned: a request without a session
    image = view.progress.results[variant.variant_id if variant is not None else ref.id]
    assert isinstance(image, StoredImage)
    return Resolved(image)


def _inline_outcome(view: _View, image: Inlined, unrecorded: Mapping[str, Quarantine]) -> InlineOutcome:
    """One inlined image's outcome: the placeholder of what holds for its bytes in the form it goes
    in (a rejection, bytes that are no image), of a model that takes none; else, fitted, its
    variant where it breaks the profile (as it came when none could be made), respelled where it
    was spelled otherwise, or as it came."""
    state = view.progress.state
    held = state.held_inline(image.id, view.ask.upstream_format or "", view.form(image)) or unrecorded.get(image.id)
    if held is None and image.id in view.fitted and image.facts.media_type is None:
        held = state.quarantined.get(image.id)  # recorded as no image (an older replica's checkpoint drops ``inline``)
    if held is not None or not view.vision:
        return _placeholder(image, held)
    if image.id not in view.fitted:
        return None
    if image.id in view.misfits:
        variant = view.pins.get(image.id) or view.progress.made.get(image.id)
        made = view.progress.results.get(variant.variant_id) if variant is not None else None
        if isinstance(made, StoredImage):
            return Resolved(made)
    return _as_it_is(image)  # respelled where it was spelled otherwise, also when no variant could be made


def _placeholder(image: Inlined, held: Quarantine | Rejected | None) -> Placeholder:
    """The placeholder of what holds for an inlined image, or of a model that takes no images."""
    ref = ImageRef(image.id)
    if held is None:
        return Placeholder("unsupported", placeholder_text(ref, "unsupported"))
    return Placeholder(held.kind, placeholder(ref, held))


def _as_it_is(image: Inlined) -> InlineOutcome:
    """A fitted image that fits: as it came, or respelled where it was spelled otherwise."""
    media_type = image.facts.media_type
    return Respelled(media_type) if image.form and media_type is not None else None


def at_once(ask: Ask, state: SessionState) -> Done | None:
    """``decide``'s answer for a request with no reference when it is done at once (nothing to
    read, record or pin: every inlined image fits, or a quarantine holds for it), without the
    decision table's bookkeeping: what every agent's turn costs. None: ask ``decide``."""
    if ask.refs or (state.learnt and state.rules(ask.upstream, ask.model)):
        return None
    held = bool(state.quarantined or state.rejected)
    outcomes: list[InlineOutcome] = []
    for image in ask.inline:
        found = state.held_inline(image.id, ask.upstream_format or "", image.form if not ask.fit else "") \
            if held else None
        if found is not None:
            outcomes.append(_placeholder(image, found))
        elif not ask.fit:
            outcomes.append(None)
        elif _fits(image.facts, ask.profile, max(ask.images or 0, 0)):
            outcomes.append(_as_it_is(image))
        else:
            return None
    return Done((), within(ask.profile, ask.request_bytes, max(ask.images or 0, 0), (), ask.inline, outcomes))


def _fits(facts: ImageFacts, profile: Profile | None, count: int) -> bool:
    """Whether bytes that are an image fit ``profile`` as they are in a request of ``count`` images."""
    if facts.media_type is None:
        return False
    return profile is None or breaks(profile, facts.media_type, facts.bytes, facts.width, facts.height, count) is None


def names_of(refs: Sequence[ImageRef]) -> dict[str, str | None]:
    """Each referenced id once, in order, with the first display name any reference gave it."""
    names: dict[str, str | None] = {}
    for ref in refs:
        if names.get(ref.id) is None:
            names[ref.id] = ref.name
    return names


def held_urls(refs: Sequence[ImageRef], state: SessionState, upstream_format: str,
              vision: bool = True) -> tuple[Placeholder | None, ...]:
    """What each image the provider fetches by URL becomes (``refs``: its ``linked.url_id`` and
    display name): the placeholder of the quarantine that holds for it (a fetch that failed, for
    every upstream; a rejection, on upstreams of ``upstream_format``), of a model that takes no
    images (not ``vision``), or None: sent as the client sent it. Like every outcome, a pure
    function of the state and the refs."""
    if not state.quarantined and not state.rejected and vision:
        return tuple(None for _ in refs)
    outcomes: list[Placeholder | None] = []
    for ref in refs:
        held = state.standing(ref.id, upstream_format)
        if held is not None:
            outcomes.append(Placeholder(held.kind, placeholder(ref, held)))
        else:
            outcomes.append(None if vision else Placeholder("unsupported", placeholder_text(ref, "unsupported")))
    return tuple(outcomes)
