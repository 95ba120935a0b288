"""One socket may not hold an unbounded number of open calls (red team). Each open lane keeps its
Turn (its prepared message, up to websocket_max_message bytes, kept for a re-send) until its
upstream ends it, so a client that opened lane after lane on an upstream still busy with the
first made the proxy hold N x 64 MiB; past ``MAX_OPEN`` a ``response.create`` is an error event
(``TOO_MANY_IN_FLIGHT``) and goes no further."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import WSMsgType, web

from tests.conftest import Harness
from tests.proxy.call.websocket.fake import FakeSocket
from tests.proxy.call.websocket.test_relay import create

MakeWs = Callable[..., Awaitable[Harness]]
LANES = 2000
#: What the test allows a socket to keep open at once (the fix picks its own bound, well under this).
OPEN_MAX = 256


async def test_one_socket_holds_a_bounded_number_of_open_calls(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()

    async def busy(ws: web.WebSocketResponse, data: bytes) -> bool:
        return True  # still working on it: answers nothing yet

    fake.script = busy
    async with harness.client.ws_connect("/v1/responses") as ws:
        for n in range(LANES):
            await ws.send_str(msgspec.json.encode(create(stream_id=f"lane-{n}")).decode())
        refused = 0
        while refused < LANES - OPEN_MAX:
            msg = await ws.receive(timeout=10)
            assert msg.type is WSMsgType.TEXT, msg
            event = msgspec.json.decode(msg.data)
            assert event["type"] == "error", event
            assert event["error"]["code"] == "TOO_MANY_IN_FLIGHT" and event["status"] == 429, event
            refused += 1
    assert len(fake.messages) <= OPEN_MAX
