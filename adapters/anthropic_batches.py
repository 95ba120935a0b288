"""Anthropic Message Batches wire format (adapters layer, pure data mapping).

A batch body is a list of Messages bodies (``requests[].params``): references are found and
rendered exactly as in ``anthropic_messages``, in every request of the batch.
"""

from __future__ import annotations

import re
from typing import Any, Final

from projectionist.adapters import anthropic_messages
from projectionist.adapters.base import Json, Site

NAME: Final = "anthropic_batches"
FORMAT: Final = "anthropic"
AUTH_HEADERS: Final = anthropic_messages.AUTH_HEADERS
AUTH_QUERY: Final = anthropic_messages.AUTH_QUERY
render = anthropic_messages.render
error_body = anthropic_messages.error_body
upstream_auth = anthropic_messages.upstream_auth
PATHS: Final = re.compile(r"(?:/v1)?/messages/batches")
VOLATILE: Final = frozenset({"id", "created_at", "expires_at", "ended_at", "cancel_initiated_at",
                             "archived_at", "results_url"})


def usage(doc: Json) -> dict[str, Any] | None:
    """A batch reports no usage of its own (its results do, later)."""
    return None


def find_refs(body: Json) -> list[Site]:
    requests = body.get("requests") if isinstance(body, dict) else None
    sites: list[Site] = []
    for request in requests if isinstance(requests, list) else ():
        if isinstance(request, dict):
            sites += anthropic_messages.find_refs(request.get("params"))
    return sites
