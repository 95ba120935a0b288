"""The Gemini golden request's pinned images and ids (``tests/golden/gemini.*.json``), shared by the
pure adapter tests and the proxy tests of the Gemini routes."""

from __future__ import annotations

import base64
import hashlib

import msgspec

from tests.imaging import ref_id
from tests.paths import GOLDEN

# The two tiny images of the golden files (1x1 PNGs, red and blue) and the two missing ids.
RED = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
BLUE = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNgYPgPAAEDAQAIicLsAAAAAElFTkSuQmCC")
RED_ID, BLUE_ID = ref_id(RED), ref_id(BLUE)
GONE_ID = "sha256:" + hashlib.sha256(b"gone").hexdigest()
GONE2_ID = "sha256:" + hashlib.sha256(b"gone-too").hexdigest()


def golden(name: str) -> bytes:
    """A golden file re-encoded compactly, key order kept (the proxy's own encoding)."""
    return msgspec.json.encode(msgspec.json.decode((GOLDEN / name).read_bytes()))
