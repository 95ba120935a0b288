"""The one registry of wire formats: by adapter name, and which adapter projects a path (adapters layer, pure)."""

from __future__ import annotations

from typing import Final

from . import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from .base import WireFormat

#: Every adapter, by the name records and replay use.
ADAPTERS: Final[dict[str, WireFormat]] = {
    m.NAME: m for m in (openai_chat, openai_responses, anthropic_messages, anthropic_batches, gemini)}
#: The adapter that speaks for each upstream format: its errors (and, where it has one, its Files API).
SPEAKS: Final[dict[str, WireFormat]] = {"openai": openai_chat, "anthropic": anthropic_messages, "gemini": gemini}


def projecting(upstream_format: str, method: str, path: str) -> WireFormat | None:
    """The adapter that projects a ``method`` ``path`` on an upstream of ``upstream_format``: a
    POST to one of its ``PATHS`` (generation and the token counting that takes the same body)."""
    if method != "POST":
        return None
    for adapter in ADAPTERS.values():
        if adapter.FORMAT == upstream_format and adapter.PATHS.fullmatch(path):
            return adapter
    return None
