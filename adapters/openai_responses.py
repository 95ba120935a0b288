"""OpenAI Responses wire format (adapters layer, pure data mapping).

References sit in ``input_image`` parts as ``image_url: "attachment:..."`` (or an HTTP reference)
or ``file_id: "sha256:..."``, and in ``input_file`` parts as ``file_id: "sha256:..."``: in message
content, in ``function_call_output`` and ``custom_tool_call_output`` output lists, and in
``prompt.variables``; and in the ``computer_screenshot`` output of a ``computer_call_output``. A
resolved image becomes a ``data:`` URL (``detail`` kept; an ``input_file`` becomes an
``input_image``, the shape that carries an image, with ``detail: "auto"``). A placeholder becomes
``input_text``; a screenshot slot cannot hold text, so there it becomes a blank 1x1 image and the
text follows the item as a user message. An ``input_image`` (or screenshot) whose ``image_url`` is
``http(s)`` is an image the provider fetches itself (``find_slots``).
Errors, auth, image limits and image refusals are OpenAI's, shared with the Chat Completions adapter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

from . import openai_chat
from .base import (Carried, Host, Inliner, Json, Linked, PlainInline, Site, Slot, data_url_base64, data_url_type, inliner,
                   insert_after, listed, opening_messages)
from .facts import CallFacts
from .responses import member
from ..policy.linked import is_web_url
from ..policy.model import (ID_PREFIX, NO_HTTP, HttpRefs, ImageRef, Outcome, Resolved, parse_file_id,
                                        parse_url_ref)

NAME: Final = "openai_responses"
FORMAT: Final = "openai"
AUTH_HEADERS: Final = openai_chat.AUTH_HEADERS
AUTH_QUERY: Final[tuple[str, ...]] = ()
INLINE_MARKERS: Final = openai_chat.INLINE_MARKERS
URL_MARKERS: Final = (b'"input_image"', b'"computer_screenshot"')
error_body = openai_chat.error_body
sign = openai_chat.sign
rejection = openai_chat.rejection
PROFILE: Final = openai_chat.PROFILE
PATHS: Final = re.compile(r"(?:/v1)?/responses(?:/compact|/input_tokens)?")
VOLATILE: Final = frozenset({"id", "created_at", "item_id", "response_id", "sequence_number"})
FACTS: Final = openai_chat.FACTS
CALLS: Final = CallFacts(operation="chat", counting=("/input_tokens", "/compact"))


def usage(doc: Json) -> dict[str, Any] | None:
    """A response's ``usage``; in a stream, the one its ``response.completed`` event carries."""
    return member(doc, "usage") or member(doc, "response", "usage")


#: A 1x1 white PNG: what a screenshot slot holds when its image is unavailable.
BLANK_PNG: Final = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4"
                    "//8/AAX+Av4N70a4AAAAAElFTkSuQmCC")
_OUTPUT_LISTS: Final = ("function_call_output", "custom_tool_call_output")


def _is(part: Json, kind: str) -> bool:
    return isinstance(part, dict) and part.get("type") == kind


def _file_id(part: Json) -> str | None:
    file_id = part.get("file_id")
    return file_id if isinstance(file_id, str) else None


def _is_file_ref(part: Json, kind: str) -> bool:
    """An ``input_file`` naming an attachment, where an ``input_image`` may stand."""
    return kind == "input_image" and _is(part, "input_file") and (_file_id(part) or "").startswith(ID_PREFIX)


def _ref(part: Json, kind: str, http: HttpRefs) -> ImageRef | None:
    if _is_file_ref(part, kind):
        return parse_file_id(part["file_id"])
    if not _is(part, kind):
        return None
    url = part.get("image_url")
    if isinstance(url, str) and (ref := parse_url_ref(url, http)) is not None:
        return ref
    file_id = _file_id(part)
    return parse_file_id(file_id) if file_id is not None else None


#: A place an image part may sit: its parent (a list or a dict), its index or key, the part there,
#: the part type that is an image there, and the enclosing item's place when the slot cannot hold text.
_Slot = tuple[Any, int | str, Json, str, Host | None]


def _slots(body: Json) -> Iterator[_Slot]:
    """Every place an image part may sit in ``prompt.variables`` and ``input``, in document order."""
    if not isinstance(body, dict):
        return
    prompt = body.get("prompt")
    variables = prompt.get("variables") if isinstance(prompt, dict) else None
    if isinstance(variables, dict):
        yield from ((variables, key, value, "input_image", None) for key, value in variables.items())
    items = body.get("input")
    if not isinstance(items, list):
        return
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "computer_call_output":
            yield item, "output", item.get("output"), "computer_screenshot", (items, position)
            continue
        nested = item.get("output") if kind in _OUTPUT_LISTS else item.get("content")
        if isinstance(nested, list):
            yield from ((nested, index, part, "input_image", None) for index, part in enumerate(nested))


def _slot(parent: Any, index: int | str, part: Json, kind: str, host: Host | None, http: HttpRefs) -> Slot | None:
    """The image at one place: a reference (``_ref``), one the client inlined (an ``input_image``
    or computer screenshot whose ``image_url`` is a base64 ``data:`` URL), one the provider fetches
    (its ``image_url`` is ``http(s)`` and no reference under ``http``'s bases), or None."""
    ref = _ref(part, kind, http)
    if ref is not None:
        return Site(parent, index, ref, host)
    url = part.get("image_url") if _is(part, kind) else None
    if not isinstance(url, str):
        return None
    if (data := data_url_base64(url)) is not None:
        return Carried(parent, index, part, "image_url", url, data, host, data_url_type(url))
    return Linked(parent, index, url, host) if is_web_url(url) and http.rest(url) is None else None


def find_slots(body: Json, http: HttpRefs = NO_HTTP) -> list[Slot]:
    """Every image slot of ``input`` and ``prompt.variables``, in document order."""
    return [slot for parent, index, part, kind, host in _slots(body)
            if (slot := _slot(parent, index, part, kind, host, http)) is not None]


def session_hint(body: Json) -> tuple[str, str] | None:
    """The session a Responses body names: its ``conversation`` (the API's own, ``conv_...``, a
    string or ``{"id"}``), else its ``prompt_cache_key`` (Codex keys the cache by its session)."""
    if not isinstance(body, dict):
        return None
    conversation = body.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    if isinstance(conversation, str) and conversation:
        return "conversation", conversation
    key = body.get("prompt_cache_key")
    return ("cache-key", key) if isinstance(key, str) and key else None


def opening(body: Json) -> Json:
    """The instructions and the input up to its first user message (a plain string input whole)."""
    if not isinstance(body, dict):
        return None
    items = body.get("input")
    first = items if isinstance(items, str) else opening_messages(items)
    return None if first is None else [body.get("instructions"), first]


def messages(body: Json) -> Json:
    """The input's items, as the body lists them (None: a string input, or none)."""
    return listed(body, "input")


def system(body: Json) -> Json:
    """The instructions."""
    return body.get("instructions") if isinstance(body, dict) else None


def count_images(body: Json, http: HttpRefs = NO_HTTP) -> int:
    """Every ``input_image`` (and computer screenshot) in ``input`` and ``prompt.variables``,
    whatever it carries (a reference, a ``data:`` or http(s) URL, a provider file id), and every
    ``input_file`` naming an attachment (the provider's own files need not be images)."""
    return sum(1 for _, _, part, kind, _ in _slots(body) if _is(part, kind) or _is_file_ref(part, kind))


def _image(part: dict[str, Any], url: Json) -> dict[str, Any]:
    if part.get("type") == "input_file":
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    return {**{k: v for k, v in part.items() if k not in ("image_url", "file_id")}, "image_url": url}


def render(sites: list[Site], outcomes: tuple[Outcome, ...], inline: Inliner = PlainInline) -> None:
    if len(sites) != len(outcomes):
        raise ValueError("one outcome per site")
    get = inliner(inline)
    follow: list[tuple[Host, Json]] = []
    for site, outcome in zip(sites, outcomes):
        part = site.parent[site.index]
        if isinstance(outcome, Resolved):
            site.parent[site.index] = _image(part, get(outcome.image).data_url())
        elif site.host is None:
            site.parent[site.index] = {"type": "input_text", "text": outcome.text}
        else:
            site.parent[site.index] = _image(part, BLANK_PNG)
            follow.append((site.host, {"type": "message", "role": "user",
                                       "content": [{"type": "input_text", "text": outcome.text}]}))
    insert_after(follow)
