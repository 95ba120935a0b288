"""The adapters' rejection patterns run in linear time on at most the first 4 KB of a message: a
400 whose message repeats ``image.source.base64`` without spaces (up to the 256 KiB the screen
reads) does not keep the event loop busy."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web

from projectionist.adapters import anthropic_messages
from tests.system.refusals.hostile import Hostile, anthropic_body, hostile_app

HOSTILE_MESSAGE = "image.source.base64" * 13_000  # 247,000 characters, under SCREEN_MAX


@pytest.fixture
async def upstream(aiohttp_server: Any) -> Hostile:
    fake = Hostile()
    server = await aiohttp_server(hostile_app(fake))
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


def test_reading_an_anthropic_error_is_linear_in_its_size() -> None:
    doc = {"type": "error", "error": {"type": "invalid_request_error", "message": HOSTILE_MESSAGE}}
    started = time.perf_counter()
    anthropic_messages.rejection(400, doc)
    assert time.perf_counter() - started < 0.5  # a guard against quadratic matching (7 s before the fix; ~10 ms now)


async def test_one_hostile_400_does_not_stall_the_event_loop(make_harness: Any) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    image = await harness.admit(color=5)

    async def refuse(request: web.Request, doc: Any) -> web.StreamResponse:
        return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                             "message": HOSTILE_MESSAGE}}, status=400)

    harness.upstream.script = refuse  # type: ignore[attr-defined]
    lag = 0.0

    async def ticker() -> None:
        nonlocal lag
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            lag = max(lag, time.perf_counter() - before - 0.01)

    tick = asyncio.create_task(ticker())
    try:
        resp = await harness.client.post("/v1/messages", json=anthropic_body(image), headers={"X-Session-Id": "re"})
        assert resp.status == 400
        await asyncio.sleep(0.05)  # the ticker notes the last stall before it stops
    finally:
        tick.cancel()
    assert lag < 0.5, f"the event loop stalled {lag:.1f} s on one upstream error"
