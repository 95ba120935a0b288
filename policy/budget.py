"""What one request may carry in all: its provider's limits on images and bytes per request (policy layer, pure).

A profile says how many images a request may hold and how many bytes it may be (Anthropic: 100
and 32 MB). An agent's history grows every turn, and fitting can make an image's bytes grow too (a
screenshot scaled down with Lanczos compresses worse as PNG). ``within`` keeps a request inside
both: the oldest images the client inlined give way first, each to its placeholder
(``over_limit``), until the request fits; the newest, what the model is looking at now, stay.
A pure function of the request, the state and what was read or made, like every outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .fold import placeholder_text
from .model import ImageRef, Inlined, InlineOutcome, Outcome, Placeholder, Resolved
from .profile import Profile

#: What a placeholder part adds to a body, at most (its text and its JSON).
PLACEHOLDER_BYTES: Final = 96


def base64_size(size: int) -> int:
    """Characters of base64 for ``size`` bytes."""
    return 4 * -(-size // 3)


def within(profile: Profile | None, request_bytes: int, images: int, refs: Sequence[Outcome],
           inline: Sequence[Inlined], outcomes: Sequence[InlineOutcome]) -> tuple[InlineOutcome, ...]:
    """``outcomes`` (of the images the client inlined, in document order) with the oldest ones
    that are still images replaced by their placeholder until the request holds at most the
    profile's ``max_images`` images and, when its size is known (``request_bytes``: the body as
    the client sent it), at most ``max_request_bytes`` bytes: the body, less each inlined image's
    base64, plus what goes in its place (its variant, or its placeholder), plus the references'
    images. ``images`` counts every image part of the request."""
    out = list(outcomes)
    if profile is None or not inline or (profile.max_images is None and profile.max_request_bytes is None):
        return tuple(out)
    count = images - sum(isinstance(o, Placeholder) for o in (*refs, *out))
    size = request_bytes + sum(base64_size(o.image.bytes) for o in refs if isinstance(o, Resolved)) + sum(
        _sent(image, outcome) - base64_size(image.facts.bytes) for image, outcome in zip(inline, out))
    for index, (image, outcome) in enumerate(zip(inline, out)):
        if _fits(profile, count, size if request_bytes else 0):
            break
        if isinstance(outcome, Placeholder):
            continue
        size -= _sent(image, outcome) - PLACEHOLDER_BYTES
        count -= 1
        out[index] = Placeholder("over_limit", placeholder_text(ImageRef(image.id), "over_limit"))
    return tuple(out)


def _sent(image: Inlined, outcome: InlineOutcome) -> int:
    """The characters an inlined image puts in the body going upstream."""
    if isinstance(outcome, Placeholder):
        return PLACEHOLDER_BYTES
    if isinstance(outcome, Resolved):
        return base64_size(outcome.image.bytes)
    return base64_size(image.facts.bytes)


def _fits(profile: Profile, count: int, size: int) -> bool:
    return (profile.max_images is None or count <= profile.max_images) and \
        (profile.max_request_bytes is None or size <= profile.max_request_bytes)
