"""The OpenAI Responses golden request (``tests/golden/openai_responses.*.json``): its pinned images,
their ids, and the texts and data URLs the projection gives them; shared by the pure adapter tests and
the proxy tests of ``POST /v1/responses``."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Final

from projectionist.policy.model import StoredImage
from tests.paths import GOLDEN

GOLDEN_REQUEST: Final = GOLDEN / "openai_responses.request.json"
GOLDEN_PROJECTED: Final = GOLDEN / "openai_responses.projected.json"

#: Three 1x1 PNGs, pinned as bytes so the golden files never depend on the local zlib/Pillow.
PNG_A: Final = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
PNG_B: Final = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNgYPgPAAEDAQAIicLsAAAAAElFTkSuQmCC")
PNG_GONE: Final = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNg+M8AAAICAQB7CYF4AAAAAElFTkSuQmCC")


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def not_found_text(attachment_id: str, name: str | None = None) -> str:
    quoted = f"; {json.dumps(name)}" if name is not None else ""
    return f"[image unavailable: not_found{quoted} ({attachment_id[:15]})]"


A: Final = sha(PNG_A)
B: Final = sha(PNG_B)
GONE: Final = sha(PNG_GONE)


def golden_request() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(GOLDEN_REQUEST.read_text())
    return body


def golden_projected() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(GOLDEN_PROJECTED.read_text())
    return body


def stored(data: bytes) -> StoredImage:
    return StoredImage(sha(data), "image/png", len(data), 1, 1, data)
