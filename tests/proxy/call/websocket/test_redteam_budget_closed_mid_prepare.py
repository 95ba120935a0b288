"""Red team: a Responses socket closed while a ``response.create`` is being prepared leaks that
message's bytes from the memory budget.

``Calls._create`` holds the message (``hold(call.ctx, ...)``) before ``prepare``; only a
``ProjectionistError``/``Exception`` from ``prepare`` releases it (``refuse``), and a Turn's end
releases it once the call is open. When the socket ends during ``prepare`` (a store read, an
image fetch...), the pump is cancelled: ``CancelledError`` is neither, no Turn exists, and the
bytes are never given back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from projectionist.proxy.call import websocket_calls
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import Harness
from tests.proxy.call.websocket.fake import FakeSocket
from tests.proxy.call.websocket.test_relay import create

MakeWs = Callable[..., Awaitable[Harness]]
KiB = 1024
SMALL = {"server.memory_budget": 2 * 1024 * KiB, "server.client_max_size": 1024 * KiB,
         "server.websocket_max_message": 1024 * KiB}


async def test_a_socket_closed_mid_prepare_gives_back_its_message(make_ws: MakeWs, fake: FakeSocket,
                                                                  monkeypatch: Any) -> None:
    harness = await make_ws(**SMALL)
    budget = harness.app[SERVICES].budget
    preparing = asyncio.Event()
    real = websocket_calls.prepare

    async def slow_prepare(*args: Any, **kwargs: Any) -> Any:
        preparing.set()
        await asyncio.sleep(3600)  # a slow store read, an image fetch...
        return await real(*args, **kwargs)

    monkeypatch.setattr(websocket_calls, "prepare", slow_prepare)
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create({"type": "input_text", "text": "x" * (300 * KiB)})).decode())
        await asyncio.wait_for(preparing.wait(), 10)
        assert budget.held >= 300 * KiB
    # the client closed the socket
    for _ in range(300):
        if budget.held == 0:
            break
        await asyncio.sleep(0.01)
    assert budget.held == 0, f"{budget.held} bytes held after the socket closed"
