"""An upstream's image limits as the providers document and enforce them, in their own words.

Each ``*_refusal`` reads a request body as its provider would and returns the error it answers
(HTTP status and JSON body), or None when the provider takes the request. Images are decoded
with Pillow, as a provider does: an image that does not decode, is labelled with another type
than its bytes are, or breaks a size rule is refused with the provider's documented message (the
wordings and their sources are in ``adapters``' tables). ``script`` makes one a ``FakeUpstream``
script, and counts what it refused.

- Anthropic Messages: an empty image, bytes that are no image ("Could not process image"), a
  media type that is not the bytes', a side over 8000 px, and with more than 20 images in the
  request a side over 2000 px (the many-image rule), each naming the block.
- OpenAI Chat: a model named ``deepseek-*`` takes no images (DeepSeek's parser error); bytes that
  are no image ("You uploaded an unsupported image").
- Gemini: a type it does not take answers the generic "Request contains an invalid argument."
  (as it does for a BMP); bytes that are no image "Unable to process input image".
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from PIL import Image

_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp", "BMP": "image/bmp"}
Refusal = tuple[int, dict[str, Any]]


def opened(data: bytes) -> tuple[str, int, int] | None:
    """What the bytes decode as (media type, width, height), or None: no image, or cut short."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return _TYPES.get(img.format or "", "image/other"), img.width, img.height
    except Exception:  # noqa: BLE001 (a provider's decoder: anything that fails is no image)
        return None


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def anthropic_blocks(doc: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every image block with a base64 source, with the path the API names it by."""
    for m, message in enumerate(doc.get("messages", [])):
        content = message.get("content") if isinstance(message, dict) else None
        for c, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "image":
                yield f"messages.{m}.content.{c}", block
            elif block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                for k, inner in enumerate(block["content"]):
                    if isinstance(inner, dict) and inner.get("type") == "image":
                        yield f"messages.{m}.content.{c}.tool_result.content.{k}", inner


def _anthropic(message: str) -> Refusal:
    return 400, {"type": "error", "error": {"type": "invalid_request_error", "message": message},
                 "request_id": "req_limits"}


def anthropic_refusal(doc: Any) -> Refusal | None:
    blocks = [(path, block) for path, block in anthropic_blocks(doc) if block["source"].get("type") == "base64"]
    many = len(list(anthropic_blocks(doc))) > 20
    for path, block in blocks:
        source = block["source"]
        if not source.get("data"):
            return _anthropic(f"{path}.image.source.base64: image cannot be empty")
        data = _b64(source["data"])
        found = opened(data) if data is not None else None
        if found is None:
            return _anthropic("Could not process image")
        media_type, width, height = found
        if media_type != source.get("media_type"):
            return _anthropic(f"{path}.image.source.base64.data: Image does not match the provided media type "
                              f"{source.get('media_type')}")
        if max(width, height) > 8000:
            return _anthropic(f"{path}.image.source.base64.data: At least one of the image dimensions exceed max "
                              "allowed size: 8000 pixels")
        if many and max(width, height) > 2000:
            return _anthropic(f"{path}.image.source.base64.data: At least one of the image dimensions exceed max "
                              "allowed size for many-image requests: 2000 pixels")
    return None


def chat_images(doc: Any) -> Iterator[str]:
    """The URL of every ``image_url`` part."""
    for message in doc.get("messages", []):
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                slot = part["image_url"]
                yield slot["url"] if isinstance(slot, dict) else slot


def chat_refusal(doc: Any) -> Refusal | None:
    urls = list(chat_images(doc))
    if urls and str(doc.get("model", "")).startswith("deepseek"):
        return 400, {"error": {"message": "Failed to deserialize the JSON body into the target type: messages[1]: "
                                          "unknown variant `image_url`, expected `text` at line 1 column 180",
                               "type": "invalid_request_error", "param": None, "code": "invalid_request_error"}}
    for url in urls:
        data = _b64(url.split(",", 1)[1]) if url.startswith("data:") else b""
        if url.startswith("data:") and (data is None or opened(data) is None):
            return 400, {"error": {"message": "You uploaded an unsupported image. Please make sure your image is "
                                              "valid.", "type": "invalid_request_error", "param": None,
                                   "code": "invalid_image_format"}}
    return None


GEMINI_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/heic", "image/heif"})


def gemini_refusal(doc: Any) -> Refusal | None:
    for content in doc.get("contents", []):
        for part in content.get("parts", []) if isinstance(content, dict) else []:
            inline = part.get("inline_data") or part.get("inlineData") if isinstance(part, dict) else None
            if not isinstance(inline, dict):
                continue
            mime = inline.get("mime_type") or inline.get("mimeType")
            data = _b64(inline.get("data", ""))
            found = opened(data) if data is not None else None
            if mime not in GEMINI_TYPES or (found is not None and found[0] != mime):
                return 400, {"error": {"code": 400, "message": "Request contains an invalid argument.",
                                       "status": "INVALID_ARGUMENT"}}
            if found is None:
                return 400, {"error": {"code": 400, "message": "Unable to process input image. Please retry or "
                                                              "report in https://developers.generativeai.google/"
                                                              "guide/troubleshooting", "status": "INVALID_ARGUMENT"}}
    return None


@dataclass
class Enforcing:
    """A ``FakeUpstream`` script that answers every model call its provider would refuse with the
    provider's error (``refused`` lists them: path and message)."""

    refused: list[tuple[str, str]] = field(default_factory=list)
    extra: Callable[[web.Request, Any], Refusal | None] | None = None

    async def __call__(self, request: web.Request, doc: Any) -> web.StreamResponse | None:
        if not isinstance(doc, dict):
            return None
        found = self.extra(request, doc) if self.extra is not None else None
        if found is None:
            found = self.read(request.path, doc)
        if found is None:
            return None
        status, body = found
        error = body["error"]
        self.refused.append((request.path, error["message"] if isinstance(error, dict) else str(error)))
        return web.json_response(body, status=status)

    @staticmethod
    def read(path: str, doc: Any) -> Refusal | None:
        if path.endswith("/messages"):
            return anthropic_refusal(doc)
        if path.endswith("/chat/completions"):
            return chat_refusal(doc)
        if ":generateContent" in path or ":streamGenerateContent" in path:
            return gemini_refusal(doc)
        return None
