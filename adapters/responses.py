"""Provider answers as JSON documents, and what they report (adapters layer, pure data mapping).

An answer is one JSON document, or for SSE the list of its ``data:`` documents. Each format's
adapter says where its usage sits (``usage``) and which members change on every call by design
(``VOLATILE``: ids and clocks, which a replay's diff ignores).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from projectionist.adapters.base import Json

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


def usage_of(usage: Callable[[Json], dict[str, Any] | None], body: bytes, content_type: str) -> dict[str, Any] | None:
    """The token usage a response reports, merged over its documents (an SSE stream reports it
    in pieces), by the format's own ``usage`` reader."""
    found: dict[str, Any] | None = None
    docs = documents(body, content_type)
    for doc in docs if "event-stream" in content_type else [docs]:
        if isinstance(doc, dict) and (part := usage(doc)) is not None:
            found = {**(found or {}), **part}
    return found


def member(doc: Json, *path: str) -> dict[str, Any] | None:
    """``doc[path...]`` when every step is a dict, else None."""
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc if isinstance(doc, dict) else None
