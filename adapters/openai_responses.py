"""OpenAI Responses wire format (adapters layer, pure data mapping).

References sit in ``input_image`` parts of ``input`` items, as ``image_url: "attachment:..."`` or
``file_id: "sha256:..."``, in message content and in ``function_call_output.output`` lists. A
resolved image becomes a ``data:`` URL (``detail`` kept); a placeholder becomes ``input_text``.
Errors and auth are OpenAI's, shared with the Chat Completions adapter.
"""

from __future__ import annotations

from typing import Any, Final

from adapters import openai_chat
from adapters.base import Json, Site, patch
from policy.model import ImageRef, Outcome, parse_file_id, parse_url_ref

NAME: Final = "openai_responses"
FORMAT: Final = "openai"
AUTH_HEADERS: Final = openai_chat.AUTH_HEADERS
AUTH_QUERY: Final[tuple[str, ...]] = ()
error_body = openai_chat.error_body
upstream_auth = openai_chat.upstream_auth


def _ref(part: dict[str, Any]) -> ImageRef | None:
    url = part.get("image_url")
    if isinstance(url, str) and (ref := parse_url_ref(url)) is not None:
        return ref
    file_id = part.get("file_id")
    return parse_file_id(file_id) if isinstance(file_id, str) else None


def _scan(parts: list[Json], sites: list[Site]) -> None:
    for index, part in enumerate(parts):
        if isinstance(part, dict) and part.get("type") == "input_image" and (ref := _ref(part)) is not None:
            sites.append(Site(parts, index, ref))


def find_refs(body: Json) -> list[Site]:
    """Every image reference in ``body["input"]``, in document order."""
    items = body.get("input") if isinstance(body, dict) else None
    sites: list[Site] = []
    if not isinstance(items, list):
        return sites
    for item in items:
        if not isinstance(item, dict):
            continue
        nested = item.get("output") if item.get("type") == "function_call_output" else item.get("content")
        if isinstance(nested, list):
            _scan(nested, sites)
    return sites


def _image_part(part: dict[str, Any], media_type: str, b64: str) -> dict[str, Any]:
    kept = {k: v for k, v in part.items() if k not in ("image_url", "file_id")}
    return {**kept, "image_url": f"data:{media_type};base64,{b64}"}


def _text_part(part: dict[str, Any], text: str) -> dict[str, Any]:
    return {"type": "input_text", "text": text}


def render(sites: list[Site], outcomes: tuple[Outcome, ...]) -> None:
    patch(sites, outcomes, _image_part, _text_part)
