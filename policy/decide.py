"""What a projection does next, from what it knows: a pure decision table (policy layer, pure).

``decide`` looks at the request's references, the folded session state and the reads so far,
and names the next step: read these ids, record these quarantines, lift these retryable
quarantines whose probe verified, make variants of images the upstream's profile does not take,
pin the variants made, fail the request, or done with every outcome. It touches no
store and no log, so it is tested as a table (``tests/policy/test_decide.py``); ``project`` is
the short loop that carries the steps out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from .errors import CORRUPT, INVALID_REF, NOT_FOUND, READ_FAILED, AttachmentError
from .events import Quarantine, Variant
from .fold import SessionState, placeholder
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


def decide(
    refs: Sequence[ImageRef],
    state: SessionState,
    results: Mapping[str, StoredImage | AttachmentError],
    *,
    recording: bool,
    sessionless: Sessionless = "fail",
    due: frozenset[str] = frozenset(),
    upstream_format: str | None = None,
    profile: Profile | None = None,
    made: Mapping[str, Variant | None] | None = None,
    images: int | None = None,
) -> Step:
    """The next step of a projection, from what is known so far (pure; see ``project``).

    ``results`` holds the verified read (or its failure) of each id read so far; ``recording``
    says whether there is a session log to record quarantines in; ``due`` names the retryable
    quarantines whose probe is due (``Prober``): they are read, and lifted if the read verifies.
    ``upstream_format`` is the format of the upstream the request goes to (its rejections hold);
    with its ``profile``, an image that does not fit is sent as its variant: the pinned one for
    the request's target, read instead of the original; else one made (``made``: by original id,
    None where none could be made, which sends the original) and pinned. ``images`` is how many
    images the request holds in all (its references and any the client inlined itself: what a
    many-image rule counts); by default its references."""
    names = names_of(refs)
    made = made or {}
    count = max(images or 0, len(refs))
    target = profile.target(count) if profile is not None else None
    open_ids = [aid for aid in names if state.standing(aid, upstream_format) is None or aid in due]

    def pinned(aid: str) -> Variant | None:
        """The variant to read for ``aid``: pinned for this target and not found unreadable."""
        variant = state.variants.get((aid, target)) if target is not None and state.variants else None
        if variant is None or aid in due or isinstance(results.get(variant.variant_id), AttachmentError):
            return None
        return variant

    wanted = {(v.variant_id if (v := pinned(aid)) is not None else aid): None for aid in open_ids}
    pending = tuple(i for i in wanted if i not in results)
    if pending:
        return Read(pending)
    lifts = tuple(image for aid in names if aid in due and aid in state.quarantined
                  and isinstance(image := results[aid], StoredImage))
    if lifts and recording:
        return Lift(lifts)
    failures = {aid: result for aid in open_ids
                if aid not in state.quarantined and aid in results and pinned(aid) is None
                and isinstance(result := results[aid], AttachmentError)}
    for error in failures.values():
        if error.code == INVALID_REF:
            return Fail(error)
    wanted_q = tuple(_quarantine_for(error, aid, names[aid]) for aid, error in failures.items())
    if wanted_q and recording:
        return Record(wanted_q)
    if wanted_q and sessionless == "fail":
        return Fail(next(iter(failures.values())))
    if profile is not None:
        misfits = tuple(found for aid in open_ids if pinned(aid) is None and aid not in made
                        and isinstance(found := results.get(aid), StoredImage)
                        and breaks(profile, found.media_type, found.bytes, found.width, found.height, count))
        if misfits:
            return Vary(misfits, profile, count)
        new_pins = tuple(v for aid, v in made.items() if v is not None and state.variants.get((aid, v.target)) != v)
        if new_pins and recording:
            return Pin(new_pins)
    unrecorded = {q.attachment_id: q for q in wanted_q}
    outcomes: list[Outcome] = []
    for ref in refs:
        quarantine = state.standing(ref.id, upstream_format) or unrecorded.get(ref.id)
        if quarantine is not None:
            outcomes.append(Placeholder(quarantine.failure, placeholder(ref, quarantine)))
            continue
        variant = pinned(ref.id)
        if variant is None and (fresh := made.get(ref.id)) is not None:
            variant = fresh  # made, not pinned: a request without a session
        image = results[variant.variant_id if variant is not None else ref.id]
        assert isinstance(image, StoredImage)
        outcomes.append(Resolved(image))
    return Done(tuple(outcomes))


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
