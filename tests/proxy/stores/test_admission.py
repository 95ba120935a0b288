"""Admission: magic-byte detection, declared-type agreement, limits, and Pillow's bomb guard."""

from __future__ import annotations

import io
from collections.abc import Callable
import warnings

import pytest
from PIL import Image

from projectionist.policy.errors import ImageRejected
from projectionist.proxy.stores.admission import ImageInfo, header_info, inspect_image, normalize_declared_type
from projectionist.proxy.config import ImageLimits
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
