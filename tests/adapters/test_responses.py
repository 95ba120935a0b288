"""The OpenAI Responses adapter alone (pure) on one realistic request: ``find_refs`` finds the image
references in document order, and ``render`` with the outcomes of the real policy (on in-memory
doubles) or with hand-built ones gives exactly ``tests/golden/openai_responses.projected.json``.
The proxy and the official ``openai`` SDK on the same API: ``tests/proxy/call/test_responses.py``."""

from __future__ import annotations

import copy
import json
import os

from projectionist.adapters import openai_responses
from projectionist.policy.model import ImageRef, Resolved, Placeholder
from projectionist.policy.projection import ProjectionContext, project
from projectionist.adapters.base import refs
from tests.fakes import CountingStore
from tests.golden_responses import (
    A, B, GOLDEN_PROJECTED, GONE, PNG_A, PNG_B, data_url, golden_projected, golden_request, not_found_text, stored,
)
from tests.memory import MemoryLog, MemoryStore


# -- golden: the adapter on one realistic request ------------------------------------------------------

async def test_golden_find_refs_and_render_through_the_policy() -> None:
    original = golden_request()
    body = copy.deepcopy(original)
    sites = refs(openai_responses.find_slots(body))
    # document order: message content (A named, B file_id, GONE named), the function_call_output's
    # output list (A again, GONE again by file_id), the last message (B again); nothing else.
    assert [s.ref for s in sites] == [
        ImageRef(A, "diagram.png"), ImageRef(B), ImageRef(GONE, "gone shot.png"),
        ImageRef(A), ImageRef(GONE), ImageRef(B)]
    assert sites[3].parent is body["input"][3]["output"]

    store, log = CountingStore(MemoryStore(stored(PNG_A), stored(PNG_B))), MemoryLog()  # type: ignore[arg-type]
    projection = await project([s.ref for s in sites], ProjectionContext(store=store, log=log, session_id="golden"))
    assert store.reads == {A: 1, B: 1, GONE: 1}  # repeated references are read once
    assert [type(o).__name__ for o in projection.outcomes] == [
        "Resolved", "Resolved", "Placeholder", "Resolved", "Placeholder", "Resolved"]
    openai_responses.render(sites, projection.outcomes)

    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN_PROJECTED.write_text(json.dumps(body, indent=2) + "\n")
    assert body == golden_projected()

    # Spot checks of what the golden file pins, so a wrong golden cannot pass silently.
    content = body["input"][1]["content"]
    assert content[1] == {"type": "input_image", "detail": "low", "x_client_tag": {"keep": [1, "two", None]},
                          "image_url": data_url(PNG_A)}
    assert content[2] == {"type": "input_image", "detail": "auto", "image_url": data_url(PNG_B)}
    assert content[3] == {"type": "input_text", "text": not_found_text(GONE, "gone shot.png")}
    assert content[4:] == original["input"][1]["content"][4:]  # https, provider file id, data: untouched
    nested = body["input"][3]["output"]
    assert nested == [{"type": "input_text", "text": "screenshot attached"},
                      {"type": "input_image", "detail": "auto", "image_url": data_url(PNG_A)},
                      {"type": "input_text", "text": not_found_text(GONE, "gone shot.png")}]
    assert body["input"][6]["content"][0] == {"type": "input_image", "detail": "low", "image_url": data_url(PNG_B)}
    # Everything but the six image slots is the request as written, unknown fields included.
    for key in original.keys() - {"input"}:
        assert body[key] == original[key], key
    for index in (0, 2, 4, 5):
        assert body["input"][index] == original["input"][index]
    for index, item in enumerate(original["input"]):
        assert body["input"][index].keys() == item.keys()
        for key in item.keys() - {"content", "output"}:
            assert body["input"][index][key] == item[key]


async def test_golden_render_with_hand_built_outcomes_matches_the_pinned_body() -> None:
    body = golden_request()
    sites = refs(openai_responses.find_slots(body))
    gone = Placeholder("not_found", not_found_text(GONE, "gone shot.png"))
    outcomes = (Resolved(stored(PNG_A)), Resolved(stored(PNG_B)), gone, Resolved(stored(PNG_A)), gone,
                Resolved(stored(PNG_B)))
    openai_responses.render(sites, outcomes)
    assert body == golden_projected()
    assert refs(openai_responses.find_slots(body)) == []  # a projected body holds no reference any more
