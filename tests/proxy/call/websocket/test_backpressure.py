"""Back-pressure both ways: a side that stops reading holds the other side's sends back through the
proxy, which never buffers more than a frame or two and the sockets' own buffers for it; once the
slow side reads again, every frame arrives, whole and in order. On both routes (Realtime, relayed
unchanged, and the Responses WebSocket, projected)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from tests.conftest import Harness

MakeWs = Callable[..., Awaitable[Harness]]
MiB = 1024 * 1024
FRAMES = 128  # of 1 MiB: 128 MiB that a proxy buffering for the slow side would have taken in
#: What may be in flight between the two ends without the proxy buffering for anyone: the kernel's
#: socket buffers on both legs (a few MB each on loopback) and a frame or two in each aiohttp queue.
IN_FLIGHT_MAX = 48 * MiB


def frame(n: int) -> bytes:
    return n.to_bytes(4, "big") + bytes(MiB - 4)


async def stalled(progress: Callable[[], int], done: asyncio.Event) -> int:
    """The progress once it stopped growing (five looks 0.1 s apart see the same), or once ``done``.
    Nothing signals that a sender is blocked, so this one wait looks rather than awaits."""
    last, still = -1, 0
    for _ in range(300):
        if done.is_set():
            return progress()
        now = progress()
        still = still + 1 if now == last else 0
        if still >= 5:
            return now
        last = now
        await asyncio.sleep(0.1)
    raise AssertionError("the sender neither finished nor stopped")


class Flood:
    """An upstream that sends ``FRAMES`` binary frames at once, or reads nothing until ``release``."""

    def __init__(self) -> None:
        #: ``send`` floods the client; ``sink`` reads nothing until ``release``.
        self.mode = "send"
        self.sent = 0
        self.done = asyncio.Event()
        self.release = asyncio.Event()
        self.cut = asyncio.Event()
        self.received: list[bytes] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/realtime", self.open)
        app.router.add_get("/v1/responses", self.open)
        return app

    async def open(self, request: web.Request) -> web.StreamResponse:
        return await (self.send(request) if self.mode == "send" else self.sink(request))

    async def send(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        try:
            for n in range(FRAMES):
                await ws.send_bytes(frame(n))
                self.sent += 1
        except ConnectionError:
            self.cut.set()  # the proxy closed this leg
        self.done.set()
        await ws.receive()
        if ws.close_code is not None:
            self.cut.set()
        return ws

    async def sink(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=2 * MiB)
        await ws.prepare(request)
        await self.release.wait()
        async for msg in ws:
            if msg.type in (WSMsgType.BINARY, WSMsgType.TEXT):
                self.received.append(msg.data[:4] if isinstance(msg.data, bytes) else msg.data[:25].encode())
                if len(self.received) == FRAMES:
                    self.done.set()
        return ws


@pytest.fixture
async def flood(aiohttp_server: Any) -> tuple[Flood, str]:
    upstream = Flood()
    server = await aiohttp_server(upstream.app())
    return upstream, str(server.make_url("")).rstrip("/")


@pytest.mark.parametrize("path", ["/v1/realtime", "/v1/responses"])
async def test_a_client_that_stops_reading_holds_the_upstream_back(make_ws: MakeWs, flood: tuple[Flood, str],
                                                                  path: str) -> None:
    upstream, url = flood
    harness = await make_ws(openai={"url": url})
    async with harness.client.ws_connect(path, max_msg_size=2 * MiB) as ws:
        sent = await stalled(lambda: upstream.sent * MiB, upstream.done)
        assert not upstream.done.is_set() and sent <= IN_FLIGHT_MAX, sent
        for n in range(FRAMES):  # the client reads again: everything comes, in order
            msg = await ws.receive(timeout=30)
            assert msg.type is WSMsgType.BINARY and msg.data == frame(n)
    assert upstream.done.is_set()


async def test_a_client_that_takes_nothing_for_write_timeout_is_cut_off(make_ws: MakeWs,
                                                                        flood: tuple[Flood, str]) -> None:
    upstream, url = flood
    harness = await make_ws(openai={"url": url}, **{"server.write_timeout": 0.5})
    async with harness.client.ws_connect("/v1/realtime", max_msg_size=2 * MiB) as ws:
        await asyncio.wait_for(upstream.cut.wait(), 30)  # the proxy gave up on the client and the upstream
        while (msg := await ws.receive(timeout=30)).type is WSMsgType.BINARY:
            pass  # what the client had taken in before it was cut off
        assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR)


def steer(n: int) -> str:
    """A client event the proxy passes on as it came, 1 MiB of it."""
    return '{"type":"x","n":"' + f"{n:08d}" + '","input":"' + "x" * (MiB - 42) + '"}'


@pytest.mark.parametrize("path", ["/v1/realtime", "/v1/responses"])
async def test_an_upstream_that_stops_reading_holds_the_client_back(make_ws: MakeWs, flood: tuple[Flood, str],
                                                                    path: str) -> None:
    upstream, url = flood
    upstream.mode = "sink"
    harness = await make_ws(openai={"url": url})
    sent = 0
    finished = asyncio.Event()
    async with harness.client.ws_connect(path) as ws:

        async def send_all() -> None:
            nonlocal sent
            for n in range(FRAMES):
                await (ws.send_bytes(frame(n)) if path == "/v1/realtime" else ws.send_str(steer(n)))
                sent += 1
            finished.set()

        sender = asyncio.ensure_future(send_all())
        try:
            held = await stalled(lambda: sent * MiB, finished)
            assert not finished.is_set() and held <= IN_FLIGHT_MAX, held
            upstream.release.set()
            await asyncio.wait_for(upstream.done.wait(), 60)
        finally:
            sender.cancel()
    expected = [n.to_bytes(4, "big") if path == "/v1/realtime" else steer(n)[:25].encode() for n in range(FRAMES)]
    assert upstream.received == expected
