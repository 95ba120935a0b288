"""Golden test of the Anthropic Message Batches adapter (``POST /v1/messages/batches``).

One realistic batch (``tests/golden/anthropic_batches.request.json``) of three requests holds
healthy references (URL and file-id forms, a repeat across requests), a missing one (``not_found``,
named in one request and unnamed in another), a flaky one (``read_failed``) nested in a tool result,
references that are not ours (https URL, provider file id, a reference inside plain text), and
unknown fields at the top level, inside a request item, inside ``params``, on messages and on content
blocks. ``find_refs`` + ``render`` with outcomes built from the real policy text must give exactly
``tests/golden/anthropic_batches.projected.json``. (The same batch through the proxy:
``tests/proxy/call/test_golden_batches.py``.)

The images, ids and helpers are those of the chat golden tests, in ``tests/golden_chat.py``.
Regenerate the golden file (then review its diff by hand) with ``PROJECTIONIST_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import base64

from projectionist.adapters import anthropic_batches
from projectionist.adapters.base import refs
from tests.golden_chat import (
    BLUE, GREEN, RED, UPDATE, A, B, C, F, M, Path_, at, differing_paths, dump, load, project,
)
from tests.paths import GOLDEN

NAME = "anthropic_batches"

# Expected sites in document order: (path of the block, id, name as written).
SITES: list[tuple[Path_, str, str | None]] = [
    (("requests", 0, "params", "messages", 0, "content", 1), A, "before.png"),
    (("requests", 0, "params", "messages", 0, "content", 2), M, "gone \N{FRAME WITH PICTURE}.png"),
    (("requests", 1, "params", "messages", 2, "content", 0, "content", 1), B, None),
    (("requests", 1, "params", "messages", 2, "content", 0, "content", 2), M, None),
    (("requests", 1, "params", "messages", 2, "content", 0, "content", 3), F, None),
    (("requests", 2, "params", "messages", 0, "content", 1), C, "crop.png"),
    (("requests", 2, "params", "messages", 0, "content", 2), A, None),
]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_projection_matches_the_golden_file() -> None:
    projected, _ = project(anthropic_batches, load(NAME, "request"))
    golden = GOLDEN / f"{NAME}.projected.json"
    if UPDATE:
        golden.write_text(dump(projected), encoding="utf-8")
    assert projected == load(NAME, "projected")
    assert dump(projected) == golden.read_text(encoding="utf-8")  # key order too: upstream bytes are pinned


def test_sites_are_found_in_document_order_with_names() -> None:
    request = load(NAME, "request")
    sites = refs(anthropic_batches.find_slots(request))
    assert [(s.ref.id, s.ref.name) for s in sites] == [(aid, name) for _, aid, name in SITES]
    for site, (path, _, _) in zip(sites, SITES):
        assert site.parent is at(request, path[:-1]) and site.index == path[-1]


def test_only_the_reference_slots_change_and_unknown_fields_survive() -> None:
    request = load(NAME, "request")
    projected, _ = project(anthropic_batches, request)
    site_paths = [path for path, _, _ in SITES]
    changed = differing_paths(request, projected)
    assert changed, "nothing was projected"
    for path in changed:
        assert any(path[:len(site)] == site for site in site_paths), f"changed outside a reference slot: {path}"
    for site in site_paths:
        assert any(path[:len(site)] == site for path in changed), f"reference slot left unchanged: {site}"
    # Unknown fields, spelled out: top level, request item, params, message, content blocks.
    assert list(projected) == ["x_batch_meta", "requests", "x_trailing"]
    assert projected["x_batch_meta"] == {"submitted_by": "nightly-eval", "tags": ["vision", 2]}
    assert projected["x_trailing"] == 1.5
    first, second, third = projected["requests"]
    assert [r["custom_id"] for r in projected["requests"]] == ["compare-1", "tool-2", "plain-3"]
    assert first["x_item_note"] == {"priority": "high"} and third["x_item_note"] is None
    assert first["params"]["x_params_extra"] == {"trace": "abc-123", "sample": 0.25}
    assert third["params"]["x_params_extra"] == [] and third["params"]["stream"] is False
    assert first["params"]["messages"][0]["x_message_meta"] == {"client_msg_id": "b-1"}
    blocks = first["params"]["messages"][0]["content"]
    assert blocks[0]["x_block_extra"] == {"lang": "en"}
    assert blocks[1]["x_block_extra"] == {"k": "v"}  # kept on an inlined image block
    assert blocks[3]["x_block_extra"] == [1, 2]  # a block that is not ours: untouched
    tool = second["params"]["messages"][2]["content"][0]
    assert tool["x_tool_extra"] == [1, "two"] and tool["cache_control"] == {"type": "ephemeral"}
    assert tool["content"][0]["x_block_extra"] is True
    assert tool["content"][1]["x_block_extra"] == {"nested": None}
    for key in ("model", "max_tokens", "system", "tools"):
        for before, after in zip(load(NAME, "request")["requests"], projected["requests"]):
            assert after["params"].get(key) == before["params"].get(key)
    assert refs(anthropic_batches.find_slots(projected)) == []  # every reference became bytes or text


def test_anthropic_batches_shapes() -> None:
    projected, _ = project(anthropic_batches, load(NAME, "request"))
    request = load(NAME, "request")
    first, second, third = (r["params"]["messages"] for r in projected["requests"])
    missing = f'[image unavailable: not_found; "gone \N{FRAME WITH PICTURE}.png" ({M[:15]})]'
    assert first[0]["content"][1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": b64(RED.data)},
                                      "cache_control": {"type": "ephemeral"}, "x_block_extra": {"k": "v"}}
    assert first[0]["content"][2] == {"type": "text", "text": missing, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    nested = second[2]["content"][0]["content"]
    assert nested[1] == {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": b64(BLUE.data)},
                         "x_block_extra": {"nested": None}}
    # Unnamed in this request: the name recorded with the batch-wide quarantine of the first request.
    assert nested[2] == {"type": "text", "text": missing, "cache_control": {"type": "ephemeral"}}
    assert nested[3] == {"type": "text", "text": f"[image unavailable: read_failed ({F[:15]})]"}
    assert second[2]["content"][1] == {"type": "text", "text": "What changed?"}
    assert third[0]["content"][0] == request["requests"][2]["params"]["messages"][0]["content"][0]  # provider file id
    assert third[0]["content"][1]["source"] == {"type": "base64", "media_type": "image/png", "data": b64(GREEN.data)}
    assert third[0]["content"][2]["source"] == first[0]["content"][1]["source"]  # repeat across requests
    assert third[0]["content"][3] == {"type": "text", "text": f"The earlier frame was attachment:{A}"}


def test_render_is_deterministic() -> None:
    one, _ = project(anthropic_batches, load(NAME, "request"))
    two, _ = project(anthropic_batches, load(NAME, "request"))
    assert dump(one) == dump(two)
