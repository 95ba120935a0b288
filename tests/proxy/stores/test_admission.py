"""Admission: magic-byte detection, declared-type agreement, limits, Pillow's bomb guard, whole decode."""

from __future__ import annotations

import io
import random
import struct
import warnings
import zlib
from collections.abc import Callable

import pytest
from PIL import Image, ImageFile, ImageSequence

from projectionist.policy.errors import ImageRejected
from projectionist.proxy.config import ImageLimits
from projectionist.proxy.stores import admission
from projectionist.proxy.stores.admission import (
    ImageInfo,
    decode_check,
    header_info,
    inspect_image,
    normalize_declared_type,
)
from tests.imaging import FORMATS, make_image

MEDIA_TYPES = list(FORMATS)
LIMITS = ImageLimits()


def _bmp(width: int = 4, height: int = 3) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, format="BMP")
    return buf.getvalue()


@pytest.mark.parametrize("media_type", MEDIA_TYPES)
def test_each_format_is_detected_with_its_dimensions(media_type: str) -> None:
    data = make_image(7, 5, media_type)
    expected = ImageInfo(media_type=media_type, width=7, height=5)
    assert header_info(data) == expected
    assert inspect_image(data, None, LIMITS) == expected
    assert inspect_image(data, media_type, LIMITS) == expected


def test_jpeg_with_multi_picture_data_is_jpeg() -> None:
    # Pillow opens a JPEG carrying MPF data as format "MPO"; it is still image/jpeg.
    buf = io.BytesIO()
    first, second = Image.new("RGB", (6, 2)), Image.new("RGB", (6, 2), (255, 0, 0))
    first.save(buf, format="MPO", save_all=True, append_images=[second])
    assert inspect_image(buf.getvalue(), "image/jpeg", LIMITS) == ImageInfo("image/jpeg", 6, 2)


@pytest.mark.parametrize(
    ("actual", "declared"),
    [
        ("image/png", "image/jpeg"),
        ("image/jpeg", "image/png"),
        ("image/gif", "image/webp"),
        ("image/webp", "image/gif"),
        ("image/png", "image/jpg"),
        ("image/png", "text/plain"),
        ("image/png", "image/svg+xml"),
    ],
)
def test_declared_type_must_agree_with_magic_bytes(actual: str, declared: str) -> None:
    with pytest.raises(ImageRejected) as info:
        inspect_image(make_image(media_type=actual), declared, LIMITS)
    assert info.value.code == "MEDIA_TYPE_MISMATCH"
    assert info.value.status == 400
    assert actual in info.value.message


@pytest.mark.parametrize(
    ("media_type", "declared"),
    [
        ("image/jpeg", "image/jpg"),
        ("image/jpeg", "IMAGE/JPG"),
        ("image/png", "image/png; charset=binary"),
        ("image/png", " Image/PNG "),
        ("image/gif", "application/octet-stream"),
        ("image/webp", "application/octet-stream; foo=bar"),
        ("image/webp", ""),
        ("image/png", None),
    ],
)
def test_declared_type_normalisation_accepts(media_type: str, declared: str | None) -> None:
    assert inspect_image(make_image(media_type=media_type), declared, LIMITS).media_type == media_type


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        (None, None),
        ("", None),
        ("application/octet-stream", None),
        ("image/jpg", "image/jpeg"),
        ("image/PNG;q=1", "image/png"),
        ("text/plain", "text/plain"),
    ],
)
def test_normalize_declared_type(declared: str | None, expected: str | None) -> None:
    assert normalize_declared_type(declared) == expected


PNG = make_image(media_type="image/png")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"hello, this is plain text SECRET", id="text"),
        pytest.param(PNG[:20], id="truncated-png-header"),
        pytest.param(PNG[:8] + b"SECRET" * 10, id="png-magic-then-garbage"),
        pytest.param(b"\xff\xd8\xff" + b"SECRET" * 10, id="jpeg-magic-then-garbage"),
        pytest.param(b"GIF89a", id="gif-magic-only"),
        pytest.param(b"RIFF\x10\x00\x00\x00WEBPSECRET", id="webp-magic-then-garbage"),
        pytest.param(_bmp(), id="bmp-unsupported-format"),
    ],
)
def test_non_images_are_invalid(data: bytes) -> None:
    calls: list[Callable[[], ImageInfo]] = [
        lambda: inspect_image(data, None, LIMITS),
        lambda: header_info(data),
    ]
    for call in calls:
        with pytest.raises(ImageRejected) as info:
            call()
        assert info.value.code == "INVALID_IMAGE"
        assert info.value.status == 400
        assert "SECRET" not in str(info.value)


def test_unsupported_format_is_invalid_even_when_declared() -> None:
    with pytest.raises(ImageRejected) as info:
        inspect_image(_bmp(), "image/bmp", LIMITS)
    assert info.value.code == "INVALID_IMAGE"


@pytest.mark.parametrize(
    ("width", "height", "limits", "limit_name"),
    [
        (10, 10, ImageLimits(max_pixels=99), "max_pixels"),
        (10, 3, ImageLimits(max_side=9), "max_side"),
        (3, 10, ImageLimits(max_side=9), "max_side"),
    ],
)
@pytest.mark.parametrize("media_type", MEDIA_TYPES)
def test_dimension_limits(width: int, height: int, limits: ImageLimits, limit_name: str, media_type: str) -> None:
    data = make_image(width, height, media_type)
    with pytest.raises(ImageRejected) as info:
        inspect_image(data, media_type, limits)
    assert info.value.code == "IMAGE_TOO_LARGE"
    assert info.value.status == 413
    assert limit_name in info.value.message


@pytest.mark.parametrize(
    "limits",
    [ImageLimits(max_pixels=100), ImageLimits(max_side=10), ImageLimits(max_pixels=100, max_side=10)],
)
def test_dimension_limits_are_inclusive(limits: ImageLimits) -> None:
    assert inspect_image(make_image(10, 10), None, limits) == ImageInfo("image/png", 10, 10)


def test_byte_limit_is_inclusive_and_413_above() -> None:
    data = make_image(media_type="image/jpeg")
    assert inspect_image(data, None, ImageLimits(max_bytes=len(data))).media_type == "image/jpeg"
    with pytest.raises(ImageRejected) as info:
        inspect_image(data, None, ImageLimits(max_bytes=len(data) - 1))
    assert info.value.code == "IMAGE_TOO_LARGE"
    assert info.value.status == 413
    assert "max_bytes" in info.value.message


def test_byte_limit_is_checked_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_open(*args: object, **kwargs: object) -> None:
        raise AssertionError("Image.open must not be called for oversized data")

    monkeypatch.setattr(Image, "open", no_open)
    with pytest.raises(ImageRejected) as info:
        inspect_image(b"not an image at all", None, ImageLimits(max_bytes=5))
    assert info.value.code == "IMAGE_TOO_LARGE"


def test_type_mismatch_is_reported_before_limits() -> None:
    data = make_image(10, 10, "image/gif")
    with pytest.raises(ImageRejected) as info:
        inspect_image(data, "image/png", ImageLimits(max_side=2))
    assert info.value.code == "MEDIA_TYPE_MISMATCH"


def test_bomb_warning_is_suppressed_and_our_limits_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # 12 pixels: Pillow warns, does not raise
    data = make_image(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert inspect_image(data, None, LIMITS) == ImageInfo("image/png", 4, 3)
        with pytest.raises(ImageRejected) as info:
            inspect_image(data, None, ImageLimits(max_pixels=11))
    assert info.value.code == "IMAGE_TOO_LARGE"
    assert "max_pixels" in info.value.message


def test_bomb_error_maps_to_image_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # 25 pixels > 2 * 10: Pillow raises
    data = make_image(5, 5)
    calls: list[Callable[[], ImageInfo]] = [
        lambda: inspect_image(data, None, LIMITS),
        lambda: header_info(data),
    ]
    for call in calls:
        with pytest.raises(ImageRejected) as info:
            call()
        assert info.value.code == "IMAGE_TOO_LARGE"
        assert info.value.status == 413


def test_image_info_is_frozen() -> None:
    info = header_info(PNG)
    with pytest.raises(AttributeError):
        info.width = 1  # type: ignore[misc]


# -- the whole decode --------------------------------------------------------------------------------
#
# Admission decodes every frame once the header passed the limits. Verified against Pillow 13 with
# ImageFile.LOAD_TRUNCATED_IMAGES False, on these cases:
#
#   corruption                 PNG/APNG    JPEG (baseline, progressive)   GIF (still, animated)   WebP (lossy, lossless, animated)
#   cut anywhere               refused     refused                        refused (a)             refused
#   bad CRC (IHDR/IDAT/IEND)   refused     no CRC in the format           no CRC                  no CRC
#   IDAT cut, chunk re-framed  refused     -                              -                       -
#   end marker missing         refused     refused (no EOI)               admitted (a)            refused
#   garbage after the header   refused     refused                        refused                 refused
#   bytes after the end        admitted    admitted                       admitted                admitted
#
# (a) A GIF may end right after an image without its trailer (old encoders do), so a cut exactly
# at a frame boundary reads as a shorter, complete animation. A bit flipped inside JPEG, GIF or
# WebP compressed data usually still decodes (no checksum); a PNG's CRCs catch every flip.

SECRET = b"SECRET" * 200


def _noisy(width: int, height: int, seed: int) -> Image.Image:
    """Random pixels: compressed data that fills the file, so a cut lands inside it."""
    return Image.frombytes("RGB", (width, height), random.Random(seed).randbytes(width * height * 3))


def _encode(fmt: str, frames: int = 1, size: tuple[int, int] = (24, 18), **options: object) -> bytes:
    buf = io.BytesIO()
    images = [_noisy(*size, seed=seed) for seed in range(frames)]
    if frames > 1:
        options.update(save_all=True, append_images=images[1:])
    images[0].save(buf, format=fmt, **options)
    return buf.getvalue()


SAMPLES = {
    "png": _encode("PNG"),
    "apng": _encode("PNG", frames=3),
    "jpeg": _encode("JPEG"),
    "progressive-jpeg": _encode("JPEG", progressive=True),
    "gif": _encode("GIF"),
    "animated-gif": _encode("GIF", frames=3),
    "webp": _encode("WEBP"),
    "lossless-webp": _encode("WEBP", lossless=True),
    "animated-webp": _encode("WEBP", frames=3),
}


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    chunks, pos = [], 8
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        chunks.append((data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]))
        pos += 12 + length
    return chunks


def _png(chunks: list[tuple[bytes, bytes]]) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + b"".join(
        struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body)) for kind, body in chunks)


def _idat_cut(data: bytes) -> bytes:
    """The image data chunk holds half its data but is well framed (length and CRC recomputed)."""
    return _png([(kind, body[:len(body) // 2] if kind == b"IDAT" else body) for kind, body in _png_chunks(data)])


def _bad_crc(data: bytes, kind: bytes) -> bytes:
    at = data.index(kind)
    crc_at = at + 4 + struct.unpack(">I", data[at - 4:at])[0]
    return data[:crc_at] + bytes([data[crc_at] ^ 1]) + data[crc_at + 1:]


def _garbage_after(data: bytes, header_end: int) -> bytes:
    return data[:header_end] + SECRET[:len(data) - header_end]


def _gif_images(data: bytes) -> list[int]:
    """Where the image descriptors of a well-formed GIF are (the test's own reading of the format)."""
    def table(flags: int) -> int:
        return (3 << ((flags & 7) + 1)) if flags & 0x80 else 0

    found, pos = [], 13 + table(data[10])
    while data[pos] != 0x3B:
        if data[pos] == 0x2C:
            found.append(pos)
            pos += 11 + table(data[pos + 9])
        else:
            pos += 2
        while data[pos]:
            pos += data[pos] + 1
        pos += 1
    return found


PNG_NOISY, JPEG_NOISY, GIF_NOISY, WEBP_NOISY = (SAMPLES[k] for k in ("png", "jpeg", "gif", "webp"))
AGIF = SAMPLES["animated-gif"]
CORRUPT = [
    # (id, bytes, whether the header alone still parses)
    ("png-cut-in-half", PNG_NOISY[:len(PNG_NOISY) // 2], True),
    ("png-idat-cut", _idat_cut(PNG_NOISY), True),
    ("png-bad-crc-ihdr", _bad_crc(PNG_NOISY, b"IHDR"), False),
    ("png-bad-crc-idat", _bad_crc(PNG_NOISY, b"IDAT"), True),
    ("png-bad-crc-iend", _bad_crc(PNG_NOISY, b"IEND"), True),
    ("png-iend-missing", PNG_NOISY[:-12], True),
    ("png-iend-crc-cut", PNG_NOISY[:-1], True),
    ("png-garbage-after-header", _garbage_after(PNG_NOISY, 8 + 25 + 8), True),
    ("apng-cut-in-frame-2", SAMPLES["apng"][:len(SAMPLES["apng"]) // 2], True),
    ("jpeg-cut-in-scan", JPEG_NOISY[:(JPEG_NOISY.index(b"\xff\xda") + len(JPEG_NOISY)) // 2], True),
    ("jpeg-eoi-missing", JPEG_NOISY[:-2], True),
    ("jpeg-garbage-after-header", _garbage_after(JPEG_NOISY, JPEG_NOISY.index(b"\xff\xda") + 14), True),
    ("progressive-jpeg-cut", SAMPLES["progressive-jpeg"][:len(SAMPLES["progressive-jpeg"]) // 2], True),
    ("progressive-jpeg-cut-then-eoi",
     SAMPLES["progressive-jpeg"][:len(SAMPLES["progressive-jpeg"]) // 2] + b"\xff\xd9", True),
    ("gif-cut-in-image-data", GIF_NOISY[:(_gif_images(GIF_NOISY)[0] + len(GIF_NOISY)) // 2], True),
    ("gif-garbage-after-header", _garbage_after(GIF_NOISY, _gif_images(GIF_NOISY)[0] + 11), True),
    ("animated-gif-frame-2-cut", AGIF[:_gif_images(AGIF)[1] + 1000], True),
    ("animated-gif-frame-2-header-cut", AGIF[:_gif_images(AGIF)[1] + 5], True),
    ("animated-gif-frame-2-cut-then-trailer", AGIF[:_gif_images(AGIF)[1] + 1000] + b";", True),
    ("webp-cut-in-half", WEBP_NOISY[:len(WEBP_NOISY) // 2], False),
    ("webp-garbage-after-header", _garbage_after(WEBP_NOISY, 30), True),
    ("lossless-webp-garbage-after-header", _garbage_after(SAMPLES["lossless-webp"], 30), False),
    ("animated-webp-cut", SAMPLES["animated-webp"][:len(SAMPLES["animated-webp"]) * 2 // 3], False),
]


@pytest.mark.parametrize(("data", "header_parses"), [pytest.param(d, h, id=i) for i, d, h in CORRUPT])
def test_undecodable_images_are_invalid(data: bytes, header_parses: bool) -> None:
    if header_parses:
        header_info(data)  # reads stay header-only: this is what only the decode catches
    with pytest.raises(ImageRejected) as info:
        inspect_image(data, None, LIMITS)
    assert (info.value.code, info.value.status) == ("INVALID_IMAGE", 400)
    assert "SECRET" not in str(info.value)
    assert info.value.__cause__ is None  # Pillow's own text is dropped, never chained
    assert info.value.__context__ is None or info.value.__suppress_context__


@pytest.mark.parametrize("name", [n for n in SAMPLES if "gif" not in n])
def test_every_truncation_is_invalid(name: str) -> None:
    data = SAMPLES[name]
    admitted = [cut for cut in range(1, len(data)) if _admits(data[:cut])]
    assert admitted == []


@pytest.mark.parametrize("name", ["gif", "animated-gif"])
def test_a_gif_cut_is_invalid_unless_it_ends_between_frames(name: str) -> None:
    data = SAMPLES[name]
    frames = _frames(data)
    admitted = [cut for cut in range(1, len(data)) if _admits(data[:cut])]
    assert len(admitted) == len(frames)  # one cut after each frame: the last one drops the trailer
    for kept, cut in enumerate(admitted, start=1):
        assert _frames(data[:cut]) == frames[:kept]  # a shorter animation, every frame whole


def _admits(data: bytes) -> bool:
    try:
        inspect_image(data, None, LIMITS)
    except ImageRejected as exc:
        assert exc.code == "INVALID_IMAGE", exc.message
        return False
    return True


def _frames(data: bytes) -> list[bytes]:
    with Image.open(io.BytesIO(data)) as im:
        return [frame.convert("RGB").tobytes() for frame in ImageSequence.Iterator(im)]


@pytest.mark.parametrize("name", list(SAMPLES))
def test_valid_images_and_animations_are_admitted(name: str) -> None:
    data = SAMPLES[name]
    info = inspect_image(data, None, LIMITS)
    assert (info.width, info.height) == (24, 18)
    assert len(_frames(data)) == (3 if name.startswith(("apng", "animated")) else 1)


@pytest.mark.parametrize("name", list(SAMPLES))
def test_bytes_after_the_end_are_admitted(name: str) -> None:
    # Decoders stop at the end marker (IEND, EOI, the GIF trailer, the RIFF size), so do we.
    assert inspect_image(SAMPLES[name] + SECRET, None, LIMITS) == inspect_image(SAMPLES[name], None, LIMITS)


def test_a_gif_without_its_trailer_is_admitted() -> None:
    # Old encoders end a GIF right after its last image (CPython's own IDLE icons do).
    assert inspect_image(GIF_NOISY[:-1], "image/gif", LIMITS) == ImageInfo("image/gif", 24, 18)


def test_limits_are_checked_before_any_pixel_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[object] = []
    original = ImageFile.ImageFile.load

    def spy(self: ImageFile.ImageFile) -> object:
        loads.append(self)
        return original(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    for media_type in MEDIA_TYPES:
        with pytest.raises(ImageRejected) as info:
            inspect_image(make_image(20, 20, media_type), None, ImageLimits(max_pixels=399))
        assert info.value.code == "IMAGE_TOO_LARGE"
        header_info(make_image(20, 20, media_type))
    assert loads == []
    inspect_image(make_image(20, 20), None, LIMITS)
    assert loads  # the spy does see a decode


@pytest.mark.parametrize("name", ["apng", "animated-gif", "animated-webp"])
def test_animation_over_the_frame_limit_is_too_large(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "MAX_FRAMES", 2)
    with pytest.raises(ImageRejected) as info:
        inspect_image(SAMPLES[name], None, LIMITS)
    assert (info.value.code, info.value.status) == ("IMAGE_TOO_LARGE", 413)
    assert "more than 2 frames" in info.value.message


@pytest.mark.parametrize("name", ["apng", "animated-gif", "animated-webp"])
def test_animation_over_the_frame_pixel_budget_is_too_large(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 3 frames of 24x18 = 432 pixels: 1,296 in all, each frame within max_pixels.
    monkeypatch.setattr(admission, "FRAME_PIXELS_FACTOR", 2)
    assert inspect_image(SAMPLES[name], None, ImageLimits(max_pixels=648))
    with pytest.raises(ImageRejected) as info:
        inspect_image(SAMPLES[name], None, ImageLimits(max_pixels=647))
    assert info.value.code == "IMAGE_TOO_LARGE"
    assert "3 frames add up" in info.value.message


def test_a_gif_frame_that_outgrows_the_limits_is_too_large() -> None:
    # Frame 2 moved right by 10 pixels: Pillow grows the canvas to 34 wide when it reaches it.
    at = _gif_images(AGIF)[1]
    moved = AGIF[:at + 1] + struct.pack("<H", 10) + AGIF[at + 3:]
    assert inspect_image(moved, None, LIMITS) == ImageInfo("image/gif", 24, 18)
    with pytest.raises(ImageRejected) as info:
        inspect_image(moved, None, ImageLimits(max_side=30))
    assert info.value.code == "IMAGE_TOO_LARGE"
    assert "frame 1 is 34x18" in info.value.message  # frames count from 0


def test_pillow_warnings_about_metadata_do_not_leak_or_refuse() -> None:
    exif = Image.Exif()
    exif[0x010E] = "x" * 200  # a description stored at an offset that the cut below loses
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="JPEG", exif=exif.tobytes()[:40])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert inspect_image(buf.getvalue(), None, LIMITS) == ImageInfo("image/jpeg", 8, 8)
        with Image.open(io.BytesIO(buf.getvalue())):
            pass
    assert len(caught) == 1  # Pillow does warn (on the bare open above); admission kept quiet


def test_decode_refuses_to_run_when_pillow_tolerates_truncation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES"):
        decode_check(PNG, LIMITS)


def test_header_info_decodes_no_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_load(self: object) -> None:
        raise AssertionError("header_info must not decode pixels")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_load)
    for name, data in SAMPLES.items():
        assert header_info(data).width == 24, name


# --- what an inlined image is, for fitting it -----------------------------------------------------

@pytest.mark.parametrize("kind", ["PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"])
def test_image_facts_name_the_type_and_size_and_find_a_cut_image(kind: str) -> None:
    import io

    from PIL import Image

    from projectionist.policy.model import ImageFacts
    from projectionist.proxy.stores.admission import image_facts

    out = io.BytesIO()
    Image.new("RGB", (30, 20), (1, 2, 3)).save(out, kind)
    data = out.getvalue()
    media_type = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp",
                  "BMP": "image/bmp", "TIFF": "image/tiff"}[kind]
    assert image_facts(data) == ImageFacts(media_type, len(data), 30, 20)
    cut = data[: len(data) // 2]
    if kind != "TIFF":  # a TIFF's header alone does not say how long it is
        assert image_facts(cut) == ImageFacts(None, len(cut))
    assert image_facts(b"") == ImageFacts(None, 0) and image_facts(b"%PDF-1.7") == ImageFacts(None, 8)


def test_an_image_past_the_decoders_pixels_is_an_image_never_no_image() -> None:
    import struct
    import zlib

    from projectionist.policy.model import ImageFacts
    from projectionist.proxy.stores.admission import image_facts

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 10000, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    assert image_facts(png) == ImageFacts("image/png", len(png), 20000, 10000)
