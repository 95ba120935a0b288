"""The adapters' rejection patterns run in linear time on at most the first 4 KB of a message: a
400 whose message repeats ``image.source.base64`` without spaces (up to the 256 KiB the screen
reads) does not keep the event loop busy."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from projectionist.adapters import anthropic_messages
from tests.system.refusals.hostile import StallMeter, anthropic_body

HOSTILE_MESSAGE = "image.source.base64" * 13_000  # 247,000 characters, under SCREEN_MAX


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

    harness.upstream.script = refuse
    async with StallMeter(0.01) as meter:
        resp = await harness.client.post("/v1/messages", json=anthropic_body(image), headers={"X-Session-Id": "re"})
        assert resp.status == 400
    assert meter.longest < 0.5, f"the event loop stalled {meter.longest:.1f} s on one upstream error"
