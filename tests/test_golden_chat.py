"""Golden tests of the OpenAI Chat and Anthropic Messages adapters.

One realistic request per format (``tests/golden/<name>.request.json``) holds healthy references,
a missing one (``not_found``) and, for Anthropic, a flaky one (``read_failed``), nested tool
images, repeated references, Anthropic's file-id and URL forms, ``detail``/``cache_control`` and
unknown fields at several levels. ``find_refs`` + ``render`` with outcomes built from the real
policy text must give exactly ``tests/golden/<name>.projected.json``; the same request through the
proxy must reach the upstream as the same body.

Regenerate a golden file (then review its diff by hand) with ``PROJECTIONIST_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from projectionist.adapters import anthropic_messages, openai_chat
from projectionist.adapters.base import Site
from projectionist.policy.errors import READ_FAILED, AttachmentError
from projectionist.policy.events import Quarantine
from projectionist.policy.fold import placeholder
from projectionist.policy.model import Failure, Outcome, Resolved, StoredImage, Placeholder
from tests.conftest import Harness

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("PROJECTIONIST_UPDATE_GOLDEN") == "1"
SID = "golden-1"


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
    sites = adapter.find_refs(body)
    adapter.render(sites, outcomes_for(sites))
    return body, sites


def differing_paths(a: Any, b: Any, path: Path_ = ()) -> list[Path_]:
    """The outermost paths at which two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [p for key in a for p in differing_paths(a[key], b[key], (*path, key))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in differing_paths(x, y, (*path, i))]
    return [] if type(a) is type(b) and a == b else [path]


@pytest.mark.parametrize("name", CASES)
def test_projection_matches_the_golden_file(name: str) -> None:
    adapter, _ = CASES[name]
    projected, _sites = project(adapter, load(name, "request"))
    golden = GOLDEN / f"{name}.projected.json"
    if UPDATE:
        golden.write_text(dump(projected), encoding="utf-8")
    expected = json.loads(golden.read_text(encoding="utf-8"))
    assert projected == expected
    assert dump(projected) == golden.read_text(encoding="utf-8")  # key order too: upstream bytes are pinned


@pytest.mark.parametrize("name", CASES)
def test_sites_are_found_in_document_order_with_names(name: str) -> None:
    adapter, expected = CASES[name]
    request = load(name, "request")
    sites = adapter.find_refs(request)
    assert [(s.ref.id, s.ref.name) for s in sites] == [(aid, nm) for _, aid, nm in expected]
    for site, (path, _, _) in zip(sites, expected):
        assert site.parent is at(request, path[:-1]) and site.index == path[-1]


@pytest.mark.parametrize("name", CASES)
def test_only_the_reference_slots_change_and_unknown_fields_survive(name: str) -> None:
    adapter, expected = CASES[name]
    request = load(name, "request")
    projected, _ = project(adapter, request)
    site_paths = [path for path, _, _ in expected]
    changed = differing_paths(request, projected)
    assert changed, "nothing was projected"
    for path in changed:
        assert any(path[:len(site)] == site for site in site_paths), f"changed outside a reference slot: {path}"
    for site in site_paths:
        assert any(path[:len(site)] == site for path in changed), f"reference slot left unchanged: {site}"
    for key in ("x_gateway", "model", "tools", "metadata", "response_format", "thinking", "system", "tool_choice"):
        if key in request:
            assert projected[key] == request[key]
    assert projected["messages"][1 if name == "openai_chat" else 0]["x_message_meta"] == {"client_msg_id": "m-1"}
    assert adapter.find_refs(projected) == []  # every reference became bytes or text


def test_openai_chat_shapes() -> None:
    projected, _ = project(openai_chat, load("openai_chat", "request"))
    first = projected["messages"][1]["content"]
    assert first[1] == {"type": "image_url", "x_part_note": "kept on the image part", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(RED.data).decode(), "detail": "high",
        "x_slot_extra": {"k": [1, 2]}}}
    assert first[2] == {"type": "text", "text": f'[image unavailable: not_found; "after \\"v2\\" – final.png" ({M[:15]})]'}
    tool = projected["messages"][3]["content"]
    assert tool[1]["image_url"] == {"url": "data:image/gif;base64," + base64.b64encode(BLUE.data).decode(), "detail": "auto"}
    assert tool[2] == first[2]  # unnamed repeat: the name recorded with the quarantine
    last = projected["messages"][5]["content"]
    assert last[1]["image_url"]["url"] == first[1]["image_url"]["url"]
    assert last[2] == {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(GREEN.data).decode()}}
    assert last[3] == {"type": "text", "text": f'[image unavailable: not_found; "renamed.png" ({M[:15]})]'}


def test_anthropic_messages_shapes() -> None:
    projected, _ = project(anthropic_messages, load("anthropic_messages", "request"))
    first = projected["messages"][0]["content"]
    b64 = {i.id: base64.b64encode(i.data).decode() for i in HEALTHY.values()}
    assert first[1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64[A]},
                        "cache_control": {"type": "ephemeral"}}
    assert first[2] == {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": b64[B]},
                        "x_block_extra": {"k": "v"}}
    assert first[3] == {"type": "text", "text": f'[image unavailable: not_found; "gone \N{FRAME WITH PICTURE}.png" ({M[:15]})]',
                        "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    assert first[4] == {"type": "text", "text": f'[image unavailable: read_failed; "flaky.png" ({F[:15]})]'}
    nested = projected["messages"][2]["content"][0]
    assert nested["x_tool_extra"] == [1, "two"] and nested["cache_control"] == {"type": "ephemeral"}
    assert nested["content"][1]["source"]["data"] == b64[A]
    assert nested["content"][2] == {"type": "text", "text": f'[image unavailable: not_found; "gone \N{FRAME WITH PICTURE}.png" ({M[:15]})]',
                                    "cache_control": {"type": "ephemeral"}}
    assert nested["content"][3]["source"] == {"type": "base64", "media_type": "image/png", "data": b64[C]}
    request = load("anthropic_messages", "request")
    for untouched in (5, 6, 7, 8):  # https URL, provider file id, inline base64, document
        assert first[untouched] == request["messages"][0]["content"][untouched]


def test_render_is_deterministic() -> None:
    for name, (adapter, _) in CASES.items():
        one, _ = project(adapter, load(name, "request"))
        two, _ = project(adapter, load(name, "request"))
        assert dump(one) == dump(two)


# --- the same requests through the proxy ----------------------------------------------------------

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


@pytest.mark.parametrize(("name", "path"), [("openai_chat", "/v1/chat/completions"),
                                            ("anthropic_messages", "/v1/messages")])
async def test_the_proxy_sends_the_golden_body_upstream(harness: Harness, name: str, path: str) -> None:
    raw = await send_golden(harness, name, path, SID)
    assert harness.upstream.last.json() == load(name, "projected")
    adapter, expected = CASES[name]
    failing = list(dict.fromkeys(aid for _, aid, _ in expected if aid in FAILING))
    names: dict[str, str | None] = {}
    for _, aid, nm in expected:
        if names.get(aid) is None:
            names[aid] = nm
    events = await harness.events(SID)
    assert [e["data"] for e in events] == [
        {"attachment_id": aid, "failure": FAILING[aid][0], "retryable": FAILING[aid][1], "name": names[aid]}
        for aid in failing]
    assert harness.store.reads[M] == 1
    assert harness.store.reads.get(F, 0) == (2 if F in failing else 0)  # one read + one immediate retry
    await assert_resent_identically_without_reads(harness, path, raw, SID, len(failing))
