"""Test helper: deterministic small images in every admitted format, made with Pillow."""

from __future__ import annotations

import hashlib
import io

from PIL import Image

FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}


def make_image(width: int = 4, height: int = 3, media_type: str = "image/png", color: int = 0) -> bytes:
    """Encode a ``width`` x ``height`` image whose pixels depend on ``color`` (distinct bytes)."""
    img = Image.new("RGB", (width, height), ((37 * color) % 256, (91 * color + 7) % 256, 200))
    buf = io.BytesIO()
    img.save(buf, format=FORMATS[media_type])
    return buf.getvalue()


def ref_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def noise_image(width: int, height: int, media_type: str = "image/png", seed: int = 0) -> bytes:
    """A ``width`` x ``height`` image of seeded RGB noise: it does not compress, so its bytes grow
    with its pixels (a screenshot's size without a screenshot's content)."""
    import random

    pixels = random.Random(seed).randbytes(width * height * 3)
    buf = io.BytesIO()
    Image.frombytes("RGB", (width, height), pixels).save(buf, format=FORMATS[media_type])
    return buf.getvalue()


def dimensions(data: bytes) -> tuple[int, int]:
    """An encoded image's width and height."""
    with Image.open(io.BytesIO(data)) as img:
        return img.size
