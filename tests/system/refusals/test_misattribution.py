"""Attribution never quarantines images the upstream did not refuse: an unnamed refusal in a call
where the client inlined images of its own is not attributed, and an image another replica's
call accepted just before counts as accepted (its records are waited for one batch window)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.conftest import BACKENDS
from tests.imaging import make_image, ref_id
from tests.system.refusals.hostile import chat_body

RECORDING = {"record.mode": "metadata"}


def quarantined(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["attachment_id"] for e in events if e["type"] == "attachment/rejected"]


def images_sent(body: dict[str, Any]) -> list[str]:
    return [ref_id(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))
            for m in body["messages"] for p in m["content"] if p.get("type") == "image_url"]


async def test_a_refused_client_inlined_image_never_quarantines_a_healthy_reference(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    healthy = await harness.admit(color=1)
    broken = make_image(color=2)  # the client inlines these bytes itself; the upstream refuses them
    harness.upstream.refused[ref_id(broken)] = False
    data_url = "data:image/png;base64," + base64.b64encode(broken).decode()

    first = await harness.client.post("/v1/chat/completions", json=chat_body(healthy, inline=[data_url]),
                                      headers={"X-Session-Id": "inl"})
    assert first.status == 400  # the client's own image: its error is fair
    # the client drops its broken image and carries on with the healthy reference
    before = len(harness.upstream.received)
    second = await harness.client.post("/v1/chat/completions", json=chat_body(healthy),
                                       headers={"X-Session-Id": "inl"})
    assert second.status == 200
    [sent] = harness.upstream.received[before:]
    assert images_sent(sent.json()) == [healthy], "the healthy image is a placeholder for the rest of the session"
    assert quarantined(await harness.events("inl")) == []


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_an_image_accepted_through_another_replica_is_never_quarantined(make_harness: Any,
                                                                               make_config: Any) -> None:
    a = await make_harness(make_config(**RECORDING))
    b = await make_harness(make_config(**RECORDING))  # a second replica: same store, log and settings
    good = await a.admit(color=11)
    bad = await a.admit(color=12)
    assert (await b.chat("rep", good)).status == 200  # accepted, through replica b (its records still queued)
    a.upstream.refused[bad] = False
    resp = await a.chat("rep", good, bad)
    assert resp.status == 200
    assert quarantined(await a.events("rep")) == [bad]
