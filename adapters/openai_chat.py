"""OpenAI Chat Completions wire format (adapters layer, pure data mapping).

References sit in ``image_url.url`` of ``image_url`` parts, in any message's content list,
including ``tool`` messages, and in ``file.file_id`` of ``file`` parts (``sha256:<hex>``). A
resolved image becomes a ``data:`` URL (``detail`` and other keys kept; a ``file`` part becomes an
``image_url`` part, the one shape that carries an image); a placeholder becomes a ``text`` part.
An ``image_url`` part whose URL is ``http(s)`` is an image the provider fetches itself
(``find_slots``). ``PROFILE`` and ``rejection`` (what the API accepts in images, and its answers
refusing one or failing to download one) serve the Responses adapter too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from .base import (NO_IMAGES_STATUSES, SCAN_CHARS, Carried, ContextAnswers, FetchAnswers, Inline, Inliner, Json,
                   Known, KnownContext, KnownFetch, Linked, PlainInline, Site, Slot, content_lists, data_url_base64,
                   data_url_type, error_object, known_pattern, listed, opening_messages, part_pointer, patch)
from .facts import CallFacts, Files, FormatFacts, Socket, Spoken
from .responses import member
from ..policy.linked import Unfetched, is_web_url
from ..policy.model import ID_PREFIX, NO_HTTP, HttpRefs, ImageRef, Outcome, parse_file_id, parse_url_ref
from ..policy.profile import Profile, Rejection

NAME: Final = "openai_chat"
FORMAT: Final = "openai"
AUTH_HEADERS: Final = ("authorization",)
AUTH_QUERY: Final[tuple[str, ...]] = ()
#: What opens the base64 of an image the client inlined, in the raw body (the proxy's cheap scan).
INLINE_MARKERS: Final = (b";base64,",)
#: What every image part the provider fetches by URL spells in the raw body (the cheap pre-check).
URL_MARKERS: Final = (b'"image_url"',)
#: The paths that take this format's body (projected).
PATHS: Final = re.compile(r"(?:/v1)?/chat/completions")
#: Response members that differ on every call by design.
VOLATILE: Final = frozenset({"id", "created", "system_fingerprint"})
#: The ``openai`` format: the default upstream of requests no other format claims; the Responses
#: WebSocket mode and Realtime; a Files API that takes ``purpose=vision`` images and lists files.
FACTS: Final = FormatFacts(
    FORMAT, url="https://api.openai.com", spoken=Spoken(otherwise=True), provider="openai",
    sockets=(Socket(re.compile(r"(?:/v1)?/responses"), "responses"),
             Socket(re.compile(r"(?:/v1)?/realtime"), "realtime")),
    files=Files("multipart", purpose="vision", lists=True), v1_paths=True)
CALLS: Final = CallFacts(operation="chat")

_TYPES: Final = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 409: "invalid_request_error", 413: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error"}

#: OpenAI's image input requirements, the same for Chat Completions and Responses.
PROFILE: Final = Profile(
    FORMAT,
    # "PNG (.png) - JPEG (.jpeg and .jpg) - WEBP (.webp) - Non-animated GIF (.gif)" (a profile
    # cannot say "non-animated": an animated GIF is left to the rejection).
    ("image/png", "image/jpeg", "image/webp", "image/gif"),
    # No per-image byte limit is documented any more (the older guide said 20 MB per image).
    # "Up to 512 MB total payload size per request" (10^6-byte MB, the safe side). An earlier guide
    # said 50 MB; the API has been seen refusing "Total image size is 50.6MB, which exceeds the
    # allowed limit of 50.0MB" (a rejection below).
    max_request_bytes=512_000_000,
    # No side or pixel limit: the limit is 30,000 patches of 32x32 px per image, which a side or
    # pixel count cannot express exactly; an image over it is refused (a rejection below).
    # "Up to 1500 individual image inputs per request".
    max_images=1500,
    sources=("https://developers.openai.com/api/docs/guides/images-vision#image-input-requirements",),
)

#: OpenAI's answers refusing an image (HTTP 400 ``invalid_request_error``): a pattern of
#: ``error.message``, and where it was seen. ``error.param`` names the image part, when set.
REJECTIONS: Final[tuple[Known, ...]] = (
    (r"^Invalid image\.?$", "https://github.com/ijwfly/chatgpt-tg/issues/14"),
    (r"You uploaded an unsupported image", "https://github.com/CosmosShadow/gptpdf/issues/6"),
    (r"The image data you provided does not represent a valid image", "https://github.com/openai/openai-dotnet/issues/708"),
    (r"Expected a base64-encoded data URL with an image MIME type", "https://github.com/Alibaba-NLP/OmniSearch/issues/3"),
    (r"Total image size is [\d.]+ ?MB, which exceeds the allowed limit",
     "https://github.com/open-webui/open-webui/issues/26967"),
    (r"patches after processing, exceeding the limit of \d+", "https://github.com/NousResearch/hermes-agent/pull/106186"),
    # OpenAI-compatible providers users point the proxy at, in their own words:
    # xAI (a flat ``{"code": "invalid-argument", "error": "..."}``)
    (r"Invalid (?:PNG|JPEG) image", "https://github.com/NousResearch/hermes-agent/issues/69078"),
    (r"Base64 string of provided image cannot be decoded", "https://github.com/NousResearch/hermes-agent/pull/69104"),
    # Moonshot (Kimi)
    (r"failed to decode image", "https://github.com/MoonshotAI/kimi-cli/issues/1066"),
    (r"Unsupported image\. Please try another one", "https://github.com/MoonshotAI/kimi-code/pull/2362"),
    # Alibaba DashScope (Qwen), compatible mode
    (r"The media format is not supported or incorrect", "https://github.com/alibaba/spring-ai-alibaba/issues/319"),
    (r"The image length and width do not meet the model restrictions", "https://github.com/QwenLM/qwen-code/issues/2505"),
    # vLLM (NVIDIA NIM's vision models are served by it): PIL's words, a 400 since vLLM PR 19202
    (r"cannot identify image file", "https://github.com/vllm-project/vllm/pull/19202"),
    # Ollama's OpenAI-compatible endpoint
    (r"invalid image input", "https://github.com/ollama/ollama/blob/main/openai/openai.go"),
    (r"image: unknown format", "https://github.com/ollama/ollama/issues/11320"),
    (r"illegal base64 data at input byte", "https://github.com/jakobdylanc/llmcord/issues/29"),
)
#: Answers that say the model takes no images at all (learnt for the upstream and model: its images
#: become placeholders there, and stay images everywhere else): each comes with any of
#: ``NO_IMAGES_STATUSES``.
NO_IMAGES: Final[tuple[Known, ...]] = (
    (r"image_url is only supported by certain models", "https://github.com/browser-use/web-ui/issues/274"),
    (r"does not support image_url content", "https://github.com/pollinations/pollinations/issues/2588"),
    # DeepSeek: its JSON body parser, naming the message
    (r"unknown variant `?image_url`?, expected `?text`?", "https://github.com/BenedictKing/ccx/issues/95"),
    # xAI's text-only models
    (r"The model expects a single `?text`? element per message", "https://github.com/chatboxai/chatbox/issues/1622"),
    # DashScope's text-only models
    (r"Unexpected item type in content", "https://github.com/openclaw/openclaw/issues/92688"),
    # vLLM serving a text-only model
    (r"is not a multimodal model", "https://github.com/vllm-project/vllm/issues/23402"),
    (r"At most 0 image\(s\) may be provided", "https://github.com/vllm-project/vllm/issues/9739"),
    # Ollama: its cloud, and a local model without its vision projector
    (r"this model does not support image input", "https://github.com/ollama/ollama/issues/17301"),
    (r"this model is missing data required for image input", "https://github.com/open-webui/open-webui/issues/13077"),
    # OpenRouter: no endpoint of the model takes images (a 404)
    (r"No endpoints found that support image input", "https://github.com/aaif-goose/goose/issues/5396"),
    # LM Studio, llama.cpp's server (a 500), Groq's text-only models, Fireworks
    (r"Model does not support images", "https://github.com/lmstudio-ai/lmstudio-bug-tracker/issues/908"),
    (r"image input is not supported by this server", "https://github.com/ggml-org/llama.cpp/issues/13566"),
    (r"message\[\d+\]\.content must be a string", "https://github.com/vercel/ai/issues/2837"),
    (r"Cannot preprocess image len\(combined_imgs\)", "https://github.com/pydantic/pydantic-ai/issues/2424"),
)
CONTEXT: Final[tuple[KnownContext, ...]] = tuple((pattern, "no_images", NO_IMAGES_STATUSES, source)
                                                  for pattern, source in NO_IMAGES)
_CONTEXT: Final = ContextAnswers(CONTEXT)
#: ``error.code`` values that name an image refusal whatever the message says, and where seen.
REJECTION_CODES: Final = {"invalid_image_format": "https://github.com/STranslate/STranslate/issues/277"}
_REJECTED: Final = known_pattern(REJECTIONS)
#: OpenAI's answers when it could not download an image it fetches by URL (HTTP 400), and what
#: each says of the URL. The message names the URL (``Error while downloading https://...``);
#: ``error.code`` is ``invalid_image_url`` (Chat) or ``invalid_value`` with ``param: "url"``
#: (Responses). "Error while downloading" does not say why (a 404, an expired signature's 403,
#: an answer that is no image): it comes again for the same URL, so the URL is gone.
UNFETCHED: Final[tuple[KnownFetch, ...]] = (
    (r"^Timeout while downloading\b", "read_failed", "https://github.com/vercel/ai/issues/8857"),
    (r"^Error while downloading\b", "not_found", "https://github.com/openai/openai-python/pull/2790"),
    (r"^Failed to download image from\b", "not_found",
     "https://github.com/rashadwest/Sportstechwest/blob/HEAD/workflows/BallCODE-Book/FIX-IMAGE-URL-EXPRESSION.md"),
    # Azure OpenAI's wording
    (r"^The provided image url is not accessible", "not_found", "https://portkey.ai/collection/url-access-error-10057"),
    # DashScope's OpenAI-compatible API: an expired or unreachable URL in the history
    (r"Failed to download multimodal content", "not_found",
     "https://github.com/agentscope-ai/agentscope-java/issues/2700"),
)
#: ``error.code`` values that say the download failed whatever the message says, and where seen.
UNFETCHED_CODES: Final[dict[str, tuple[Unfetched, str]]] = {
    "invalid_image_url": ("not_found", "https://github.com/BerriAI/litellm/issues/8709"),
}
_UNFETCHED: Final = FetchAnswers(UNFETCHED)
_ROOTS: Final = frozenset({"messages", "input"})
_KEYS: Final = frozenset({"content", "output"})


def _image_parts(body: Json) -> Iterator[tuple[list[Json], int, dict[str, Any]]]:
    """Every ``image_url`` and ``file`` part of ``body`` (its content list, its index, the part),
    in document order."""
    for content in content_lists(body.get("messages") if isinstance(body, dict) else None):
        for index, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in ("image_url", "file"):
                yield content, index, part


def _file_id(part: dict[str, Any]) -> str | None:
    slot = part.get("file")
    file_id = slot.get("file_id") if isinstance(slot, dict) else None
    return file_id if isinstance(file_id, str) else None


def _ref(part: dict[str, Any], http: HttpRefs) -> ImageRef | None:
    if part["type"] == "file":
        file_id = _file_id(part)
        return parse_file_id(file_id) if file_id is not None else None
    slot = part.get("image_url")
    url = slot.get("url") if isinstance(slot, dict) else slot
    return parse_url_ref(url, http) if isinstance(url, str) else None


def _slot(content: list[Json], index: int, part: dict[str, Any], http: HttpRefs) -> Slot | None:
    """The image ``part`` is: a reference (``attachment:`` or ``http``'s URLs, a ``sha256:`` file
    id), one the client inlined (a base64 ``data:`` URL), one the provider fetches (an ``http(s)``
    URL), or None (a provider's own file, any other string)."""
    ref = _ref(part, http)
    if ref is not None:
        return Site(content, index, ref)
    slot = part.get("image_url")
    holder, key = (slot, "url") if isinstance(slot, dict) else (part, "image_url")
    url = holder.get(key)
    if not isinstance(url, str):
        return None
    if (data := data_url_base64(url)) is not None:
        return Carried(content, index, holder, key, url, data, declared=data_url_type(url))
    return Linked(content, index, url) if is_web_url(url) and http.rest(url) is None else None


def find_slots(body: Json, http: HttpRefs = NO_HTTP) -> list[Slot]:
    """Every image slot of ``body`` (``image_url`` and ``file`` parts of any message's content,
    ``tool`` messages too), in document order."""
    return [slot for content, index, part in _image_parts(body)
            if (slot := _slot(content, index, part, http)) is not None]


def session_hint(body: Json) -> tuple[str, str] | None:
    """The session a Chat body names: none of its fields is one (``user`` names a person)."""
    return None


def opening(body: Json) -> Json:
    """The messages up to the first user message (the system prompt before it)."""
    return opening_messages(messages(body))


def messages(body: Json) -> Json:
    """The conversation's messages, as the body lists them (None: it lists none)."""
    return listed(body, "messages")


def system(body: Json) -> Json:
    """The system prompt: the system and developer messages the conversation opens with."""
    prompt = []
    for message in messages(body) or ():
        if not (isinstance(message, dict) and message.get("role") in ("system", "developer")):
            break
        prompt.append(message)
    return prompt


def count_images(body: Json, http: HttpRefs = NO_HTTP) -> int:
    """Every ``image_url`` part in ``body``, whatever its URL (a reference, ``data:``, http(s)),
    and every ``file`` part naming an attachment (the provider's own files need not be images)."""
    return sum(1 for _, _, part in _image_parts(body)
               if part["type"] == "image_url" or (_file_id(part) or "").startswith(ID_PREFIX))


def _image_part(part: dict[str, Any], inline: Inline) -> dict[str, Any]:
    if part["type"] == "file":
        kept = {k: v for k, v in part.items() if k not in ("type", "file")}
        return {"type": "image_url", **kept, "image_url": {"url": inline.data_url()}}
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


def rejection(status: int, doc: Json) -> Rejection | None:
    """The error answer ``doc`` read as an image refusal: the API's message, the pointer of the
    image part its ``param`` names (``messages[1].content[0].image_url`` is
    ``/messages/1/content/0``), if any, and whether it refused the image, its download, or any
    image for the model (``context``). A provider's error a router relayed (OpenRouter's
    ``Provider returned error`` with the provider's own answer in ``metadata.raw``) is read as
    that answer; xAI's flat ``{"error": "<message>"}`` as its message."""
    doc = _relayed(doc)
    error = error_object(doc)
    message = _message(doc, error)
    if not isinstance(message, str):
        return None
    context = _CONTEXT.read(status, message)
    if context is not None:
        return context
    if status != 400:
        return None
    code = error.get("code") if error is not None else None
    code = code if isinstance(code, str) else None
    by_code = UNFETCHED_CODES.get(code) if code is not None else None
    fetch = _UNFETCHED.failure(message) or (by_code[0] if by_code is not None else None)
    if fetch is None and code not in REJECTION_CODES and not _REJECTED.search(message[:SCAN_CHARS]):
        return None
    param = error.get("param") if error is not None else None
    site = part_pointer(param, _ROOTS, _KEYS) if isinstance(param, str) else None
    return Rejection(message, site, fetch or "rejected")


def _relayed(doc: Json) -> Json:
    """The provider's own answer a router relayed (OpenRouter: ``{"error": {"message": "Provider
    returned error", "metadata": {"raw": "<the provider's answer>"}}}``), decoded when it is JSON,
    else its text (at most ``SCAN_CHARS``); any other answer as it is."""
    error = error_object(doc)
    metadata = error.get("metadata") if error is not None else None
    raw = metadata.get("raw") if isinstance(metadata, dict) else None
    if error is None or error.get("message") != "Provider returned error" or not isinstance(raw, str):
        return doc
    if len(raw) > SCAN_CHARS or not raw.lstrip().startswith("{"):
        return raw[:SCAN_CHARS]
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _message(doc: Json, error: dict[str, Any] | None) -> Any:
    """The message an error answer carries: ``error.message``, a flat ``error`` string (xAI), or
    a bare string."""
    if isinstance(doc, str):
        return doc
    if error is None:
        flat = doc.get("error") if isinstance(doc, dict) else None
        return flat if isinstance(flat, str) else None
    return error.get("message")


def sign(method: str, url: str, headers: Mapping[str, str], body: bytes | None, credential: str) -> dict[str, str]:
    """The key as a bearer token (it reads nothing of the request)."""
    return {"Authorization": f"Bearer {credential}"}


def usage(doc: Json) -> dict[str, Any] | None:
    """A completion's (or the last stream chunk's) ``usage``."""
    return member(doc, "usage")


def file_object(file_id: str, filename: str, media_type: str, size: int, created_at: int) -> dict[str, Any]:
    """An admitted attachment as the ``openai`` SDK's ``FileObject``."""
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created_at, "filename": filename,
            "purpose": "vision", "status": "processed", "expires_at": None, "status_details": None}


def file_deleted(file_id: str) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "deleted": True}
