"""The same wire tests against both transports, the built-in client and the aiohttp reference:
what each puts on the wire (byte for byte the same request), how each reads sized, chunked and
close-delimited answers, what each refuses to do (follow a redirect, inflate a body, add headers
of its own), its errors (all the transport's own, translated by the one ``client_error``), and the
per-origin connection limit. Servers are raw asyncio servers on loopback (``test_client``'s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from multidict import CIMultiDict
from yarl import URL

from projectionist.proxy.call.relay import client_error
from projectionist.proxy.upstream.client import Client
from projectionist.proxy.upstream.target import open_transport
from projectionist.proxy.upstream.transport import ClientError, ConnectError, Kind, Transport
from tests.proxy.upstream.test_client import Conn, MakeServer, answering, serve  # noqa: F401 (a fixture)

KINDS: tuple[Kind, ...] = ("builtin", "aiohttp")
MakeTransport = Callable[..., Transport]


@pytest.fixture(params=KINDS)
async def make(request: pytest.FixtureRequest) -> AsyncIterator[MakeTransport]:
    opened: list[Transport] = []

    def open_one(connect_timeout: float = 2.0, read_timeout: float = 2.0, max_connections: int = 100) -> Transport:
        transport = open_transport(request.param, connect_timeout, read_timeout, max_connections)
        opened.append(transport)
        return transport
    yield open_one
    for transport in opened:
        await transport.aclose()


async def test_the_request_on_the_wire_is_the_same_from_both(serve: MakeServer, make: MakeTransport) -> None:
    async def answer_each(conn: Conn) -> None:
        while request := await conn.request():
            body = b"" if request.startswith(b"HEAD ") else b"ok"  # an answer to HEAD has no body
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n" + body)
    server = await serve(answer_each)
    transport = make()
    headers = CIMultiDict([("Authorization", "Bearer k"), ("X-Two", "a"), ("X-Two", "b"), ("Content-Type", "application/json")])
    answer = await transport.send("POST", server.url / "v1" % {"q": "1"}, headers=headers, body=b"{}")
    assert await answer.read() == b"ok"
    for method in ("GET", "POST", "HEAD"):
        answer = await transport.send(method, server.url / "p", headers=CIMultiDict())
        await answer.read()
        answer.release()
    port = server.url.port
    assert [request for _, request in server.requests] == [
        f"POST /v1?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer k\r\nX-Two: a\r\nX-Two: b\r\n"
        f"Content-Type: application/json\r\nAccept: */*\r\nContent-Length: 2\r\n\r\n{{}}".encode(),
        f"GET /p HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: */*\r\n\r\n".encode(),
        f"POST /p HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: */*\r\nContent-Length: 0\r\n\r\n".encode(),
        f"HEAD /p HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: */*\r\n\r\n".encode(),
    ]
    assert server.connections == 1  # kept alive between them


async def test_a_streamed_body_goes_chunked(serve: MakeServer, make: MakeTransport) -> None:
    server = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))

    async def body() -> AsyncIterator[bytes]:
        for part in (b"hel", b"lo"):
            yield part
    answer = await make().send("POST", server.url / "s", headers=CIMultiDict(), body=body())
    assert await answer.read() == b"ok"
    [(_, request)] = server.requests
    assert b"Transfer-Encoding: chunked\r\n" in request and request.endswith(b"3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n")


@pytest.mark.parametrize("answer_bytes", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello",
], ids=["sized", "chunked", "close-delimited"])
async def test_answers_are_read_in_every_framing(serve: MakeServer, make: MakeTransport, answer_bytes: bytes) -> None:
    async def once(conn: Conn) -> None:
        await conn.request()
        await conn.send(answer_bytes)
    server = await serve(once)
    answer = await make().send("GET", server.url / "a", headers=CIMultiDict())
    chunks = [chunk async for chunk in answer.iter_any()]
    assert b"".join(chunks) == b"hello"
    answer.release()


async def test_headers_come_as_sent_and_nothing_is_inflated_or_followed(serve: MakeServer, make: MakeTransport) -> None:
    server = await serve(answering(
        b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/elsewhere\r\nX-Trace: a\r\nx-trace: b\r\n"
        b"Content-Type: Application/JSON; charset=utf-8\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\n\x1f\x8bzz"))
    answer = await make().send("GET", server.url / "r", headers=CIMultiDict())
    assert (answer.status, answer.reason, answer.content_length) == (302, "Found", 4)
    assert answer.headers.getall("X-TRACE") == ["a", "b"] and ("x-trace", "b") in list(answer.headers.items())
    assert answer.content_type == "application/json"
    assert await answer.read() == b"\x1f\x8bzz"  # never inflated
    assert len(server.requests) == 1  # the redirect went back as it came


async def test_errors_are_the_transports_own(serve: MakeServer, make: MakeTransport) -> None:
    async def stall(conn: Conn) -> None:
        request = await conn.request()
        if b"/cut" in request:
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            return  # closes: the body broke off
        await asyncio.sleep(5)
    server = await serve(stall)
    transport = make(read_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as timeout:
        await transport.send("GET", server.url / "stall", headers=CIMultiDict())
    assert 0.25 < time.monotonic() - started < 2
    assert client_error(timeout.value).code == "UPSTREAM_TIMEOUT"  # type: ignore[union-attr]
    answer = await transport.send("GET", server.url / "cut", headers=CIMultiDict())
    with pytest.raises(ClientError) as cut:
        await answer.read()
    answer.release()
    assert client_error(cut.value).code == "UPSTREAM_UNAVAILABLE"  # type: ignore[union-attr]
    with pytest.raises(ConnectError) as refused:
        await transport.send("GET", URL("http://127.0.0.1:9/"), headers=CIMultiDict())
    assert client_error(refused.value).code == "UPSTREAM_UNAVAILABLE"  # type: ignore[union-attr]


async def test_connections_to_one_origin_are_bounded(serve: MakeServer, make: MakeTransport) -> None:
    """Five calls at once through a limit of two: never more than two connections, every call
    answered (each waits for one to be free); a call that finds both busy for longer than the
    connect timeout fails with a timeout, and the limit is per origin."""
    gate = asyncio.Event()
    live = [0, 0]  # now, most

    async def held(conn: Conn) -> None:
        live[0] += 1
        live[1] = max(live)
        try:
            while await conn.request():
                await gate.wait()
                await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        finally:
            live[0] -= 1
    server = await serve(held)
    other = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    transport = make(connect_timeout=5.0, max_connections=2)

    async def call(url: URL) -> bytes:
        answer = await transport.send("GET", url, headers=CIMultiDict())
        return await answer.read()
    calls = [asyncio.create_task(call(server.url / str(i))) for i in range(5)]
    await asyncio.sleep(0.3)
    assert live[1] == 2 and server.connections == 2
    assert await asyncio.wait_for(call(other.url / "free"), 2) == b"ok"  # another origin has its own
    gate.set()
    assert await asyncio.wait_for(asyncio.gather(*calls), 5) == [b"ok"] * 5
    assert server.connections == 2 and live[1] == 2

    gate.clear()
    short = make(connect_timeout=0.3, max_connections=1)
    first = asyncio.create_task(short.send("GET", server.url / "held", headers=CIMultiDict()))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as waited:
        await short.send("GET", server.url / "waits", headers=CIMultiDict())
    assert time.monotonic() - started < 2
    # the built-in pool knows the call waited for a place: 503 UPSTREAM_BUSY (Retry-After); aiohttp's
    # connector reports its wait as a connect timeout
    expected = "UPSTREAM_BUSY" if isinstance(short, Client) else "UPSTREAM_TIMEOUT"
    assert client_error(waited.value).code == expected  # type: ignore[union-attr]
    gate.set()
    answer = await first
    assert await answer.read() == b"ok"


async def test_a_cancelled_call_gives_its_connection_place_back(serve: MakeServer, make: MakeTransport) -> None:
    async def slow(conn: Conn) -> None:
        while request := await conn.request():
            if b"/slow" in request:
                await asyncio.sleep(5)
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    server = await serve(slow)
    transport = make(max_connections=1)
    task = asyncio.create_task(transport.send("GET", server.url / "slow", headers=CIMultiDict()))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    answer = await asyncio.wait_for(transport.send("GET", server.url / "next", headers=CIMultiDict()), 2)
    assert await answer.read() == b"ok"


async def test_a_black_holed_first_address_still_connects_by_the_next(serve: MakeServer, make: MakeTransport,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Happy Eyeballs (RFC 8305): a host whose first address swallows the SYN (a listener with a
    full accept queue, as a black-holed route behaves) connects by its second within a fraction of
    a second, not after the connect timeout."""
    import socket

    server = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    hole = socket.socket()
    hole.bind(("127.0.0.2", 0))
    hole.listen(0)
    fillers = []
    for _ in range(3):  # fill its accept queue: further SYNs are dropped, a connect there hangs
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(hole.getsockname())
        except BlockingIOError:
            pass
        fillers.append(filler)
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo
    port, hole_port = server.url.port, hole.getsockname()[1]

    async def hole_first(host: object, *args: object, **kwargs: object) -> list[object]:
        if host != "dual.test":
            return await real(host, *args, **kwargs)  # type: ignore[arg-type]
        stream = socket.SOCK_STREAM
        return [(socket.AF_INET, stream, 6, "", ("127.0.0.2", hole_port)), (socket.AF_INET, stream, 6, "", ("127.0.0.1", port))]
    monkeypatch.setattr(loop, "getaddrinfo", hole_first)
    try:
        transport = make(connect_timeout=5.0)
        started = time.monotonic()
        answer = await transport.send("GET", URL(f"http://dual.test:{port}/x"), headers=CIMultiDict())
        assert await answer.read() == b"ok"
        assert time.monotonic() - started < 2.0
    finally:
        for sock in (*fillers, hole):
            sock.close()


@pytest.mark.parametrize("kind", KINDS)
def test_both_transports_connect_on_uvloop_the_default_loop(kind: Kind) -> None:
    """``[server] event_loop = "auto"`` is uvloop, whose ``create_connection`` takes fewer keywords
    than asyncio's (no ``happy_eyeballs_delay``): a call through each transport on it, as served."""
    import uvloop

    from tests.proxy.upstream.test_client import RawServer

    async def main() -> bytes:
        server = await RawServer(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")).start()
        transport = open_transport(kind, 2.0, 2.0)
        try:
            answer = await transport.send("GET", server.url / "u", headers=CIMultiDict())
            return await answer.read()
        finally:
            await transport.aclose()
            await server.stop()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == b"ok"
