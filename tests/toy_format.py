"""A toy wire format, for the tests alone: a format is one adapter module and one registry entry
(``tests/proxy/call/test_toy_format.py`` registers it and runs the proxy against an upstream of it).

A body is ``{"inputs": [{"text": "..."}, {"image": "attachment:sha256:..."}, ...]}`` on
``POST /toy/models/{model}/generate`` (the model is in the path, not the body). A resolved image
becomes ``{"image": {"media_type": ..., "base64": ...}}``, a placeholder ``{"text": ...}``. Its
upstream signs each request: ``x-toy-signature`` is ``sig(key, method, URL, body)``, an HMAC over
all three, which the fake upstream checks; the client's own key travels in ``x-toy-key``. It has
a Files API as OpenAI's (``multipart``), whose file objects are its own shape.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from projectionist.adapters.base import Inline, Inliner, Json, PlainInline, Site, Slot, patch
from projectionist.adapters.facts import CallFacts, Files, FormatFacts, Spoken
from projectionist.policy.model import NO_HTTP, HttpRefs, Outcome, parse_url_ref
from projectionist.policy.profile import Profile, Rejection

NAME: Final = "toy"
FORMAT: Final = "toy"
AUTH_HEADERS: Final = ("x-toy-key",)
AUTH_QUERY: Final[tuple[str, ...]] = ()
INLINE_MARKERS: Final = (b'"base64":',)
URL_MARKERS: Final = (b'"image"',)
PATHS: Final = re.compile(r"/toy/models/[^/]+/generate")
VOLATILE: Final = frozenset({"id"})
PROFILE: Final = Profile(FORMAT, ("image/png", "image/jpeg"), max_request_bytes=8_000_000)
#: Requests under ``/toy/`` speak it; its upstream signs each request; it has no default upstream.
FACTS: Final = FormatFacts(FORMAT, spoken=Spoken(prefixes=("/toy/",)), provider="toy.example",
                           files=Files("multipart"), signs_request=True)
CALLS: Final = CallFacts(operation="toy_generate", model_path=re.compile(r"/models/([^/]+)/generate"))
SIGNATURE: Final = "x-toy-signature"


def sig(key: str, method: str, url: str, body: bytes) -> str:
    """The signature the toy upstream expects: HMAC-SHA256 of the method, the URL and the body."""
    return hmac.new(key.encode(), method.encode() + b"\n" + url.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def sign(method: str, url: str, headers: Mapping[str, str], body: bytes | None, credential: str) -> dict[str, str]:
    return {SIGNATURE: sig(credential, method, url, body or b"")}


def _image_inputs(body: Json) -> Iterator[tuple[list[Json], int, str]]:
    inputs = body.get("inputs") if isinstance(body, dict) else None
    for index, part in enumerate(inputs if isinstance(inputs, list) else ()):
        if isinstance(part, dict) and isinstance(part.get("image"), str):
            yield inputs, index, part["image"]


def find_slots(body: Json, http: HttpRefs = NO_HTTP) -> list[Slot]:
    """Every ``image`` input naming a reference (the toy has no inlined or linked images)."""
    return [Site(inputs, index, ref) for inputs, index, url in _image_inputs(body)
            if (ref := parse_url_ref(url, http)) is not None]


def count_images(body: Json, http: HttpRefs = NO_HTTP) -> int:
    return sum(1 for _ in _image_inputs(body))


def session_hint(body: Json) -> tuple[str, str] | None:
    return None


def opening(body: Json) -> Json:
    return None


def messages(body: Json) -> Json:
    return None


def system(body: Json) -> Json:
    return None


def _image_part(part: dict[str, Any], inline: Inline) -> dict[str, Any]:
    return {"image": {"media_type": inline.media_type, "base64": inline.base64()}}


def _text_part(part: dict[str, Any], text: str) -> dict[str, Any]:
    return {"text": text}


def render(sites: list[Site], outcomes: tuple[Outcome, ...], inline: Inliner = PlainInline) -> None:
    patch(sites, outcomes, _image_part, _text_part, inline)


def error_body(code: str, message: str, status: int) -> dict[str, Any]:
    return {"toy_error": {"code": code, "message": message}}


def usage(doc: Json) -> dict[str, Any] | None:
    found = doc.get("usage") if isinstance(doc, dict) else None
    return found if isinstance(found, dict) else None


def rejection(status: int, doc: Json) -> Rejection | None:
    return None


def file_object(file_id: str, filename: str, media_type: str, size: int, created_at: int) -> dict[str, Any]:
    return {"toy_file": file_id, "name": filename, "media_type": media_type, "size": size}


def file_deleted(file_id: str) -> dict[str, Any]:
    return {"toy_file": file_id, "deleted": True}
