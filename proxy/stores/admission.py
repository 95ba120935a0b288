"""Image admission: real media type, declared-type agreement and size limits (proxy layer).

Pillow identifies the format from the magic bytes and parses only the header (width, height); no
pixel data is decoded. Every refusal is an ``ImageRejected`` whose message names the failed check
and never carries image bytes.
"""

from __future__ import annotations

import io
import warnings
from typing import Final

import msgspec
from PIL import Image

from projectionist.policy.errors import ImageRejected
from projectionist.proxy.config import ImageLimits

INVALID_IMAGE: Final = "INVALID_IMAGE"
MEDIA_TYPE_MISMATCH: Final = "MEDIA_TYPE_MISMATCH"
IMAGE_TOO_LARGE: Final = "IMAGE_TOO_LARGE"

#: The only Pillow formats admission tries, in detection order.
_FORMATS: Final = ["PNG", "JPEG", "GIF", "WEBP"]

#: Pillow format name -> media type. A JPEG carrying multi-picture data opens as "MPO".
_MEDIA_TYPE_OF_FORMAT: Final = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "MPO": "image/jpeg",
    "GIF": "image/gif",
    "WEBP": "image/webp",
}

#: Declared types that say nothing about the content.
_UNDECLARED: Final = frozenset({"", "application/octet-stream"})
_ALIASES: Final = {"image/jpg": "image/jpeg"}


class ImageInfo(msgspec.Struct, frozen=True):
    """What the header says: detected media type and pixel dimensions."""

    media_type: str
    width: int
    height: int


def _too_large(message: str) -> ImageRejected:
    return ImageRejected(message, code=IMAGE_TOO_LARGE, status=413)


def normalize_declared_type(declared_type: str | None) -> str | None:
    """Canonical declared media type, or None when nothing meaningful was declared.

    Parameters (``; charset=...``) and case are ignored; ``image/jpg`` means ``image/jpeg``.
    """
    if declared_type is None:
        return None
    media_type = declared_type.split(";", 1)[0].strip().lower()
    if media_type in _UNDECLARED:
        return None
    return _ALIASES.get(media_type, media_type)


def warm_up() -> None:
    """Load Pillow's format plugins now (about 15 ms, once per process) rather than in the first
    verified read, where a process's first request would pay for it."""
    Image.init()


def header_info(data: bytes) -> ImageInfo:
    """Detect the format from the magic bytes and read the dimensions from the header.

    No limits are applied. Raises ``ImageRejected``: ``INVALID_IMAGE`` for anything that is not a
    parsable PNG, JPEG, GIF or WebP header; ``IMAGE_TOO_LARGE`` when Pillow's decompression-bomb
    guard refuses the dimensions outright (then the size is not even reported).
    """
    try:
        # Pillow warns (rather than raises) between MAX_IMAGE_PIXELS and twice that; our own
        # limits decide, so the warning is noise here. Note: catch_warnings swaps the global
        # filter list and is not strictly thread-safe before Python 3.14; the only effect of a
        # race is that this "ignore" filter may outlive the block.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=_FORMATS) as im:
                fmt = im.format
                width, height = im.size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _too_large("image dimensions exceed the decoder's decompression-bomb pixel limit") from None
    except Exception:
        # Any parser failure on untrusted input is the client's bad image, never a 500. Pillow's
        # own message is dropped on purpose: it may quote bytes from the file.
        raise ImageRejected("not a parsable PNG, JPEG, GIF or WebP image", code=INVALID_IMAGE) from None
    media_type = _MEDIA_TYPE_OF_FORMAT.get(fmt or "")
    if media_type is None or width <= 0 or height <= 0:
        raise ImageRejected("not a parsable PNG, JPEG, GIF or WebP image", code=INVALID_IMAGE)
    return ImageInfo(media_type=media_type, width=int(width), height=int(height))


def inspect_image(data: bytes, declared_type: str | None, limits: ImageLimits) -> ImageInfo:
    """Validate bytes offered for admission and return what they are.

    Order: byte size (before any parsing), header (``INVALID_IMAGE``), declared type
    (``MEDIA_TYPE_MISMATCH``), longest side and pixel count (``IMAGE_TOO_LARGE``, 413).
    ``declared_type`` of None or ``application/octet-stream`` means "not declared".
    """
    size = len(data)
    if size > limits.max_bytes:
        raise _too_large(f"image is {size} bytes, over the max_bytes limit of {limits.max_bytes}")
    declared = normalize_declared_type(declared_type)
    info = header_info(data)
    if declared is not None and declared != info.media_type:
        shown = declared if len(declared) <= 64 else declared[:64] + "..."
        raise ImageRejected(
            f"declared media type {shown!r} does not match detected {info.media_type!r}",
            code=MEDIA_TYPE_MISMATCH,
        )
    longest = max(info.width, info.height)
    if longest > limits.max_side:
        raise _too_large(
            f"image is {info.width}x{info.height}, a side exceeds the max_side limit of {limits.max_side}"
        )
    pixels = info.width * info.height
    if pixels > limits.max_pixels:
        raise _too_large(f"image has {pixels} pixels, over the max_pixels limit of {limits.max_pixels}")
    return info
