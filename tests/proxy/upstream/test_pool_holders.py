"""The per-origin connection limit (``max_connections``) and what could hold its places (found by
a red team).

A client that asks for a streamed answer and then stops reading (without closing its socket)
would keep its upstream connection, and so one of the origin's places, for as long as it liked:
the relay waited on ``response.write`` with no deadline, and the upstream leg's ``read_timeout``
does not count a consumer that lags. Now a chunk left unread for ``[server] write_timeout`` cuts
the client off and frees the connection. And a waiter for a place is served first come first
served on the built-in client: a freed connection is handed to it, so a steady sender that comes
later cannot starve it (aiohttp's connector, the reference transport, makes no such promise)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from yarl import URL

from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import Harness
from tests.proxy.upstream.test_client import Conn, MakeServer, RawServer, serve  # noqa: F401 (a fixture)

MakeHarness = Callable[..., Awaitable[Harness]]
EVENT = b"data: " + b"x" * 1000 + b"\n\n"
#: A long streamed answer (a big completion, a file's content), yet one the upstream sends whole
#: into the buffers between it and the stalled client: the upstream is done, and nothing ends the call.
STREAM_BYTES = int(__import__("os").environ.get("RT_STREAM_MIB", "4")) * 1024 * 1024
FINISHED: list[int] = []


async def streams(conn: Conn) -> None:
    while await conn.request():
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(STREAM_BYTES // len(EVENT)):
            conn.writer.write(b"%x\r\n" % len(EVENT) + EVENT + b"\r\n")
            await conn.writer.drain()
        await conn.send(b"0\r\n\r\n")
        FINISHED.append(conn.index)


async def a_client_that_stops_reading(host: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"write a novel"}]}'
    await asyncio.get_running_loop().sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                                  b"Content-Type: application/json\r\nContent-Length: "
                                                  + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock  # and never reads


@pytest.mark.parametrize("transport", ["builtin", "aiohttp"])
async def test_a_client_that_stops_reading_does_not_hold_an_upstream_place_forever(
        make_harness: MakeHarness, make_config: Callable[..., Any], serve: MakeServer,  # noqa: F811
        transport: str) -> None:
    raw: RawServer = await serve(streams)
    config = make_config(**{"upstreams.openai": {
        "format": "openai", "url": str(raw.url), "transport": transport, "max_connections": 2,
        "connect_timeout": 1.0, "read_timeout": 1.0}}, **{"server.write_timeout": 1.0})
    harness = await make_harness(config)
    server = harness.client.proxy.server
    stalled = [await a_client_that_stops_reading(server.host, server.port) for _ in range(2)]
    try:
        FINISHED.clear()
        await asyncio.sleep(1.0 * 4)  # four read timeouts: any deadline on the leg has passed
        assert len(FINISHED) == 2  # the upstream sent both answers whole: it holds nothing
        resp = await harness.client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert resp.status == 200, f"another client got {resp.status}: {(await resp.text())[:200]}"
        resp.close()
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.parametrize("kind", ["builtin"])
async def test_a_waiter_for_a_place_is_served_first_come_first_served(serve: MakeServer, kind: str) -> None:  # noqa: F811
    """``client.py``: "a call that finds them all in use waits, first come first served". A call
    that releases its connection and at once sends again (the relay's re-send after a refusal,
    replay, any client loop on one task) takes the connection back before the woken waiter
    runs; the waiter goes to the back of the queue, and a steady sender starves it into a
    ``PoolTimeout`` although the connection was free hundreds of times meanwhile."""
    from multidict import CIMultiDict

    from projectionist.proxy.upstream.target import open_transport

    async def quick(conn: Conn) -> None:
        while await conn.request():
            await asyncio.sleep(0.005)
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    raw: RawServer = await serve(quick)
    transport = open_transport(kind, 1.0, 5.0, 1)  # type: ignore[arg-type]
    stop = asyncio.Event()
    served = [0]

    async def steady() -> None:
        while not stop.is_set():
            answer = await transport.send("GET", raw.url / "steady", headers=CIMultiDict())
            await answer.read()
            served[0] += 1
    sender = asyncio.create_task(steady())
    try:
        await asyncio.sleep(0.05)
        answer = await transport.send("GET", raw.url / "waiter", headers=CIMultiDict())
        assert await answer.read() == b"ok"
    finally:
        stop.set()
        await asyncio.gather(sender, return_exceptions=True)
        await transport.aclose()
