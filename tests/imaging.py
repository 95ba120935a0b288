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
