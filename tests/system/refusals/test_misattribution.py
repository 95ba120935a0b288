"""Attribution never quarantines images the upstream accepted: an unnamed refusal is put down to
the images of the call (references and the client's own inlined images alike) that the
upstream's format never accepted in the session; an image accepted earlier, by another replica
just before, or by a call still streaming its success, counts as accepted."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import BACKENDS
from tests.imaging import make_image, ref_id
from tests.refusing import inlined
from tests.system.refusals.hostile import chat_body

RECORDING = {"record.mode": "metadata"}


def quarantined(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["attachment_id"] for e in events if e["type"] == "attachment/rejected"]


def images_sent(body: dict[str, Any]) -> list[str]:
    return [ref_id(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))
            for m in body["messages"] for p in m["content"] if p.get("type") == "image_url"]


async def test_a_refused_client_inlined_image_never_quarantines_a_reference_accepted_before(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    healthy = await harness.admit(color=1)
    assert (await harness.client.post("/v1/chat/completions", json=chat_body(healthy),
                                      headers={"X-Session-Id": "inl"})).status == 200  # accepted once
    broken = make_image(color=2)  # the client inlines these bytes itself; the upstream refuses them
    harness.upstream.refused[ref_id(broken)] = False
    data_url = "data:image/png;base64," + base64.b64encode(broken).decode()

    before = len(harness.upstream.received)
    first = await harness.client.post("/v1/chat/completions", json=chat_body(healthy, inline=[data_url]),
                                      headers={"X-Session-Id": "inl"})
    assert first.status == 200, await first.text()
    refused, resent = harness.upstream.received[before:]
    assert images_sent(refused.json()) == [healthy, ref_id(broken)]
    assert images_sent(resent.json()) == [healthy], "the healthy image stays; the client's own is a placeholder"
    assert quarantined(await harness.events("inl")) == [ref_id(broken)]


async def test_an_unnamed_refusal_of_two_new_images_quarantines_both_the_reference_and_the_clients(
        make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    new_ref = await harness.admit(color=3)
    broken = make_image(color=4)
    harness.upstream.refused[ref_id(broken)] = False
    data_url = "data:image/png;base64," + base64.b64encode(broken).decode()
    resp = await harness.client.post("/v1/chat/completions", json=chat_body(new_ref, inline=[data_url]),
                                     headers={"X-Session-Id": "two"})
    assert resp.status == 200
    assert sorted(quarantined(await harness.events("two"))) == sorted([new_ref, ref_id(broken)])


async def test_an_image_a_call_in_flight_is_accepting_is_never_quarantined(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    good = make_image(color=5)
    bad = make_image(color=6)
    url_of = {i: "data:image/png;base64," + base64.b64encode(i).decode() for i in (good, bad)}
    streaming = asyncio.Event()
    finish = asyncio.Event()

    async def slow(request: web.Request, body: Any) -> web.StreamResponse | None:
        if body is None or ref_id(bad) in {aid for _, aid in inlined(body)}:
            return None  # the refusal (or anything else) as the fake upstream gives it
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": []}\n\n')
        streaming.set()
        await finish.wait()  # still streaming its success while the other call is refused
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    harness.upstream.script = slow
    harness.upstream.refused[ref_id(bad)] = False
    long = asyncio.create_task(harness.client.post("/v1/chat/completions", headers={"X-Session-Id": "fly"},
                                                   json={**chat_body(inline=[url_of[good]]), "stream": True}))
    await asyncio.wait_for(streaming.wait(), 10)
    resp = await harness.client.post("/v1/chat/completions", json=chat_body(inline=[url_of[good], url_of[bad]]),
                                     headers={"X-Session-Id": "fly"})
    finish.set()
    assert resp.status == 200
    assert (await long).status == 200
    assert quarantined(await harness.events("fly")) == [ref_id(bad)]


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
