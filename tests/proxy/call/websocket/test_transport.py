"""A WebSocket's upstream leg is the upstream's ``Transport``'s to open, as its HTTP calls are: a
transport a test puts in the app's place sees the relay's socket and replay's open (and can refuse
them, so nothing reaches the upstream), and both transports open one on a connector they close
with themselves."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import msgspec
import pytest
from aiohttp import WSMsgType
from multidict import CIMultiDict
from yarl import URL

from projectionist.proxy.call.replay import rebuild, send
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.upstream.target import open_transport
from projectionist.proxy.upstream.transport import Answer, Body, Kind, Refused, Transport, UpstreamSocket
from tests.conftest import Harness
from tests.proxy.call.websocket.fake import FakeSocket
from tests.proxy.call.websocket.test_relay import create, events

MakeWs = Callable[..., Awaitable[Harness]]
HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
             "Sec-WebSocket-Key": base64.b64encode(b"k" * 16).decode()}


@dataclass
class Watching:
    """A ``Transport`` that hands everything to ``inner`` and notes each WebSocket asked of it (its
    URL and handshake timeout); with ``refusing``, it refuses them with that status instead."""

    inner: Transport
    refusing: int | None = None
    sockets: list[tuple[str, float]] = field(default_factory=list)

    async def send(self, method: str, url: URL, *, headers: CIMultiDict[str], body: Body = None) -> Answer:
        return await self.inner.send(method, url, headers=headers, body=body)

    def websocket(self, url: URL, headers: CIMultiDict[str], protocols: Sequence[str], *, handshake_timeout: float,
                  max_message: int, heartbeat: float | None = None) -> AbstractAsyncContextManager[UpstreamSocket]:
        self.sockets.append((str(url), handshake_timeout))
        if self.refusing is not None:
            raise Refused(self.refusing)
        return self.inner.websocket(url, headers, protocols, handshake_timeout=handshake_timeout,
                                    max_message=max_message, heartbeat=heartbeat)

    async def aclose(self) -> None:
        await self.inner.aclose()


def watch(harness: Harness, refusing: int | None = None) -> Watching:
    """The ``openai`` upstream's transport, watched (the app's own goes on underneath)."""
    upstream = harness.app[SERVICES].upstreams["openai"]
    assert upstream.client is not None
    upstream.client = watching = Watching(upstream.client, refusing)
    return watching


async def test_the_relay_opens_its_upstream_leg_through_the_upstream_s_transport(make_ws: MakeWs,
                                                                                 fake: FakeSocket) -> None:
    harness = await make_ws(openai={"connect_timeout": 3.5})
    watching = watch(harness)
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create()).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    assert watching.sockets == [(f"{fake.url}/v1/responses", 3.5)]  # the 101 within the connect timeout
    assert len(fake.handshakes) == 1


async def test_a_transport_refusing_the_socket_is_upgrade_refused_and_the_upstream_sees_nothing(
        make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    watching = watch(harness, refusing=403)
    resp = await harness.client.get("/v1/responses", headers=HANDSHAKE)
    assert resp.status == 403 and (await resp.json())["error"]["code"] == "UPGRADE_REFUSED"
    assert len(watching.sockets) == 1 and fake.handshakes == []


async def test_replay_sends_a_websocket_call_through_the_transport_it_is_given(make_ws: MakeWs,
                                                                              fake: FakeSocket) -> None:
    harness = await make_ws(openai={"read_timeout": 7.0}, **{"record.mode": "full"})
    async with harness.client.ws_connect("/v1/responses", headers={"X-Session-Id": "ws-t"}) as ws:
        await ws.send_str(msgspec.json.encode(create()).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    services = harness.app[SERVICES]
    await services.recording.drain()
    watching = watch(harness)
    status, content_type, _ = await send(await rebuild(services.log, services.store, "ws-t"), services.config,
                                         transport=watching)
    assert (status, content_type) == (200, "text/event-stream")
    assert watching.sockets == [(f"{fake.url}/v1/responses", 7.0)]  # replay's events may take read_timeout
    assert len(fake.messages) == 2 and fake.messages[0] == fake.messages[1]


@pytest.mark.parametrize("kind", ["builtin", "aiohttp"])
async def test_both_transports_open_a_websocket_and_close_it_with_themselves(kind: Kind, fake: FakeSocket) -> None:
    transport = open_transport(kind, 2.0, 2.0)
    try:
        async with transport.websocket(URL(fake.url) / "v1" / "realtime", CIMultiDict({"X-Probe": "1"}), (),
                                       handshake_timeout=2.0, max_message=1024) as leg:
            await leg.send_frame(b"ping", WSMsgType.TEXT)
            echoed = await leg.receive(timeout=5)
            assert (echoed.type, echoed.data) == (WSMsgType.TEXT, b"ping")  # text as bytes, never decoded
            assert fake.handshakes[-1].headers["X-Probe"] == "1"
            await transport.aclose()  # the transport's sockets close with it
            assert (await leg.receive(timeout=5)).type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR)
    finally:
        await transport.aclose()

