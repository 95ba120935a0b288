"""WebSocket messages count against the proxy's memory budget (issue 37, item 2): the red team held
1.1 GB with four sockets of open calls. A ``response.create`` is held until its call ends; one past
the budget is an ``error`` event ``MEMORY_BUSY`` on its lane; a Realtime message past it closes
that socket with 1013 (try again later); every byte comes back when the calls and sockets end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import WSMsgType, web

from projectionist.proxy.inbound.budget import Budget
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import Harness
from tests.proxy.call.websocket.fake import FakeSocket
from tests.proxy.call.websocket.test_relay import create

MakeWs = Callable[..., Awaitable[Harness]]
KiB = 1024
SMALL = {"server.memory_budget": 2 * 1024 * KiB, "server.client_max_size": 1024 * KiB,
         "server.websocket_max_message": 1024 * KiB}


def budget_of(harness: Harness) -> Budget:
    return harness.app[SERVICES].budget


async def settled(budget: Budget, held: int) -> None:
    for _ in range(500):
        if budget.held == held:
            return
        await asyncio.sleep(0.01)
    assert budget.held == held


async def test_open_calls_hold_their_messages_and_one_past_the_budget_is_an_error_event(
        make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**SMALL)
    budget = budget_of(harness)

    async def busy(ws: web.WebSocketResponse, data: bytes) -> bool:
        return True  # still working on it: answers nothing yet

    fake.script = busy
    text = "x" * (300 * KiB)
    async with harness.client.ws_connect("/v1/responses") as ws:
        refused: list[dict[str, object]] = []
        for n in range(10):  # 3 MB of calls, each kept open: more than the 2 MiB budget
            await ws.send_str(msgspec.json.encode(create({"type": "input_text", "text": text},
                                                         stream_id=f"lane-{n}")).decode())
            try:
                msg = await ws.receive(timeout=0.3)
            except TimeoutError:
                continue  # no answer: it went upstream and is open
            assert msg.type is WSMsgType.TEXT, msg
            refused.append(msgspec.json.decode(msg.data))
            assert budget.held <= budget.limit
        sent = len(fake.messages)
        assert 0 < sent < 10 and len(refused) == 10 - sent
        for event in refused:
            assert event["type"] == "error" and event["status"] == 503, event
            assert event["error"]["code"] == "MEMORY_BUSY", event  # type: ignore[index]
        assert {e["stream_id"] for e in refused} == {f"lane-{n}" for n in range(sent, 10)}
        assert budget.held >= sent * 300 * KiB and budget.refused["message"] == len(refused)
    await settled(budget, 0)  # the socket closed: its open calls ended, their bytes came back


async def test_a_realtime_message_past_the_budget_closes_the_socket_with_try_again_later(
        make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**SMALL)
    budget = budget_of(harness)
    async with harness.client.ws_connect("/v1/realtime") as ws:
        await ws.send_str('{"type":"session.update"}')
        assert (await ws.receive(timeout=5)).data == '{"type":"session.update"}'  # relayed, then given back
        assert budget.held == 0
        others = budget.take(budget.limit - 100 * KiB, "body")  # what other calls hold meanwhile
        try:
            await ws.send_str('{"type":"input_audio_buffer.append","audio":"' + "A" * (200 * KiB) + '"}')
            msg = await ws.receive(timeout=5)
        finally:
            others.release()
    assert msg.type is WSMsgType.CLOSE and msg.data == 1013, msg
    assert len(fake.messages) == 1 and budget.refused["message"] == 1
    await settled(budget, 0)
