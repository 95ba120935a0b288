"""Anthropic Message Batches wire format (adapters layer, pure data mapping).

A batch body is a list of Messages bodies (``requests[].params``): references are found and
rendered exactly as in ``anthropic_messages``, in every request of the batch. The image limits are
the Messages API's; the body may be larger. No answer here refuses an image: a batch's results,
refusals included, arrive later, not as the answer to the call.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from . import anthropic_messages
from .base import Json, Slot
from .facts import CallFacts
from ..policy.model import NO_HTTP, HttpRefs
from ..policy.profile import Rejection

NAME: Final = "anthropic_batches"
FORMAT: Final = "anthropic"
AUTH_HEADERS: Final = anthropic_messages.AUTH_HEADERS
AUTH_QUERY: Final = anthropic_messages.AUTH_QUERY
INLINE_MARKERS: Final = anthropic_messages.INLINE_MARKERS
URL_MARKERS: Final = anthropic_messages.URL_MARKERS
render = anthropic_messages.render
error_body = anthropic_messages.error_body
sign = anthropic_messages.sign
PATHS: Final = re.compile(r"(?:/v1)?/messages/batches")
VOLATILE: Final = frozenset({"id", "created_at", "expires_at", "ended_at", "cancel_initiated_at",
                             "archived_at", "results_url"})
FACTS: Final = anthropic_messages.FACTS
#: A batch is no generation of its own (its requests are, later): no operation.
CALLS: Final = CallFacts()
#: The Messages API's image limits; "Batch API: 256 MB" per request (10^6-byte MB, the safe side).
#: Anthropic's, with the batch size limit. The many-image rule is per message request, and a batch
#: body holds many: counted across the batch it would shrink images no request has too many of.
PROFILE: Final = msgspec.structs.replace(anthropic_messages.PROFILE, max_request_bytes=256_000_000,
                                         many_images=None, many_images_max_side=None)


def rejection(status: int, doc: Json) -> Rejection | None:
    """Never an image refusal: a batch's requests are answered later, in its results."""
    return None


def usage(doc: Json) -> dict[str, Any] | None:
    """A batch reports no usage of its own (its results do, later)."""
    return None


def count_images(body: Json, http: HttpRefs = NO_HTTP) -> int:
    """0: a batch holds many requests, each under the image limits on its own, so no one count
    of the body applies (``find_slots`` still finds every image in every request)."""
    return 0


def find_slots(body: Json, http: HttpRefs = NO_HTTP) -> list[Slot]:
    """The image slots of every request of the batch (``anthropic_messages``), in document order."""
    requests = body.get("requests") if isinstance(body, dict) else None
    slots: list[Slot] = []
    for request in requests if isinstance(requests, list) else ():
        if isinstance(request, dict):
            slots += anthropic_messages.find_slots(request.get("params"), http)
    return slots


def session_hint(body: Json) -> tuple[str, str] | None:
    """A batch belongs to no one conversation."""
    return None


def opening(body: Json) -> Json:
    """None: a batch's requests open many conversations; no session is derived for it."""
    return None


def messages(body: Json) -> Json:
    """None: a batch's requests are many conversations; none is continued by its messages."""
    return None


def system(body: Json) -> Json:
    """None: a batch's requests each have their own."""
    return None
