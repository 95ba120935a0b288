"""Readable bodies: inlined base64 shortened to digest and length (adapters layer, pure).

Used wherever a projected body is shown to a person: the demo's snapshot and ``replay --show``.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any


def _short(data: bytes) -> str:
    return f"<sha256:{hashlib.sha256(data).hexdigest()[:8]}, {len(data)} bytes>"


def shorten(value: Any) -> Any:
    """Replace inlined base64 (data URLs, Anthropic base64 sources, Gemini inline data) with the
    digest and length of the bytes it carries."""
    if isinstance(value, dict):
        inline = value.get("type") == "base64" or "mime_type" in value or "mimeType" in value
        if inline and isinstance(value.get("data"), str):
            return {**value, "data": _short(base64.b64decode(value["data"]))}
        return {k: shorten(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shorten(v) for v in value]
    if isinstance(value, str) and value.startswith("data:") and ";base64," in value:
        head, _, b64 = value.partition(";base64,")
        return f"{head};base64,{_short(base64.b64decode(b64))}"
    return value
