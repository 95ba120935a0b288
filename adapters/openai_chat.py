"""OpenAI Chat Completions wire format (adapters layer, pure data mapping).

References sit in ``image_url.url`` of ``image_url`` parts, in any message's content list,
including ``tool`` messages. A resolved image becomes a ``data:`` URL (``detail`` and other keys
kept); a placeholder becomes a ``text`` part.
"""

from __future__ import annotations

import re
from typing import Any, Final

from projectionist.adapters.base import Inline, Inliner, Json, PlainInline, Site, content_lists, patch
from projectionist.adapters.responses import member
from projectionist.policy.model import Outcome, parse_url_ref

NAME: Final = "openai_chat"
FORMAT: Final = "openai"
AUTH_HEADERS: Final = ("authorization",)
AUTH_QUERY: Final[tuple[str, ...]] = ()
#: The paths that take this format's body (projected).
PATHS: Final = re.compile(r"(?:/v1)?/chat/completions")
#: Response members that differ on every call by design.
VOLATILE: Final = frozenset({"id", "created", "system_fingerprint"})

_TYPES: Final = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 409: "invalid_request_error", 413: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error"}


def find_refs(body: Json) -> list[Site]:
    """Every ``attachment:`` image reference in ``body``, in document order."""
    sites: list[Site] = []
    for content in content_lists(body.get("messages") if isinstance(body, dict) else None):
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            slot = part.get("image_url")
            url = slot.get("url") if isinstance(slot, dict) else slot
            if isinstance(url, str) and (ref := parse_url_ref(url)) is not None:
                sites.append(Site(content, index, ref))
    return sites


def _image_part(part: dict[str, Any], inline: Inline) -> dict[str, Any]:
    slot = part.get("image_url")
    kept = {k: v for k, v in slot.items() if k != "url"} if isinstance(slot, dict) else {}
    return {**part, "image_url": {"url": inline.data_url(), **kept}}


def _text_part(part: dict[str, Any], text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def render(sites: list[Site], outcomes: tuple[Outcome, ...], inline: Inliner = PlainInline) -> None:
    patch(sites, outcomes, _image_part, _text_part, inline)


def error_body(code: str, message: str, status: int) -> dict[str, Any]:
    """The shape the ``openai`` SDK unwraps into ``APIStatusError`` (``.code``, ``.type``)."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def upstream_auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


def usage(doc: Json) -> dict[str, Any] | None:
    """A completion's (or the last stream chunk's) ``usage``."""
    return member(doc, "usage")


def file_object(file_id: str, filename: str, media_type: str, size: int, created_at: int) -> dict[str, Any]:
    """An admitted attachment as the ``openai`` SDK's ``FileObject``."""
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created_at, "filename": filename,
            "purpose": "vision", "status": "processed", "expires_at": None, "status_details": None}


def file_deleted(file_id: str) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "deleted": True}
