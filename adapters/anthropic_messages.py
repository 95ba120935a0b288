"""Anthropic Messages wire format (adapters layer, pure data mapping).

References sit in ``image`` blocks as ``source: {type: "url", url: "attachment:..."}`` (or an
HTTP reference) or ``source: {type: "file", file_id: "sha256:..."}``, and in ``document`` blocks
with such a file source, in message content and nested in ``tool_result.content``. A resolved image
becomes a ``base64`` source (a ``document`` block becomes an ``image`` block: attachments are
images, and only an image block carries one); a placeholder becomes a ``text`` block
(``cache_control`` kept, so prompt-cache breakpoints stay where the client put them). An ``image``
block with an ``http(s)`` ``url`` source is an image the provider fetches itself (``find_slots``).
``PROFILE`` is what the API accepts in images; ``rejection`` reads its answers refusing one, or
failing to download one.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import msgspec

from .base import (SCAN_CHARS, Carried, ContextAnswers, FetchAnswers, Inline, Inliner, Json, Known, KnownContext,
                   KnownFetch, Linked, PlainInline, Site, Slot, content_lists, error_object, known_pattern,
                   listed, opening_message, part_pointer, patch)
from .facts import CallFacts, Files, FormatFacts, Spoken
from .responses import member
from ..policy.linked import is_web_url
from ..policy.model import ID_PREFIX, NO_HTTP, HttpRefs, ImageRef, Outcome, parse_file_id, parse_url_ref
from ..policy.profile import Profile, Rejection

NAME: Final = "anthropic_messages"
FORMAT: Final = "anthropic"
AUTH_HEADERS: Final = ("x-api-key", "authorization")
AUTH_QUERY: Final[tuple[str, ...]] = ()
#: What opens the base64 of an image the client inlined, in the raw body (the proxy's cheap scan).
INLINE_MARKERS: Final = (b'"data":',)
#: What every image block the provider fetches by URL spells in the raw body (``"type": "url"``).
URL_MARKERS: Final = (b'"url"',)
PATHS: Final = re.compile(r"(?:/v1)?/messages(?:/count_tokens)?")
VOLATILE: Final = frozenset({"id", "request_id"})
#: The ``anthropic`` format: its SDKs send ``anthropic-version``; a Files API that takes any image.
FACTS: Final = FormatFacts(
    FORMAT, url="https://api.anthropic.com", provider="anthropic", files=Files("multipart"), v1_paths=True,
    spoken=Spoken(headers=("anthropic-version",), paths=("/v1/messages",), prefixes=("/v1/messages/",)))
CALLS: Final = CallFacts(operation="chat", counting=("count_tokens",))

_TYPES: Final = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                 422: "invalid_request_error", 429: "rate_limit_error", 529: "overloaded_error"}

_VISION: Final = "https://platform.claude.com/docs/en/build-with-claude/vision"
#: The Claude API's image limits (the API directly; Bedrock and Vertex AI are stricter).
PROFILE: Final = Profile(
    FORMAT,
    # "Use a supported image format: JPEG, PNG, GIF, or WebP."
    ("image/jpeg", "image/png", "image/gif", "image/webp"),
    # "The maximal size per image is: 10 MB (base64-encoded) when using the Claude API directly"
    # (5 MB on Bedrock and Vertex AI). Its MB is MiB: the API answers "image exceeds 5 MB maximum:
    # 5327908 bytes > 5242880 bytes". 10 MiB of base64 holds 10485760 * 3 / 4 decoded bytes.
    max_image_bytes=7_864_320,
    # "request size limits (32 MB for standard endpoints ...)"; read as 10^6-byte MB, the safe side.
    max_request_bytes=32_000_000,
    # "The maximal dimensions per image are 8000x8000 px."
    max_side=8000,
    # No pixel-count limit is documented (larger images are downscaled, not refused).
    # "100 per request on the API, for models with a 200k-token context window. 600 per request
    # on the API, for all other models": 100 holds for every model.
    max_images=100,
    # "If a single API request contains more than 20 images, a stricter per-image dimension limit
    # applies ... resize each image so that neither dimension exceeds 2000 px".
    many_images=20,
    many_images_max_side=2000,
    sources=(_VISION, "https://docs.anthropic.com/en/api/overview#request-size-limits"),
)

#: The Messages API's answers refusing an image (all HTTP 400 ``invalid_request_error``): a pattern
#: of ``error.message``, and where it was seen. The message opens with the path of the refused
#: block when the API names one (``messages.11.content.8.image.source.base64.data: ...``).
REJECTIONS: Final[tuple[Known, ...]] = (
    (r"image exceeds \d+ MB maximum", "https://github.com/nraiden/cofounder/issues/53"),
    (r"image dimensions exceeds? max allowed size", "https://github.com/anthropics/claude-code/issues/4778"),
    (r"Could not process image", "https://github.com/anthropics/claude-code/issues/1747"),
    (r"Image does not match the provided media type", "https://github.com/anthropics/claude-code/issues/13131"),
    (r"The image was specified using the \S+ media type, but the image appears to be",
     "https://github.com/vybestack/llxprt-code/issues/2130"),
    (r"Image format \S+ not supported", "https://github.com/anthropics/claude-code/issues/28485"),
    (r"image cannot be empty", "https://github.com/anthropics/claude-code/issues/12750"),
    # A bounded run that stops at ":" (not "\S*"): backtracking then stays linear in the message.
    (r"image\.source\.base64[^\s:]{0,64}: invalid base64 data", "https://github.com/openclaw/openclaw/pull/13784"),
    (r"image\.source\.base64\.media_type: Input should be 'image/", "https://github.com/anthropics/claude-code/issues/400"),
)
_REJECTED: Final = known_pattern(REJECTIONS)
#: The Messages API's answers about the context of the images rather than one image's bytes: its
#: many-image rule, and the limits (per image, on its side and on its base64) an upstream of this
#: format states smaller than the API documents (Bedrock and Vertex AI take 5 MB, not 10): learnt
#: for the upstream and model, and the images fitted to them. The many-image answer names an
#: image block, but that image was accepted alone: what changed is how many came with it.
CONTEXT: Final[tuple[KnownContext, ...]] = (
    (r"exceed max allowed size for many-image requests: (?P<side>\d+) pixels", "many_images",
     frozenset({400}), "https://github.com/anthropics/claude-code/issues/52220"),
    (r"image dimensions exceeds? max allowed size: (?P<side>\d+) pixels", "image_side", frozenset({400}),
     "https://github.com/anthropics/claude-code/issues/4778"),
    (r"image exceeds \d+ MB maximum: \d+ bytes > (?P<base64>\d+) bytes", "image_bytes", frozenset({400}),
     "https://github.com/mozilla-ai/clawbolt/issues/936"),
)
_CONTEXT: Final = ContextAnswers(CONTEXT)
#: The Messages API's answers when it could not download an image block's ``url`` source (HTTP
#: 400 ``invalid_request_error``, opening with the block's path: ``messages.0.content.1.image.
#: source.url: ...``), and what each says of the URL.
UNFETCHED: Final[tuple[KnownFetch, ...]] = (
    # Seen quoted in public test suites (``messages.0.content.1.image.source.url: Unable to
    # download the file. Please verify the URL and try again.``) the search index holds without
    # an address; no public report to link yet.
    (r"Unable to download the file", "not_found", "(public test suites, no address)"),
    (r"This URL is disallowed by the website's robots\.txt", "not_found", "https://github.com/vercel/ai/issues/6279"),
)
_UNFETCHED: Final = FetchAnswers(UNFETCHED)
#: The path a message opens with: one possessive run, so reading it is linear whatever its length.
_PATH: Final = re.compile(r"([^\s:]++): ")
#: How much of a leading path the patterns read: its last steps (``image.source.base64.data``).
_PATH_TAIL: Final = 64
_ROOTS: Final = frozenset({"messages"})
_KEYS: Final = frozenset({"content"})
#: Block types the API names between the steps of a nested path (``content.0.tool_result.content.1``).
_TAGS: Final = frozenset({"tool_result"})


def _source_ref(source: Json, http: HttpRefs) -> ImageRef | None:
    if not isinstance(source, dict):
        return None
    kind = source.get("type")
    if kind == "url" and isinstance(url := source.get("url"), str):
        return parse_url_ref(url, http)
    if kind == "file" and isinstance(file_id := source.get("file_id"), str):
        return parse_file_id(file_id)
    return None


def _is_file_ref(block: dict[str, Any]) -> bool:
    """A ``document`` block whose source is a file naming an attachment."""
    source = block.get("source")
    return (block.get("type") == "document" and isinstance(source, dict) and source.get("type") == "file"
            and isinstance(file_id := source.get("file_id"), str) and file_id.startswith(ID_PREFIX))


def _scan(blocks: list[Json]) -> Iterator[tuple[list[Json], int, dict[str, Any]]]:
    for index, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "image" or kind == "document" and _is_file_ref(block):
            yield blocks, index, block
        elif kind == "tool_result" and isinstance(nested := block.get("content"), list):
            yield from _scan(nested)


def _image_blocks(body: Json) -> Iterator[tuple[list[Json], int, dict[str, Any]]]:
    """Every ``image`` block of ``body``, and every ``document`` block naming an attachment (its
    list, its index, the block), in document order."""
    for content in content_lists(body.get("messages") if isinstance(body, dict) else None):
        yield from _scan(content)


def _slot(blocks: list[Json], index: int, block: dict[str, Any], http: HttpRefs) -> Slot | None:
    """The image ``block`` is: a reference (a ``url`` or ``file`` source), one the client inlined
    (an ``image`` block's ``base64`` source), one the provider fetches (an ``image`` block's
    ``http(s)`` ``url`` source: a ``document`` block's URL is a PDF's), or None."""
    source = block.get("source")
    ref = _source_ref(source, http)
    if ref is not None:
        return Site(blocks, index, ref)
    if block.get("type") != "image" or not isinstance(source, dict):
        return None
    kind = source.get("type")
    if kind == "base64" and isinstance(data := source.get("data"), str):
        declared = source.get("media_type")
        return Carried(blocks, index, source, "data", data, data, declared=declared if isinstance(declared, str) else None)
    if kind == "url" and isinstance(url := source.get("url"), str) and is_web_url(url) and http.rest(url) is None:
        return Linked(blocks, index, url)
    return None


def find_slots(body: Json, http: HttpRefs = NO_HTTP) -> list[Slot]:
    """Every image slot of ``body``, tool results included, in document order."""
    return [slot for blocks, index, block in _image_blocks(body)
            if (slot := _slot(blocks, index, block, http)) is not None]


#: Claude Code's ``metadata.user_id``: ``user_<hex>_account_<uuid or nothing>_session_<uuid>``.
_CLAUDE_CODE_USER: Final = re.compile(r"user_[0-9a-f]{1,128}_account_[0-9a-f-]{0,64}_session_([0-9a-f-]{8,64})")


def session_hint(body: Json) -> tuple[str, str] | None:
    """The session Claude Code names in ``metadata.user_id``: ``..._session_<uuid>``, or a JSON
    object with a ``session_id`` (both spellings are sent by its versions)."""
    metadata = body.get("metadata") if isinstance(body, dict) else None
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user, str) or len(user) > 1024:
        return None
    found = _CLAUDE_CODE_USER.fullmatch(user)
    if found is not None:
        return "claude-code", found[1]
    if user.startswith("{"):
        try:
            decoded = json.loads(user)
        except ValueError:
            return None
        session = decoded.get("session_id") if isinstance(decoded, dict) else None
        if isinstance(session, str) and session:
            return "claude-code", session
    return None


def opening(body: Json) -> Json:
    """The system prompt and the first message (``base.opening_message``: past a first message
    of bookkeeping alone)."""
    if not isinstance(body, dict):
        return None
    first = opening_message(body.get("messages"))
    return None if first is None else [body.get("system"), first]


def messages(body: Json) -> Json:
    """The conversation's messages, as the body lists them (None: it lists none)."""
    return listed(body, "messages")


def system(body: Json) -> Json:
    """The system prompt."""
    return body.get("system") if isinstance(body, dict) else None


def count_images(body: Json, http: HttpRefs = NO_HTTP) -> int:
    """Every ``image`` block in ``body``, whatever its source (a reference, base64, a URL, a
    provider file id), and every ``document`` block naming an attachment, tool results included."""
    return sum(1 for _ in _image_blocks(body))


#: What a ``document`` block has that an ``image`` block may not carry.
_DOCUMENT_ONLY: Final = frozenset({"title", "context", "citations"})


def _image_part(part: dict[str, Any], inline: Inline) -> dict[str, Any]:
    source = {"type": "base64", "media_type": inline.media_type, "data": inline.base64()}
    if part.get("type") == "document":
        return {**{k: v for k, v in part.items() if k not in _DOCUMENT_ONLY}, "type": "image", "source": source}
    return {**part, "source": source}


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


def rejection(status: int, doc: Json) -> Rejection | None:
    """The error answer ``doc`` read as an image refusal: the API's message, the pointer of the
    image block it names (``/messages/11/content/8``), if any, and whether it refused the image
    or its download."""
    error = error_object(doc)
    message = doc if isinstance(doc, str) else error.get("message") if error is not None else None
    if status != 400 or not isinstance(message, str):
        return None
    path = _PATH.match(message)
    # The patterns read SCAN_CHARS from the path's tail, so an absurd path cannot push the cause
    # out of what they read (the path itself is judged by ``part_pointer``).
    start = max(0, path.end(1) - _PATH_TAIL) if path else 0
    context = _CONTEXT.read(status, message, start, start + SCAN_CHARS)
    if context is not None:
        site = part_pointer(path.group(1), _ROOTS, _KEYS, _TAGS) if path else None
        return msgspec.structs.replace(context, site=site)
    fetch = _UNFETCHED.failure(message, start, start + SCAN_CHARS)
    if fetch is None and not _REJECTED.search(message, start, start + SCAN_CHARS):
        return None
    site = part_pointer(path.group(1), _ROOTS, _KEYS, _TAGS) if path else None
    return Rejection(message, site, fetch or "rejected")


def sign(method: str, url: str, headers: Mapping[str, str], body: bytes | None, credential: str) -> dict[str, str]:
    """The key in ``x-api-key`` (it reads nothing of the request)."""
    return {"x-api-key": credential}


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
