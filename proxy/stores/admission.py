"""Image admission: real media type, declared-type agreement, size limits, whole decode (proxy layer).

Pillow identifies the format from the magic bytes and parses the header (width, height); only once
the header passes the limits does admission decode every frame, so a decompression bomb is never
decoded. ``header_info`` (verified reads) stays header-only. Every refusal is an ``ImageRejected``
whose message names the failed check and never carries image bytes or Pillow's text.
"""

from __future__ import annotations

import io
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import msgspec
from PIL import Image, ImageFile

from ...policy.errors import Code, ImageRejected
from ...policy.model import ImageFacts
from ..config import ImageLimits

INVALID_IMAGE: Final = Code.INVALID_IMAGE
MEDIA_TYPE_MISMATCH: Final = Code.MEDIA_TYPE_MISMATCH
IMAGE_TOO_LARGE: Final = Code.IMAGE_TOO_LARGE

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

#: An animation's decode is bounded too: at most this many frames, and frames that add up to at
#: most this many times ``max_pixels`` (each frame costs a whole canvas to decode, about 50 us of
#: overhead besides; 1,000 tiny frames fit in 40 KB).
MAX_FRAMES: Final = 1000
FRAME_PIXELS_FACTOR: Final = 8

_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"
_UNPARSABLE: Final = "not a parsable PNG, JPEG, GIF or WebP image"
_UNDECODABLE: Final = "image data cannot be decoded (truncated or corrupt)"


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
    """Load Pillow's format plugins now (about 15 ms, once per process) and read the header of a
    tiny image of each accepted format, rather than in the first verified read, where a process's
    first request would pay for it."""
    Image.init()
    for kind in ("PNG", "JPEG", "GIF", "WEBP"):
        out = io.BytesIO()
        Image.new("RGB", (2, 2)).save(out, kind)
        header_info(out.getvalue())


@contextmanager
def _quiet_pillow() -> Iterator[None]:
    """Mute Pillow's warnings: DecompressionBombWarning (our limits decide) and metadata remarks
    (corrupt EXIF, a malformed MPO or APNG control chunk). Damaged pixel data raises instead, as
    ``ImageFile.LOAD_TRUNCATED_IMAGES`` is False. Note: catch_warnings swaps the global filter list
    and is not strictly thread-safe before Python 3.14; the only effect of a race is that this
    "ignore" filter may outlive the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def header_info(data: bytes) -> ImageInfo:
    """Detect the format from the magic bytes and read the dimensions from the header.

    No limits are applied. Raises ``ImageRejected``: ``INVALID_IMAGE`` for anything that is not a
    parsable PNG, JPEG, GIF or WebP header; ``IMAGE_TOO_LARGE`` when Pillow's decompression-bomb
    guard refuses the dimensions outright (then the size is not even reported).
    """
    try:
        # Pillow warns (rather than raises) between MAX_IMAGE_PIXELS and twice that.
        with _quiet_pillow(), Image.open(io.BytesIO(data), formats=_FORMATS) as im:
            fmt = im.format
            width, height = im.size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _too_large("image dimensions exceed the decoder's decompression-bomb pixel limit") from None
    except Exception:  # noqa: BLE001 (untrusted input: any parser failure is a bad image)
        # Any parser failure on untrusted input is the client's bad image, never a 500. Pillow's
        # own message is dropped on purpose: it may quote bytes from the file.
        raise ImageRejected(_UNPARSABLE, code=INVALID_IMAGE) from None
    media_type = _MEDIA_TYPE_OF_FORMAT.get(fmt or "")
    if media_type is None or width <= 0 or height <= 0:
        raise ImageRejected(_UNPARSABLE, code=INVALID_IMAGE)
    return ImageInfo(media_type=media_type, width=int(width), height=int(height))


def decode_check(data: bytes, limits: ImageLimits) -> None:
    """Decode every frame of an image whose header already passed the limits; CPU work, so call it
    off the event loop.

    Raises ``ImageRejected``: ``INVALID_IMAGE`` when any frame fails to decode, a PNG chunk fails
    its CRC or IEND is incomplete, a JPEG's markers do not run from SOI to EOI, or a GIF block is
    cut or garbled; ``IMAGE_TOO_LARGE``
    when an animation has more than ``MAX_FRAMES`` frames, a frame outgrows the limits (a GIF frame
    may extend the canvas) or the frames add up to more than ``FRAME_PIXELS_FACTOR`` x max_pixels.
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # Pillow reads this global at load time; set, it would admit truncated images silently.
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set: admission cannot refuse truncated images")
    try:
        with _quiet_pillow(), Image.open(io.BytesIO(data), formats=_FORMATS) as im:
            if im.format == "PNG" and not _png_chunks_intact(data):
                raise ImageRejected("PNG is truncated or a chunk fails its CRC", code=INVALID_IMAGE)
            if im.format in ("JPEG", "MPO") and not _jpeg_markers_complete(data):
                raise ImageRejected("JPEG is truncated or its markers are garbled", code=INVALID_IMAGE)
            frames = int(getattr(im, "n_frames", 1))  # declared in the header but for GIF
            if im.format == "GIF":
                frames = _gif_frames(data)
                if not frames:
                    raise ImageRejected("GIF is truncated or its blocks are garbled", code=INVALID_IMAGE)
            _decode_frames(im, frames, limits)
    except ImageRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _too_large("a frame exceeds the decoder's decompression-bomb pixel limit") from None
    except Exception:  # noqa: BLE001 (as in header_info: never a 500, never Pillow's text)
        raise ImageRejected(_UNDECODABLE, code=INVALID_IMAGE) from None


def _decode_frames(im: Image.Image, frames: int, limits: ImageLimits) -> None:
    """Load frames 0..frames-1, checking each frame's size before its pixels are decoded."""
    if frames > MAX_FRAMES:
        raise _too_large(f"animation has more than {MAX_FRAMES} frames")
    budget = FRAME_PIXELS_FACTOR * limits.max_pixels
    over_budget = f"the {frames} frames add up to over {FRAME_PIXELS_FACTOR} x max_pixels pixels"
    if frames * im.width * im.height > budget:
        raise _too_large(over_budget)
    spent = 0
    for index in range(frames):
        im.seek(index)  # a declared frame that is missing raises EOFError: undecodable
        width, height = im.size  # a GIF frame may extend the canvas
        if max(width, height) > limits.max_side or width * height > limits.max_pixels:
            raise _too_large(f"frame {index} is {width}x{height}, over the max_side or max_pixels limit")
        spent += width * height
        if spent > budget:  # only a GIF whose frames extend the canvas
            raise _too_large(over_budget)
        im.load()


def _png_chunks_intact(data: bytes) -> bool:
    """Every chunk up to and including IEND is complete and matches its CRC (Pillow skips the CRC
    of image data chunks and of IEND). Bytes after IEND are ignored, as decoders ignore them."""
    view = memoryview(data)
    pos, end = len(_PNG_SIGNATURE), len(data)
    while pos + 12 <= end:
        length = int.from_bytes(view[pos:pos + 4], "big")
        crc_at = pos + 8 + length
        if crc_at + 4 > end:
            return False
        if zlib.crc32(view[pos + 4:crc_at]) != int.from_bytes(view[crc_at:crc_at + 4], "big"):
            return False
        if data[pos + 4:pos + 8] == b"IEND":
            return True
        pos = crc_at + 4
    return False


def _jpeg_markers_complete(data: bytes) -> bool:
    """The markers are well formed from SOI to EOI. Pillow stops once every row is decoded, so it
    never sees a missing EOI or garbage after enough scan data. Bytes after EOI are ignored (an MPO
    keeps its second picture there; Pillow decodes that one as a frame)."""
    end, pos = len(data), 2
    while True:
        if pos >= end or data[pos] != 0xFF:
            return False
        while pos < end and data[pos] == 0xFF:  # fill bytes may precede a marker
            pos += 1
        if pos >= end:
            return False
        code = data[pos]
        if code == 0xD9:  # EOI
            return True
        if code < 0xC0 or 0xD0 <= code <= 0xD8:  # reserved, or a marker that has no place here
            return False
        if pos + 3 > end or int.from_bytes(data[pos + 1:pos + 3], "big") < 2:
            return False
        pos += 1 + int.from_bytes(data[pos + 1:pos + 3], "big")
        if code == 0xDA:  # SOS: entropy-coded data, where FF is stuffed (FF 00) or a restart (FF D0-D7)
            while True:
                pos = data.find(b"\xff", pos)
                if pos < 0 or pos + 1 >= end:
                    return False
                if data[pos + 1] and not 0xD0 <= data[pos + 1] <= 0xD7:
                    break
                pos += 2


def _gif_frames(data: bytes) -> int:
    """Count the images of a GIF whose blocks are all complete; 0 when one is cut or garbled.

    The GIF ends at its trailer, or (as some old encoders write it) at the end of the data right
    after an image. Pillow takes any end of the data for the end of the animation, so a GIF cut
    inside a frame's header would otherwise pass as a shorter one. Counting stops past
    ``MAX_FRAMES``. Bytes after the trailer are ignored.
    """
    end = len(data)
    if end < 13:
        return 0
    pos = 13 + ((3 << ((data[10] & 7) + 1)) if data[10] & 0x80 else 0)  # after the global color table
    frames, after_image = 0, False
    while pos < end and frames <= MAX_FRAMES:
        block = data[pos]
        if block == 0x3B:  # trailer
            return frames
        if block == 0x21:  # extension: introducer, label, sub-blocks
            pos += 2
        elif block == 0x2C and pos + 10 <= end:  # image: descriptor, local color table, LZW code size
            flags = data[pos + 9]
            pos += 11 + ((3 << ((flags & 7) + 1)) if flags & 0x80 else 0)
            frames += 1
        else:
            return 0
        while pos < end and data[pos]:  # data sub-blocks up to the empty terminator
            pos += data[pos] + 1
        pos += 1
        after_image = block == 0x2C
    return frames if frames > MAX_FRAMES or (pos == end and after_image) else 0


#: Formats an image a client inlines may come in beyond the four every provider takes: recognised,
#: so that fitting converts them (to PNG) rather than losing them to a placeholder.
_CONVERTIBLE: Final = {"BMP": "image/bmp", "TIFF": "image/tiff"}


def image_facts(data: bytes) -> ImageFacts:
    """What ``data`` is, for fitting an image a client inlined: its media type by its magic bytes
    and header, its size and dimensions; ``media_type`` None when it is no image or cut short (a
    PNG whose chunks do not run to IEND with their CRCs, a JPEG whose markers do not reach EOI, a
    GIF cut inside a block, a WebP whose RIFF size disagrees with its length). A header parse and
    a pass over the bytes, no decode of the pixels: once per new identity."""
    try:
        info = header_info(data)
    except ImageRejected as rejected:
        return _past_the_decoder(data) if rejected.code == IMAGE_TOO_LARGE else _convertible(data)
    if not _whole(data, info.media_type):
        return ImageFacts(None, len(data))
    return ImageFacts(info.media_type, len(data), info.width, info.height)


def _whole(data: bytes, media_type: str) -> bool:
    """Whether an image whose header parsed runs to its end (``image_facts``)."""
    if media_type == "image/png":
        return _png_chunks_intact(data)
    if media_type == "image/jpeg":
        return _jpeg_markers_complete(data)
    if media_type == "image/gif":
        return _gif_frames(data) > 0
    return int.from_bytes(data[4:8], "little") + 8 <= len(data)  # WebP: its RIFF size


#: Magic bytes of the formats an image too large for the decoder is still known by.
_MAGIC: Final = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"))


def _past_the_decoder(data: bytes) -> ImageFacts:
    """The facts of an image whose dimensions the decoder refuses outright (a decompression bomb,
    or a real image past 178 million pixels): it is an image, by its magic bytes, never "no
    image"; a PNG's dimensions are read from its IHDR (else 0: it then goes as it came)."""
    media_type = next((kind for magic, kind in _MAGIC if data.startswith(magic)), None)
    if media_type is None and data[8:12] == b"WEBP":
        media_type = "image/webp"
    if media_type == "image/png" and data[12:16] == b"IHDR":
        return ImageFacts(media_type, len(data), int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big"))
    return ImageFacts(media_type, len(data))


def _convertible(data: bytes) -> ImageFacts:
    """The facts of a BMP or TIFF (``_CONVERTIBLE``); of no image for anything else."""
    try:
        with _quiet_pillow(), Image.open(io.BytesIO(data), formats=list(_CONVERTIBLE)) as im:
            media_type, (width, height) = _CONVERTIBLE.get(im.format or ""), im.size
    except Exception:  # noqa: BLE001 (untrusted input: any parser failure is no image)
        return ImageFacts(None, len(data))
    cut = media_type == "image/bmp" and int.from_bytes(data[2:6], "little") > len(data)  # its declared size
    if media_type is None or cut or width <= 0 or height <= 0:
        return ImageFacts(None, len(data))
    return ImageFacts(media_type, len(data), int(width), int(height))


def inspect_image(data: bytes, declared_type: str | None, limits: ImageLimits) -> ImageInfo:
    """Validate bytes offered for admission and return what they are.

    Order: byte size (before any parsing), header (``INVALID_IMAGE``), declared type
    (``MEDIA_TYPE_MISMATCH``), longest side and pixel count (``IMAGE_TOO_LARGE``, 413), then the
    whole decode (``decode_check``). ``declared_type`` of None or ``application/octet-stream``
    means "not declared". CPU work in proportion to the pixels: call it off the event loop.
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
    decode_check(data, limits)
    return info
