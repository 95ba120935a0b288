"""The golden cases of the OpenAI Chat, Anthropic Messages and Anthropic Message Batches adapters:
the pinned images and ids, the expected reference sites, the outcomes the real policy would give,
and the helpers that send a golden request through a proxy harness.

Used by the pure adapter tests (``tests/adapters/test_golden_*.py``) and by the same requests sent
through the proxy (``tests/proxy/call/test_golden_*.py``). The golden files live in ``tests/golden/``;
regenerate one (then review its diff by hand) with ``PROJECTIONIST_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
from types import ModuleType
from typing import Any

from projectionist.adapters import anthropic_messages, openai_chat
from projectionist.adapters.base import Site, refs
from projectionist.policy.errors import READ_FAILED, AttachmentError
from projectionist.policy.events import Quarantine
from projectionist.policy.fold import placeholder
from projectionist.policy.model import Failure, Outcome, Resolved, StoredImage, Placeholder
from tests.conftest import Harness
from tests.paths import GOLDEN

UPDATE = os.environ.get("PROJECTIONIST_UPDATE_GOLDEN") == "1"


def stored(b64: str, media_type: str, width: int, height: int) -> StoredImage:
    data = base64.b64decode(b64)
    return StoredImage("sha256:" + hashlib.sha256(data).hexdigest(), media_type, len(data), width, height, data)


# Tiny real images, pinned as bytes (not re-encoded by Pillow, whose output may change).
RED = stored("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC",
             "image/png", 1, 1)
BLUE = stored("R0lGODdhAgABAIEAAAAA/wAAAAAAAAAAACwAAAAAAgABAAAIBQABAAgIADs=", "image/gif", 2, 1)
GREEN = stored("iVBORw0KGgoAAAANSUhEUgAAAAEAAAACCAIAAAAW4yFwAAAAEElEQVR4nGNgaGBgYmBgAAADEACD65yjTgAAAABJRU5ErkJggg==",
               "image/png", 1, 2)
A, B, C = RED.id, BLUE.id, GREEN.id
M = "sha256:" + hashlib.sha256(b"projectionist golden: missing").hexdigest()
F = "sha256:" + hashlib.sha256(b"projectionist golden: flaky").hexdigest()
HEALTHY = {image.id: image for image in (RED, BLUE, GREEN)}
FAILING: dict[str, tuple[Failure, bool]] = {M: ("not_found", False), F: ("read_failed", True)}

Path_ = tuple[str | int, ...]

# (adapter, expected sites in document order as (path of the part, id, name as written))
CASES: dict[str, tuple[ModuleType, list[tuple[Path_, str, str | None]]]] = {
    "openai_chat": (openai_chat, [
        (("messages", 1, "content", 1), A, "before.png"),
        (("messages", 1, "content", 2), M, 'after "v2" – final.png'),
        (("messages", 3, "content", 1), B, None),
        (("messages", 3, "content", 2), M, None),
        (("messages", 5, "content", 1), A, None),
        (("messages", 5, "content", 2), C, "crop.png"),
        (("messages", 5, "content", 3), M, "renamed.png"),
    ]),
    "anthropic_messages": (anthropic_messages, [
        (("messages", 0, "content", 1), A, "before.png"),
        (("messages", 0, "content", 2), B, None),
        (("messages", 0, "content", 3), M, "gone \N{FRAME WITH PICTURE}.png"),
        (("messages", 0, "content", 4), F, None),
        (("messages", 2, "content", 0, "content", 1), A, None),
        (("messages", 2, "content", 0, "content", 2), M, None),
        (("messages", 2, "content", 0, "content", 3), C, "crop.png"),
        (("messages", 4, "content", 0), F, "flaky.png"),
    ]),
}


def load(name: str, kind: str) -> Any:
    return json.loads((GOLDEN / f"{name}.{kind}.json").read_text(encoding="utf-8"))


def dump(body: Any) -> str:
    return json.dumps(body, indent=2, ensure_ascii=False) + "\n"


def at(body: Any, path: Path_) -> Any:
    for key in path:
        body = body[key]
    return body


def outcomes_for(sites: list[Site]) -> tuple[Outcome, ...]:
    """What ``policy.project`` decides for these sites when the store holds HEALTHY and FAILING
    fails: the quarantine records the first display name written for an id; each placeholder is
    the real policy text for the reference as written."""
    names: dict[str, str | None] = {}
    for site in sites:
        if names.get(site.ref.id) is None:
            names[site.ref.id] = site.ref.name
    outcomes: list[Outcome] = []
    for site in sites:
        aid = site.ref.id
        if aid in HEALTHY:
            outcomes.append(Resolved(HEALTHY[aid]))
        else:
            failure, retryable = FAILING[aid]
            quarantine = Quarantine(aid, failure, retryable=retryable, name=names[aid])
            outcomes.append(Placeholder(failure, placeholder(site.ref, quarantine)))
    return tuple(outcomes)


def project(adapter: ModuleType, request: Any) -> tuple[Any, list[Site]]:
    body = copy.deepcopy(request)
    sites = refs(adapter.find_slots(body))
    adapter.render(sites, outcomes_for(sites))
    return body, sites


def differing_paths(a: Any, b: Any, path: Path_ = ()) -> list[Path_]:
    """The outermost paths at which two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [p for key in a for p in differing_paths(a[key], b[key], (*path, key))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in differing_paths(x, y, (*path, i))]
    return [] if type(a) is type(b) and a == b else [path]


# --- the same requests through the proxy (a test harness) ------------------------------------------

async def admit(harness: Harness, image: StoredImage) -> None:
    resp = await harness.client.post("/v1/attachments", data=image.data, headers={"Content-Type": image.media_type})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert (body["id"], body["width"], body["height"]) == (image.id, image.width, image.height)


def golden_headers(session: str) -> dict[str, str]:
    return {"X-Session-Id": session, "Content-Type": "application/json"}


async def send_golden(harness: Harness, name: str, path: str, session: str) -> bytes:
    """Admit the healthy images, make F flaky, send the golden request ``name``; returns its bytes."""
    for image in HEALTHY.values():
        await admit(harness, image)

    def flaky(attachment_id: str, n: int) -> float | None:
        if attachment_id == F:
            raise AttachmentError(READ_FAILED, attachment_id=attachment_id)
        return None

    harness.store.script = flaky
    raw = (GOLDEN / f"{name}.request.json").read_bytes()
    resp = await harness.client.post(path, data=raw, headers=golden_headers(session))
    assert resp.status == 200, await resp.text()
    return raw


async def assert_resent_identically_without_reads(harness: Harness, path: str, raw: bytes, session: str,
                                                  events: int) -> None:
    """Sending ``raw`` again gives the same upstream bytes, derived from the log alone."""
    first_body = harness.upstream.last.body
    reads = {aid: harness.store.reads.get(aid, 0) for aid in FAILING}
    again = await harness.client.post(path, data=raw, headers=golden_headers(session))
    assert again.status == 200
    assert harness.upstream.last.body == first_body  # byte-identical: derived from the log alone
    assert {aid: harness.store.reads.get(aid, 0) for aid in FAILING} == reads  # quarantined: never read again
    assert len(await harness.events(session)) == events
