"""Provider answers as JSON documents, and what they report (adapters layer, pure data mapping).

An answer is one JSON document, or for SSE the list of its ``data:`` documents. Each format's
adapter says where its usage sits (``usage``) and which members change on every call by design
(``VOLATILE``: ids and clocks, which a replay's diff ignores). ``tokens`` reads any format's usage
as input and output token counts; ``reported`` also finds the model an answer names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from .base import Json

_decoder: Final = msgspec.json.Decoder()


def documents(body: bytes, content_type: str) -> Any:
    """A response body as JSON: the list of SSE ``data:`` documents, or the one document (text
    where it is not JSON)."""
    if "event-stream" in content_type:
        docs: list[Any] = []
        for line in body.splitlines():
            if line.startswith(b"data:"):
                try:
                    docs.append(_decoder.decode(line[5:].strip()))
                except msgspec.DecodeError:
                    docs.append(line[5:].strip().decode("utf-8", "replace"))
        return docs
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError:
        return body.decode("utf-8", "replace")


def reported(usage: Callable[[Json], dict[str, Any] | None], body: bytes,
             content_type: str) -> tuple[dict[str, Any] | None, str | None]:
    """What an answer reports of itself: its token usage, by the format's own ``usage`` reader,
    merged over its documents (a stream reports it in pieces, Gemini's each chunk whole), and the model it names beside the
    usage. Of a stream only the events that mention a usage are decoded: every format names the
    model in those too."""
    found: dict[str, Any] | None = None
    model: str | None = None
    if "event-stream" in content_type:
        docs = [doc for data in _usage_events(body) for doc in _json_or_none(data)]
    else:  # one document; Gemini's streamGenerateContent without ?alt=sse answers a list of them
        docs = [doc for whole in _json_or_none(body) for doc in (whole if isinstance(whole, list) else [whole])]
    for doc in docs:
        if isinstance(doc, dict) and (part := usage(doc)) is not None:
            found = {**(found or {}), **part}
            model = model or _model(doc)
    return found, model


def _usage_events(body: bytes) -> list[bytes]:
    """The ``data:`` of each SSE line that mentions ``usage`` (or ``usageMetadata``): found by
    searching the body, not by splitting a long stream into all its lines."""
    found: list[bytes] = []
    at = body.find(b"sage")
    while at != -1:
        start = max(body.rfind(b"\n", 0, at), body.rfind(b"\r", 0, at)) + 1
        ends = [i for i in (body.find(b"\n", at), body.find(b"\r", at)) if i != -1]
        end = min(ends) if ends else len(body)
        if body.startswith(b"data:", start):
            found.append(body[start + 5:end])
        at = body.find(b"sage", end)
    return found


def _json_or_none(data: bytes) -> list[Any]:
    try:
        return [_decoder.decode(data)]
    except msgspec.DecodeError:
        return []


#: Where each format's answer names its model: chat, Messages, Gemini; Responses and a Messages
#: stream's ``message_start`` one level down.
_MODEL_AT: Final = (("model",), ("modelVersion",), ("response", "model"), ("message", "model"))


def _model(doc: dict[str, Any]) -> str | None:
    for path in _MODEL_AT:
        node: Any = doc
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, str):
            return node
    return None


#: The usage members counting input and output tokens, in every format: the Responses and
#: Messages APIs, Chat Completions, Gemini. Anthropic counts cache reads and writes apart from
#: ``input_tokens``, Gemini its thinking apart from ``candidatesTokenCount``: both are added, so
#: each count is what the provider bills as input or output.
_INPUT: Final = ("input_tokens", "prompt_tokens", "promptTokenCount")
_INPUT_EXTRA: Final = ("cache_creation_input_tokens", "cache_read_input_tokens")
_OUTPUT: Final = ("output_tokens", "completion_tokens", "candidatesTokenCount")
_OUTPUT_EXTRA: Final = ("thoughtsTokenCount",)


def tokens(usage: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """The input and output token counts of a usage (as any adapter's ``usage`` finds it); None
    for a count it does not report."""
    if not usage:
        return None, None
    return _count(usage, _INPUT, _INPUT_EXTRA), _count(usage, _OUTPUT, _OUTPUT_EXTRA)


def _count(usage: dict[str, Any], names: tuple[str, ...], extra: tuple[str, ...]) -> int | None:
    for name in names:
        value = usage.get(name)
        if type(value) is int:  # an int, never a bool
            for also in extra:
                more = usage.get(also)
                if type(more) is int:
                    value += more
            return value
    return None


def member(doc: Json, *path: str) -> dict[str, Any] | None:
    """``doc[path...]`` when every step is a dict, else None."""
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc if isinstance(doc, dict) else None
