"""Golden tests of the OpenAI Chat and Anthropic Messages adapters.

One realistic request per format (``tests/golden/<name>.request.json``) holds healthy references,
a missing one (``not_found``) and, for Anthropic, a flaky one (``read_failed``), nested tool
images, repeated references, Anthropic's file-id and URL forms, ``detail``/``cache_control`` and
unknown fields at several levels. ``find_refs`` + ``render`` with outcomes built from the real
policy text must give exactly ``tests/golden/<name>.projected.json``. (The same requests through the
proxy: ``tests/proxy/call/test_golden_chat.py``; the shared cases: ``tests/golden_chat.py``.)

Regenerate a golden file (then review its diff by hand) with ``PROJECTIONIST_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import base64
import json

import pytest

from projectionist.adapters import anthropic_messages, openai_chat
from projectionist.adapters.base import refs
from tests.golden_chat import (
    BLUE, CASES, GREEN, HEALTHY, RED, UPDATE, A, B, C, F, M, at, differing_paths, dump, load, project,
)
from tests.paths import GOLDEN


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
    sites = refs(adapter.find_slots(request))
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
    assert refs(adapter.find_slots(projected)) == []  # every reference became bytes or text


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
