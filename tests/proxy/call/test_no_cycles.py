"""A proxied call, with a session and recording or without, leaves no cyclic garbage: at
thousands of calls a second, anything a call ties into a cycle is the collector's work (it was 5%
of the CPU once, from one cycle per call)."""

from __future__ import annotations

import gc
from collections import Counter

from projectionist.proxy.inbound.services import SERVICES
from tests.calls import chat_body
from tests.conftest import Harness
from tests.imaging import make_image


async def test_calls_leave_nothing_for_the_cyclic_collector(make_harness: object) -> None:
    harness: Harness = await make_harness(**{"record.mode": "metadata"})  # type: ignore[operator]
    image = await harness.admit(make_image(color=77))
    for session in ("warm", None):  # the first calls make the process's lasting objects
        headers = {"Content-Type": "application/json", **({"X-Session-Id": session} if session else {})}
        assert (await harness.client.post("/v1/chat/completions", data=chat_body(image), headers=headers)).status == 200
    await harness.app[SERVICES].recording.drain()
    gc.collect()
    gc.disable()
    try:
        for session in ("cycles", None, "cycles", None, "cycles"):
            headers = {"Content-Type": "application/json", **({"X-Session-Id": session} if session else {})}
            resp = await harness.client.post("/v1/chat/completions", data=chat_body(image), headers=headers)
            assert resp.status == 200
            await resp.read()
        await harness.app[SERVICES].recording.drain()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = Counter(type(o).__module__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert {module: n for module, n in left.items() if module.startswith("projectionist")} == {}
