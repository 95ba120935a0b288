"""What a provider accepts in images, and what it says when it refuses one (policy layer, pure).

A ``Profile`` is pure data: each adapter declares its provider's (``PROFILE``), with the
documentation it comes from. ``breaks`` says whether a stored image fits a profile as it is; the
projection sends a variant that fits when it does not. A ``Rejection`` is an adapter's reading of
an upstream error that refused an image (``rejection(status, doc)``): its content (``rejected``),
or a URL the provider could not fetch (``not_found``, ``read_failed``); the policy decides which
image it was.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from .linked import Unfetched

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
