"""Bounded upstream calls, odd bodies, a log that fails mid-rejection, concurrent refusals across
sessions: what the refusal path must keep."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from projectionist.policy.errors import Unavailable
from projectionist.proxy.inbound.services import SERVICES
from tests.system.refusals.hostile import chat_body
from tests.refusing import OPENAI_MESSAGE

RECORDING = {"record.mode": "metadata"}
REFUSAL = {"error": {"message": OPENAI_MESSAGE, "type": "invalid_request_error", "param": None,
                     "code": "invalid_image_format"}}


async def refuse_all(request: web.Request, doc: Any) -> web.StreamResponse:
    return web.json_response(REFUSAL, status=400)


async def test_an_upstream_that_refuses_everything_gets_at_most_two_calls_per_request(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    images = [await harness.admit(color=c) for c in range(3)]
    harness.upstream.script = refuse_all
    for i in range(4):
        before = harness.upstream.calls
        resp = await harness.chat("all", *images[: i % 3 + 1])
        assert resp.status in (400, 200)
        assert 1 <= harness.upstream.calls - before <= 2


@pytest.mark.parametrize("body,ctype", [
    (b"x" * (300 * 1024), "text/plain"),                # past SCREEN_MAX: streamed as it came
    (b"<html>Could not process image</html>", "text/html"),
    (b"\xff\xfe\x00garbage", "application/json"),
])
async def test_odd_400_bodies_go_back_unchanged_or_handled(make_harness: Any, body: bytes, ctype: str) -> None:
    harness = await make_harness(**RECORDING)
    image = await harness.admit(color=7)

    async def odd(request: web.Request, doc: Any) -> web.StreamResponse:
        return web.Response(body=body, status=400, content_type=ctype)

    harness.upstream.script = odd
    resp = await harness.client.post("/v1/chat/completions", json=chat_body(image), headers={"X-Session-Id": "odd"})
    assert resp.status == 400 and await resp.read() == body


async def test_a_log_that_fails_during_attribution_gives_the_providers_error(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    image = await harness.admit(color=8)
    harness.upstream.refused[image] = False
    services = harness.app[SERVICES]

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise Unavailable("down", code="LOG_UNAVAILABLE")

    services.log.read = down
    resp = await harness.chat("down", image)
    assert resp.status == 400 and "unsupported image" in await resp.text()


async def test_concurrent_refusals_across_sessions_each_record_one_quarantine(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    bad = await harness.admit(color=9)
    harness.upstream.refused[bad] = False
    results = await asyncio.gather(*(harness.chat(f"c{i % 5}", bad) for i in range(40)))
    assert {r.status for r in results} == {200}
    for i in range(5):
        events = await harness.events(f"c{i}")
        assert len([e for e in events if e["type"] == "attachment/rejected"]) == 1
