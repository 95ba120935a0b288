"""What a provider accepts in images, and what it says when it refuses one (policy layer, pure).

A ``Profile`` is pure data: each adapter declares its provider's (``PROFILE``), with the
documentation it comes from. ``breaks`` says whether an image fits a profile as it is; the
projection sends a variant that fits when it does not. ``under`` narrows a profile by the rules
refusals taught about one upstream and model (``events.Learnt``). A ``Rejection`` is an adapter's
reading of an upstream error that refused an image (``rejection(status, doc)``): its content
(``rejected``), or a URL the provider could not fetch (``not_found``, ``read_failed``), or the
context the images came in (``context``: a rule about the request, not about any image); the
policy decides which image it was, or records the rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

import msgspec

from .events import Learnt
from .linked import Unfetched

#: What a refusal about the context of the images, or a limit of the target, says (``Learnt.rule``):
#: the many-image rule (a smaller side once a request holds many images), a smaller side or byte
#: limit per image than the profile knows, or a model that takes no images.
Context = Literal["many_images", "image_side", "image_bytes", "no_images"]

#: Why an image does not fit a profile as it is.
Misfit = Literal["type", "bytes", "side", "pixels"]


class Profile(msgspec.Struct, frozen=True):
    """The image limits of one provider's API, each ``None`` when the provider documents none.

    ``max_image_bytes`` counts the image's own (decoded) bytes; a limit the provider states on
    the base64 text is converted by its adapter. A request holding more than ``many_images``
    images has the smaller ``many_images_max_side`` (Anthropic's many-image rule)."""

    name: str
    media_types: tuple[str, ...]
    max_image_bytes: int | None = None
    max_request_bytes: int | None = None
    max_side: int | None = None
    max_pixels: int | None = None
    max_images: int | None = None
    many_images: int | None = None
    many_images_max_side: int | None = None
    sources: tuple[str, ...] = ()

    def side_limit(self, images: int) -> int | None:
        """The longest side allowed in a request holding ``images`` images."""
        if self.many_images is not None and images > self.many_images and self.many_images_max_side is not None:
            return min(self.many_images_max_side, self.max_side or self.many_images_max_side)
        return self.max_side

    def target(self, images: int) -> str:
        """The name of what a variant for a request of ``images`` images must fit: the profile
        and its side limit there (``anthropic@8000``, ``anthropic@2000``). Variants are made,
        stored and pinned per target."""
        return f"{self.name}@{self.side_limit(images) or 'any'}"


class Rejection(msgspec.Struct, frozen=True):
    """An upstream answer that refused an image: the provider's own message, and the JSON pointer
    of the refused image part in the upstream body when the error names one (``site``, e.g.
    ``/messages/11/content/8``), else None ("some image of this request"). ``failure`` says what
    was refused: the image's content (``rejected``), or, for an image the provider fetches by URL,
    the fetch (``not_found``: gone, expired, denied; ``read_failed``: a timeout, a transient fault)."""

    message: str
    site: str | None = None
    failure: Literal["rejected"] | Unfetched = "rejected"
    #: A refusal about the request as a whole or a limit of the target (the images stay images
    #: elsewhere): which rule, the side it allows (``many_images``, ``image_side``) and the bytes
    #: per image (``image_bytes``, decoded), 0 where the answer does not say.
    context: Context | None = None
    side: int = 0
    bytes: int = 0


#: An open profile: anything goes (an upstream whose limits are unknown).
OPEN: Final = Profile("open", ("image/png", "image/jpeg", "image/gif", "image/webp"))


def breaks(profile: Profile, media_type: str, size: int, width: int, height: int, images: int = 1) -> Misfit | None:
    """Why an image of this type, byte size and dimensions does not fit ``profile`` in a request
    of ``images`` images, or None when it fits as it is."""
    if media_type not in profile.media_types:
        return "type"
    if profile.max_image_bytes is not None and size > profile.max_image_bytes:
        return "bytes"
    side = profile.side_limit(images)
    if side is not None and max(width, height) > side:
        return "side"
    if profile.max_pixels is not None and width * height > profile.max_pixels:
        return "pixels"
    return None


def under(profile: Profile, rules: Iterable[Learnt]) -> Profile:
    """``profile`` narrowed by the rules learnt for an upstream and model, each the stricter of
    what it says and what the profile says: ``many_images`` (from the learnt count of images on,
    no side over the learnt side), ``image_side`` and ``image_bytes``. Other rules leave it as it is."""
    narrowed = profile
    for rule in rules:
        narrowed = _narrowed(narrowed, rule)
    return narrowed


def _narrowed(profile: Profile, rule: Learnt) -> Profile:
    replace = msgspec.structs.replace
    if rule.rule == "many_images" and rule.images >= 1 and rule.side >= 1:
        many = rule.images - 1 if profile.many_images is None else min(rule.images - 1, profile.many_images)
        return replace(profile, many_images=many, many_images_max_side=_least(profile.many_images_max_side, rule.side))
    if rule.rule == "image_side" and rule.side >= 1:
        return replace(profile, max_side=_least(profile.max_side, rule.side),
                       many_images_max_side=_least(profile.many_images_max_side, rule.side)
                       if profile.many_images_max_side is not None else None)
    if rule.rule == "image_bytes" and rule.bytes >= 1 and rule.bytes < (profile.max_image_bytes or rule.bytes + 1):
        # the name says the byte limit, so its variants are made, stored and pinned apart
        return replace(profile, name=f"{profile.name.split('-b', 1)[0]}-b{rule.bytes}", max_image_bytes=rule.bytes)
    return profile


def _least(limit: int | None, learnt: int) -> int:
    return learnt if limit is None else min(limit, learnt)


def takes_images(rules: Iterable[Learnt]) -> bool:
    """Whether the model the rules were learnt for takes images at all (no ``no_images`` rule)."""
    return not any(rule.rule == "no_images" for rule in rules)
