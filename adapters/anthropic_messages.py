"""Anthropic Messages wire format (adapters layer, pure data mapping).

References sit in ``image`` blocks as ``source: {type: "url", url: "attachment:..."}`` or
``source: {type: "file", file_id: "sha256:..."}``, in message content and nested in
``tool_result.content``. A resolved image becomes a ``base64`` source; a placeholder becomes a
``text`` block (``cache_control`` kept, so prompt-cache breakpoints stay where the client put them).
"""

from __future__ import annotations

import re
import time
from typing import Any, Final

from projectionist.adapters.base import Inline, Inliner, Json, PlainInline, Site, content_lists, patch
from projectionist.adapters.responses import member
from projectionist.policy.model import ImageRef, Outcome, parse_file_id, parse_url_ref

NAME: Final = "anthropic_messages"
FORMAT: Final = "anthropic"
AUTH_HEADERS: Final = ("x-api-key", "authorization")
AUTH_QUERY: Final[tuple[str, ...]] = ()
PATHS: Final = re.compile(r"(?:/v1)?/messages(?:/count_tokens)?")
VOLATILE: Final = frozenset({"id", "request_id"})

_TYPES: Final = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                 422: "invalid_request_error", 429: "rate_limit_error", 529: "overloaded_error"}


def _source_ref(source: Json) -> ImageRef | None:
    if not isinstance(source, dict):
        return None
    kind = source.get("type")
    if kind == "url" and isinstance(url := source.get("url"), str):
        return parse_url_ref(url)
    if kind == "file" and isinstance(file_id := source.get("file_id"), str):
        return parse_file_id(file_id)
    return None


def _scan(blocks: list[Json], sites: list[Site]) -> None:
    for index, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "image" and (ref := _source_ref(block.get("source"))) is not None:
            sites.append(Site(blocks, index, ref))
        elif kind == "tool_result" and isinstance(nested := block.get("content"), list):
            _scan(nested, sites)


def find_refs(body: Json) -> list[Site]:
    """Every image reference in ``body``, in document order, tool results included."""
    sites: list[Site] = []
    for content in content_lists(body.get("messages") if isinstance(body, dict) else None):
        _scan(content, sites)
    return sites


def _image_part(part: dict[str, Any], inline: Inline) -> dict[str, Any]:
    return {**part, "source": {"type": "base64", "media_type": inline.media_type, "data": inline.base64()}}


def _text_part(part: dict[str, Any], text: str) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def render(sites: list[Site], outcomes: tuple[Outcome, ...], inline: Inliner = PlainInline) -> None:
    patch(sites, outcomes, _image_part, _text_part, inline)


def error_body(code: str, message: str, status: int) -> dict[str, Any]:
    """The shape the ``anthropic`` SDK parses: ``.type``, and ``.error_code`` from details."""
    kind = _TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message, "details": {"error_code": code}}}


def upstream_auth(api_key: str) -> dict[str, str]:
    return {"x-api-key": api_key}


def usage(doc: Json) -> dict[str, Any] | None:
    """A message's ``usage``; in a stream, ``message_start``'s and then ``message_delta``'s."""
    return member(doc, "usage") or member(doc, "message", "usage")


def file_object(file_id: str, filename: str, media_type: str, size: int, created_at: int) -> dict[str, Any]:
    """An admitted attachment as the ``anthropic`` SDK's ``FileMetadata``."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created_at))
    return {"id": file_id, "type": "file", "filename": filename, "mime_type": media_type, "size_bytes": size,
            "created_at": created, "downloadable": True}


def file_deleted(file_id: str) -> dict[str, Any]:
    return {"id": file_id, "type": "file_deleted"}
