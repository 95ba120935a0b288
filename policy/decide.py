"""What a projection does next, from what it knows: a pure decision table (policy layer, pure).

``decide`` looks at what the projection is asked (``Ask``: the request's references and the
facts that hold while it runs) and what it has learnt so far (``Progress``: the folded session
state and the reads), and names the next step: read these ids, record these quarantines, lift
these retryable quarantines whose probe verified, make variants of images the upstream's profile
does not take, pin the variants made, fail the request, or done with every outcome. Each row of
the table is a small rule (``_RULES``, first match wins); none touches a store or a log, so it is
tested as a table (``tests/policy/test_decide.py``); ``project`` is the short loop that carries
the steps out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, Final, Literal

import msgspec

from .errors import CORRUPT, INVALID_REF, NOT_FOUND, READ_FAILED, AttachmentError
from .events import Quarantine, Rejected, Variant
from .fold import EMPTY, SessionState, placeholder
from .model import ImageRef, StoreFailure, Outcome, Placeholder, Resolved, StoredImage
from .profile import Profile, breaks

Sessionless = Literal["fail", "placeholder"]
FAILURE: Final[dict[str, StoreFailure]] = {NOT_FOUND: "not_found", CORRUPT: "corrupt", READ_FAILED: "read_failed"}


def _quarantine_for(error: AttachmentError, attachment_id: str, name: str | None) -> Quarantine:
    return Quarantine(attachment_id, FAILURE[error.code], retryable=error.code == READ_FAILED, name=name)


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
    """The outcome of every reference, aligned with the request's references."""

    outcomes: tuple[Outcome, ...]


Step = Read | Record | Lift | Vary | Pin | Fail | Done


class Ask(msgspec.Struct, frozen=True):
    """What one projection is asked, fixed while it runs.

    ``refs`` are the request's references; ``recording`` says whether there is a session log to
    record quarantines in (without one, ``sessionless`` says whether a failure fails the request
    or projects its placeholder); ``upstream_format`` is the format of the upstream the request
    goes to (its rejections hold); with its ``profile``, an image that does not fit is sent as its
    variant. ``images`` is how many images the request holds in all (its references and any the
    client inlined itself: what a many-image rule counts); by default its references."""

    refs: Sequence[ImageRef]
    recording: bool
    sessionless: Sessionless = "fail"
    upstream_format: str | None = None
    profile: Profile | None = None
    images: int | None = None


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
    """What one decision looks at: each referenced id once with its display name, the target of
    the request's variants, the ids still open (not quarantined here, or due for a probe) and the
    pin to read for each id."""

    def __init__(self, ask: Ask, progress: Progress) -> None:
        self.ask = ask
        self.progress = progress
        self.names = names_of(ask.refs)
        self.count = max(ask.images or 0, len(ask.refs))
        self.target = ask.profile.target(self.count) if ask.profile is not None else None
        state, due = progress.state, progress.due
        self.open = [aid for aid in self.names if state.standing(aid, ask.upstream_format) is None or aid in due]
        self.pins = {aid: self._pinned(aid) for aid in self.names}

    def _pinned(self, aid: str) -> Variant | None:
        """The variant to read for ``aid``: pinned for this target and not found unreadable."""
        variants = self.progress.state.variants
        variant = variants.get((aid, self.target)) if self.target is not None and variants else None
        if variant is None or aid in self.progress.due or isinstance(self.progress.results.get(variant.variant_id),
                                                                     AttachmentError):
            return None
        return variant

    @cached_property
    def failures(self) -> dict[str, AttachmentError]:
        """The open ids whose own read failed, not yet quarantined in the log."""
        results, quarantined = self.progress.results, self.progress.state.quarantined
        return {aid: result for aid in self.open
                if aid not in quarantined and aid in results and self.pins[aid] is None
                and isinstance(result := results[aid], AttachmentError)}

    @cached_property
    def quarantines(self) -> tuple[Quarantine, ...]:
        """The quarantine each of ``failures`` asks for, with the first display name given."""
        return tuple(_quarantine_for(error, aid, self.names[aid]) for aid, error in self.failures.items())


def _unread(view: _View) -> Read | None:
    """Read each open id not read yet, once: its pinned variant instead where one is to be read."""
    wanted = dict.fromkeys(pin.variant_id if (pin := view.pins[aid]) is not None else aid for aid in view.open)
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
    if not failures:
        return None
    if view.ask.recording:
        return Record(view.quarantines)
    if view.ask.sessionless == "fail":
        return Fail(next(iter(failures.values())))
    return None


def _misfit(view: _View) -> Vary | None:
    """Vary each verified image that does not fit the profile and has no pin or variant yet."""
    profile = view.ask.profile
    if profile is None:
        return None
    results, made = view.progress.results, view.progress.made
    misfits = tuple(found for aid in view.open if view.pins[aid] is None and aid not in made
                    and isinstance(found := results.get(aid), StoredImage)
                    and breaks(profile, found.media_type, found.bytes, found.width, found.height, view.count))
    return Vary(misfits, profile, view.count) if misfits else None


def _unpinned(view: _View) -> Pin | None:
    """With a session, pin each variant made that the log does not pin for its target yet."""
    if view.ask.profile is None or not view.ask.recording:
        return None
    variants = view.progress.state.variants
    new = tuple(v for aid, v in view.progress.made.items() if v is not None and variants.get((aid, v.target)) != v)
    return Pin(new) if new else None


#: The decision table's rows, in order: the first that names a step wins; else ``_done``.
_RULES: Final[tuple[Callable[[_View], Step | None], ...]] = (_unread, _probed, _failed, _misfit, _unpinned)


def _done(view: _View) -> Done:
    """Every reference's outcome: a pure function of the state, the reads and what was made."""
    unrecorded = {q.attachment_id: q for q in view.quarantines}
    return Done(tuple(_outcome(view, ref, unrecorded) for ref in view.ask.refs))


def _outcome(view: _View, ref: ImageRef, unrecorded: Mapping[str, Quarantine]) -> Outcome:
    """One reference's outcome: the placeholder of the quarantine that holds for it (or of its
    failure, unrecorded without a session), else its image: the variant to send, or the original."""
    quarantine = view.progress.state.standing(ref.id, view.ask.upstream_format) or unrecorded.get(ref.id)
    if quarantine is not None:
        return Placeholder(quarantine.failure, placeholder(ref, quarantine))
    variant = view.pins[ref.id]
    if variant is None:
        variant = view.progress.made.get(ref.id)  # made, not pinned: a request without a session
    image = view.progress.results[variant.variant_id if variant is not None else ref.id]
    assert isinstance(image, StoredImage)
    return Resolved(image)


def names_of(refs: Sequence[ImageRef]) -> dict[str, str | None]:
    """Each referenced id once, in order, with the first display name any reference gave it."""
    names: dict[str, str | None] = {}
    for ref in refs:
        if names.get(ref.id) is None:
            names[ref.id] = ref.name
    return names


def held_inline(ids: Sequence[str], state: SessionState, upstream_format: str) -> tuple[Placeholder | None, ...]:
    """What each image the client inlined itself becomes (``ids``: the sha256 of its bytes):
    the placeholder of the rejection that holds for it on upstreams of ``upstream_format``, or
    None: sent as the client sent it. Store failures never hold for it: its bytes are in the
    request, not in the store. Like every outcome, a pure function of the state and the ids."""
    if not state.rejected:
        return tuple(None for _ in ids)
    outcomes: list[Placeholder | None] = []
    for aid in ids:
        rejected = state.rejected.get((upstream_format, aid))
        outcomes.append(None if rejected is None else Placeholder("rejected", placeholder(ImageRef(aid), rejected)))
    return tuple(outcomes)


def held_urls(refs: Sequence[ImageRef], state: SessionState, upstream_format: str) -> tuple[Placeholder | None, ...]:
    """What each image the provider fetches by URL becomes (``refs``: its ``linked.url_id`` and
    display name): the placeholder of the quarantine that holds for it (a fetch that failed, for
    every upstream; a rejection, on upstreams of ``upstream_format``), or None: sent as the client
    sent it. Like every outcome, a pure function of the state and the refs."""
    if not state.quarantined and not state.rejected:
        return tuple(None for _ in refs)
    outcomes: list[Placeholder | None] = []
    for ref in refs:
        held = state.standing(ref.id, upstream_format)
        outcomes.append(None if held is None else Placeholder(held.failure, placeholder(ref, held)))
    return tuple(outcomes)
