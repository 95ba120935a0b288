"""The upstream leg's own HTTP/1.1 client against real servers on loopback: raw asyncio servers that
answer byte-exact scripts, so framing (sized, chunked, close-delimited, HEAD, 204/304, 1xx), the pool
(reuse, LIFO, idle close, the one retry on a stale connection), timeouts, cancellation, flow control
both ways and TLS are checked on the wire, not through another client library.

Retry decision: a request with an idempotent method on a *reused* connection that the server
closes before any answer byte is sent once more on a fresh connection (never a streamed body
already begun). A POST is not: a server that read it and then closed without a byte looks the
same, and an LLM call sent twice is billed twice, so it is a 502 and the client's own retry policy
decides. On a *fresh* connection the same close is an error at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from multidict import CIMultiDict
from yarl import URL

from projectionist.proxy.upstream.client import (
    READ_BUFFER, Client, ConnectError, ConnectTimeout, PayloadError, ReadTimeout, RequestBodyError, ResponseError,
    ServerDisconnected,
)
from projectionist.proxy.call.relay import client_error

Serve = Callable[["Conn"], Awaitable[None]]


class Conn:
    """One server-side connection: read requests off it, write script bytes to it."""

    def __init__(self, server: RawServer, index: int, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server, self.index, self.reader, self.writer = server, index, reader, writer

    async def request(self) -> bytes:
        """One whole request (head and body, sized or chunked) as it came on the wire, or b"" at EOF."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return b""
        lines = head.lower().split(b"\r\n")
        body = b""
        if b"transfer-encoding: chunked" in lines:
            while True:
                size_line = await self.reader.readuntil(b"\r\n")
                body += size_line + await self.reader.readexactly(int(size_line, 16) + 2)
                if int(size_line, 16) == 0:
                    break
        else:
            length = next((int(line[15:]) for line in lines if line.startswith(b"content-length:")), 0)
            body = await self.reader.readexactly(length)
        self.server.requests.append((self.index, head + body))
        return head + body

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()


class RawServer:
    """A loopback server: each connection runs ``serve``; it counts connections and keeps every
    request with the index of the connection it came on."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.connections = 0
        self.closed = 0
        self.requests: list[tuple[int, bytes]] = []
        self.url = URL()
        self._server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> RawServer:
        self._server = await asyncio.start_server(self._run, host, 0, ssl=tls)
        port = self._server.sockets[0].getsockname()[1]
        scheme = "https" if tls else "http"
        self.url = URL.build(scheme=scheme, host=host, port=port)
        return self

    async def _run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.serve(Conn(self, self.connections, reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            self.closed += 1
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def answering(*answers: bytes) -> Serve:
    """A keep-alive server that answers each request on a connection with the next of ``answers``
    (the last one again once they run out)."""
    async def serve(conn: Conn) -> None:
        n = 0
        while await conn.request():
            await conn.send(answers[min(n, len(answers) - 1)])
            n += 1
    return serve


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[RawServer]]]:
    servers: list[RawServer] = []

    async def start(script: Serve, **kwargs: object) -> RawServer:
        server = await RawServer(script).start(**kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server
    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    client = Client(2.0, 2.0)
    yield client
    await client.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
MakeServer = Callable[..., Awaitable[RawServer]]


async def test_a_sized_answer_keeps_its_headers_as_sent(serve: MakeServer, client: Client) -> None:
    server = await serve(answering(b"HTTP/1.1 201 Made It\r\nContent-Length: 5\r\nX-Trace: a\r\n"
                                   b"x-trace: b\r\nContent-Type: Application/JSON; charset=utf-8\r\n"
                                   b"Content-Encoding: gzip\r\n\r\nhello"))
    answer = await client.request("POST", server.url / "v1" % {"q": "1"}, data=b"{}",
                                  headers=CIMultiDict({"Authorization": "Bearer k"}))
    assert (answer.status, answer.reason, answer.content_length) == (201, "Made It", 5)
    assert list(answer.headers.items())[:3] == [("Content-Length", "5"), ("X-Trace", "a"), ("x-trace", "b")]
    assert answer.headers.getall("X-TRACE") == ["a", "b"]
    assert answer.content_type == "application/json"
    assert answer.headers["Content-Encoding"] == "gzip" and await answer.read() == b"hello"  # never inflated
    port = server.url.port
    assert server.requests == [(1, f"POST /v1?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer k\r\n"
                                   "Accept: */*\r\nContent-Length: 2\r\n\r\n{}".encode())]


async def test_request_heads_frame_as_aiohttp_did(serve: MakeServer, client: Client) -> None:
    server = await serve(answering(OK))
    for method in ("GET", "POST", "HEAD", "DELETE"):
        answer = await client.request(method, server.url / "p", headers=CIMultiDict({"Accept": "text/plain"}))
        await answer.read()
    port = server.url.port
    heads = [request.decode() for _, request in server.requests]
    assert heads[0] == f"GET /p HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/plain\r\n\r\n"
    assert heads[1] == f"POST /p HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/plain\r\nContent-Length: 0\r\n\r\n"
    assert "Content-Length" not in heads[2] and "Content-Length: 0" in heads[3]
    assert not any(name in head for head in heads for name in ("User-Agent", "Accept-Encoding", "Content-Type"))
    with pytest.raises(ValueError):
        await client.request("GET", server.url, headers=CIMultiDict({"X-Evil": "a\r\nX-Injected: 1"}))
    for evil in ({"X-Evil": "a\nX-Injected: 1"}, {"X-Evil": "a\rb"}, {"X-E\nvil": "a"}, {"Host": "h\r\nX-I: 1"},
                 {"A": "1", "B": "2\r\n", "C": "3"}):
        with pytest.raises(ValueError, match="a line break in the request header"):
            await client.request("GET", server.url, headers=CIMultiDict(evil))
    assert len(server.requests) == 4  # none of them was sent


async def test_request_heads_keep_the_callers_headers_in_order_and_write_the_framing_themselves(
        serve: MakeServer, client: Client) -> None:
    server = await serve(answering(OK))
    headers = CIMultiDict([("X-B", "2"), ("content-length", "99"), ("X-A", "1"), ("host", "example.test"),
                           ("X-B", "3"), ("transfer-encoding", "chunked")])
    await (await client.request("POST", server.url / "p", data=b"{}", headers=headers)).read()
    [(_, request)] = server.requests
    assert request.decode() == ("POST /p HTTP/1.1\r\nHost: example.test\r\nX-B: 2\r\nX-A: 1\r\nX-B: 3\r\n"
                                "Accept: */*\r\nContent-Length: 2\r\n\r\n{}")


async def test_chunked_and_close_delimited_bodies(serve: MakeServer, client: Client) -> None:
    chunked = await serve(answering(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                    b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"))
    answer = await client.request("GET", chunked.url)
    assert answer.content_length is None and await answer.read() == b"hello world"
    assert client.idle_connections(chunked.url) == 1

    async def until_close(conn: Conn) -> None:
        await conn.request()
        await conn.send(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of ")
        await conn.send(b"this, then the close")
    closing = await serve(until_close)
    answer = await client.request("GET", closing.url)
    assert await answer.read() == b"all of this, then the close"
    assert client.idle_connections(closing.url) == 0  # a body delimited by its close leaves nothing to reuse


@pytest.mark.parametrize("status", [204, 304])
async def test_no_body_for_head_204_and_304(serve: MakeServer, client: Client, status: int) -> None:
    server = await serve(answering(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",  # HEAD: the length of the body a GET would get
        f"HTTP/1.1 {status} X\r\nETag: e\r\n\r\n".encode(), OK))
    head = await client.request("HEAD", server.url)
    assert head.content_length == 1000 and await head.read() == b""
    none = await client.request("GET", server.url)
    assert none.status == status and await none.read() == b""
    assert await (await client.request("GET", server.url)).read() == b"ok"
    assert server.connections == 1 and len(server.requests) == 3  # each answer ended where it should


async def test_interim_answers_are_skipped(serve: MakeServer, client: Client) -> None:
    server = await serve(answering(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                                   b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    answer = await client.request("POST", server.url, data=b"x")
    assert answer.status == 200 and "Link" not in answer.headers and await answer.read() == b"ok"


async def test_a_switching_protocols_answer_nobody_asked_for_is_a_malformed_answer_at_once(serve: MakeServer) -> None:
    server = await serve(answering(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                   b"Connection: Upgrade\r\n\r\n\x81\x02hi"))
    client = Client(2, 30)  # a long read timeout: the answer must fail long before it
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(ResponseError):
            await asyncio.wait_for(client.request("GET", server.url), 10)
        assert asyncio.get_running_loop().time() - started < 5
    finally:
        await client.close()


async def test_an_early_answer_to_a_body_the_server_never_reads_is_the_answer(serve: MakeServer) -> None:
    held = asyncio.Event()

    async def refuse_early(conn: Conn) -> None:  # answers from the head alone, reads no body, stays open
        await conn.reader.readuntil(b"\r\n\r\n")
        await conn.send(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 7\r\n\r\ntoo big")
        await held.wait()

    server = await serve(refuse_early)

    async def body() -> AsyncIterator[bytes]:
        for _ in range(400):  # 25 MB: far more than the socket buffers hold
            yield b"x" * 65536

    client = Client(2, 30)  # the write would time out only after 30 s
    try:
        started = asyncio.get_running_loop().time()
        answer = await asyncio.wait_for(client.request("POST", server.url, data=body(),
                                                       headers=CIMultiDict({"Content-Length": str(400 * 65536)})), 10)
        assert answer.status == 413 and await answer.read() == b"too big"
        assert asyncio.get_running_loop().time() - started < 5
    finally:
        held.set()
        await client.close()


async def test_keep_alive_reuse_lifo_and_close(serve: MakeServer) -> None:
    async def tagged(conn: Conn) -> None:
        while await conn.request():
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n" + str(conn.index).encode())
    server = await serve(tagged)
    client = Client(2, 2)
    try:
        first, second = await asyncio.gather(client.request("GET", server.url), client.request("GET", server.url))
        assert server.connections == 2
        await first.read()
        await second.read()  # released last: the next request takes this one
        assert await (await client.request("GET", server.url)).read() == await second.read()
        assert [await (await client.request("GET", server.url)).read() for _ in range(3)] == [await second.read()] * 3
        assert server.connections == 2 and client.idle_connections() == 2
    finally:
        await client.close()

    closing = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"))
    client = Client(2, 2)
    try:
        for _ in range(2):
            assert await (await client.request("GET", closing.url)).read() == b"ok"
        assert closing.connections == 2 and client.idle_connections() == 0
    finally:
        await client.close()


async def test_idle_connections_close_after_the_idle_timeout(serve: MakeServer) -> None:
    server = await serve(answering(OK))
    client = Client(2, 2, idle_timeout=0.2)
    try:
        await (await client.request("GET", server.url)).read()
        assert client.idle_connections() == 1
        await asyncio.sleep(0.5)
        assert client.idle_connections() == 0 and server.closed == 1
        await (await client.request("GET", server.url)).read()
        assert server.connections == 2
    finally:
        await client.close()


async def test_a_connection_the_server_closed_while_idle_is_not_used(serve: MakeServer, client: Client) -> None:
    async def once(conn: Conn) -> None:  # keep-alive by its headers, closed right after
        await conn.request()
        await conn.send(OK)
    server = await serve(once)
    await (await client.request("GET", server.url)).read()
    await asyncio.sleep(0.1)  # the FIN arrives while the connection sits idle
    assert client.idle_connections() == 0
    assert await (await client.request("POST", server.url, data=b"x")).read() == b"ok"
    assert len(server.requests) == 2 and server.connections == 2


def stale_after(answers: int) -> Serve:
    """Each connection answers ``answers`` requests, then reads the next and closes without a byte
    (as a server closing an idle connection just as a request arrives looks to the client)."""
    async def serve(conn: Conn) -> None:
        for _ in range(answers):
            await conn.request()
            await conn.send(OK)
        await conn.request()
    return serve


async def test_a_stale_reused_connection_is_retried_once_on_a_fresh_one(serve: MakeServer, client: Client) -> None:
    server = await serve(stale_after(1))
    await (await client.request("GET", server.url)).read()
    answer = await client.request("PUT", server.url, data=b"second")
    assert await answer.read() == b"ok"
    assert [index for index, _ in server.requests] == [1, 1, 2]  # the second request, sent again on connection 2
    assert server.requests[1][1] == server.requests[2][1]


async def test_a_post_on_a_stale_connection_is_never_sent_twice(serve: MakeServer, client: Client) -> None:
    server = await serve(stale_after(1))
    await (await client.request("GET", server.url)).read()
    with pytest.raises(ServerDisconnected) as error:
        await client.request("POST", server.url, data=b"a completion, billed once")
    assert [index for index, _ in server.requests] == [1, 1]  # read once on the reused connection, not again
    assert client_error(error.value).code == "UPSTREAM_UNAVAILABLE"  # type: ignore[union-attr]


async def test_no_retry_on_a_fresh_connection_nor_twice(serve: MakeServer, client: Client) -> None:
    fresh = await serve(stale_after(0))
    with pytest.raises(ServerDisconnected) as error:
        await client.request("POST", fresh.url, data=b"once")
    assert len(fresh.requests) == 1  # read, then closed without a byte: never sent again
    assert client_error(error.value).code == "UPSTREAM_UNAVAILABLE"  # type: ignore[union-attr]

    twice = await serve(stale_after(1))
    await (await client.request("GET", twice.url)).read()
    twice.serve = stale_after(0)  # the fresh connection closes too
    with pytest.raises(ServerDisconnected):
        await client.request("PUT", twice.url, data=b"x")
    assert [index for index, _ in twice.requests] == [1, 1, 2]


async def test_a_streamed_body_already_begun_is_never_retried(serve: MakeServer, client: Client) -> None:
    server = await serve(stale_after(1))
    await (await client.request("GET", server.url)).read()
    consumed: list[bytes] = []

    async def body() -> AsyncIterator[bytes]:
        for part in (b"one", b"two"):
            consumed.append(part)
            yield part
    with pytest.raises(ServerDisconnected):
        await client.request("PUT", server.url, data=body())  # idempotent, yet its body is gone
    assert consumed == [b"one", b"two"] and server.connections == 1  # no second connection, no second pass


async def test_a_body_cut_mid_stream_is_an_error_and_its_connection_is_dropped(serve: MakeServer, client: Client) -> None:
    async def cut(conn: Conn) -> None:
        await conn.request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
    server = await serve(cut)
    answer = await client.request("GET", server.url)
    chunks = []
    with pytest.raises(PayloadError) as error:
        async for chunk in answer.content.iter_any():
            chunks.append(chunk)
    assert b"".join(chunks) == b"only ten b"
    assert client_error(error.value).code == "UPSTREAM_UNAVAILABLE"  # type: ignore[union-attr]
    answer.release()
    assert client.idle_connections() == 0


async def test_malformed_framing_fails_before_the_answer_starts(serve: MakeServer, client: Client) -> None:
    both = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 b"5\r\nhello\r\n0\r\n\r\n"))
    with pytest.raises(ResponseError):
        await client.request("GET", both.url)
    twice = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"))
    with pytest.raises(ResponseError):
        await client.request("GET", twice.url)
    in_one_read = await serve(answering(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"))
    with pytest.raises(ResponseError):  # all in one read: still before the answer is handed out
        await client.request("GET", in_one_read.url)

    async def later(conn: Conn) -> None:
        await conn.request()
        await conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await asyncio.sleep(0.05)
        await conn.send(b"zz\r\n")
        await conn.reader.read()
    bad_chunk = await serve(later)
    answer = await client.request("GET", bad_chunk.url)
    with pytest.raises(PayloadError):
        await answer.read()
    assert client.idle_connections() == 0


async def test_read_timeout_is_the_longest_silence(serve: MakeServer) -> None:
    async def stall_then_trickle(conn: Conn) -> None:
        while request := await conn.request():
            if b"/stall" in request:
                await asyncio.sleep(5)
            await conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(6):  # 0.6 s in all, never 0.3 s of silence
                await asyncio.sleep(0.1)
                await conn.send(b"1\r\nx\r\n")
            if b"/cut" in request:
                await asyncio.sleep(5)
            await conn.send(b"0\r\n\r\n")
    server = await serve(stall_then_trickle)
    client = Client(2, 0.3)
    try:
        started = time.monotonic()
        with pytest.raises(ReadTimeout) as error:
            await client.request("GET", server.url / "stall")
        assert 0.25 < time.monotonic() - started < 1.5
        assert client_error(error.value).code == "UPSTREAM_TIMEOUT"  # type: ignore[union-attr]
        assert await (await client.request("GET", server.url / "trickle")).read() == b"x" * 6
        answer = await client.request("GET", server.url / "cut")
        with pytest.raises(ReadTimeout):
            await answer.read()
        answer.release()
        assert client.idle_connections() == 0
    finally:
        await client.close()


async def test_connect_failures() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):  # fill the accept queue: further SYNs are dropped, the connect hangs
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(filler)
    client = Client(0.3, 2)
    try:
        started = time.monotonic()
        with pytest.raises(ConnectTimeout) as timeout:
            await client.request("GET", URL(f"http://127.0.0.1:{port}/"))
        assert 0.25 < time.monotonic() - started < 1.5
        assert client_error(timeout.value).code == "UPSTREAM_TIMEOUT"  # type: ignore[union-attr]
        with pytest.raises(ConnectError) as refused:
            await client.request("GET", URL("http://127.0.0.1:9/"))
        assert client_error(refused.value).code == "UPSTREAM_UNAVAILABLE"  # type: ignore[union-attr]
    finally:
        await client.close()
        for sock in (*fillers, listener):
            sock.close()


async def test_cancellation_closes_the_connection_and_leaks_no_task(serve: MakeServer, client: Client) -> None:
    async def slow(conn: Conn) -> None:
        request = await conn.request()
        if b"/head" not in request:
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfive!")
        await conn.reader.read()  # until the client closes
    server = await serve(slow)
    tasks_before = asyncio.all_tasks()
    got: list[bytes] = []

    async def consume() -> None:
        answer = await client.request("GET", server.url / "body")
        try:
            async for chunk in answer.content.iter_any():
                got.append(chunk)
        finally:
            answer.release()
    task = asyncio.create_task(consume())
    while not got:
        await asyncio.sleep(0.01)
    task.cancel()
    waiting = asyncio.create_task(client.request("GET", server.url / "head"))
    await asyncio.sleep(0.1)
    waiting.cancel()
    for cancelled in (task, waiting):
        with pytest.raises(asyncio.CancelledError):
            await cancelled
    await asyncio.sleep(0.1)
    assert got == [b"five!"] and client.idle_connections() == 0
    assert server.closed == 2  # both connections were closed by the client
    assert asyncio.all_tasks() == tasks_before


async def test_streamed_request_bodies(serve: MakeServer, client: Client) -> None:
    server = await serve(answering(OK))

    async def parts(*chunks: bytes) -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk
    await (await client.request("POST", server.url, data=parts(b"ab", b"", b"cde"))).read()
    await (await client.request("PUT", server.url, data=parts(b"ab", b"cde"),
                                headers=CIMultiDict({"Content-Length": "5"}))).read()
    chunked, sized = (request for _, request in server.requests)
    assert chunked.endswith(b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n")
    assert b"Content-Length: 5\r\n" in sized and sized.endswith(b"\r\n\r\nabcde") and b"chunked" not in sized
    for chunks in ((b"ab",), (b"abc", b"def")):
        with pytest.raises(RequestBodyError):
            await client.request("POST", server.url, data=parts(*chunks), headers=CIMultiDict({"Content-Length": "5"}))

    async def broken() -> AsyncIterator[bytes]:
        yield b"a"
        raise ConnectionResetError("the client went away")
    with pytest.raises(RequestBodyError):
        await client.request("POST", server.url, data=broken())
    assert client.idle_connections() <= 1  # the broken exchanges left nothing half-written in the pool


async def test_a_slow_consumer_holds_a_bounded_buffer(serve: MakeServer, client: Client) -> None:
    total = 16 * 1024 * 1024
    written = [0]

    async def flood(conn: Conn) -> None:
        await conn.request()
        conn.writer.transport.set_write_buffer_limits(high=64 * 1024)  # type: ignore[union-attr]
        await conn.send(f"HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n".encode())
        block = b"z" * 65536
        for _ in range(total // len(block)):
            await conn.send(block)
            written[0] += len(block)
    server = await serve(flood)
    answer = await client.request("GET", server.url)
    await asyncio.sleep(0.3)
    assert answer._size <= READ_BUFFER + 512 * 1024  # paused reading past the bound (one read may overshoot)
    assert written[0] < total // 2  # and the server is held back by TCP, not buffered in the proxy
    received = 0
    async for chunk in answer.content.iter_any():
        received += len(chunk)
        assert len(chunk) <= READ_BUFFER + 512 * 1024
    assert received == total and client.idle_connections() == 1


async def test_a_streamed_request_body_waits_for_the_transport(serve: MakeServer, client: Client) -> None:
    async def slow_reader(conn: Conn) -> None:
        await asyncio.sleep(0.3)  # nothing read for a while: the client's write buffer fills
        await conn.request()
        await conn.send(OK)
    server = await serve(slow_reader)
    buffered: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        for _ in range(256):  # 16 MiB
            transports = [conn.transport for conn in client._all if conn.transport is not None]
            buffered.append(max((t.get_write_buffer_size() for t in transports), default=0))
            yield b"y" * 65536
    answer = await client.request("POST", server.url, data=body())
    assert await answer.read() == b"ok"
    assert len(server.requests[0][1]) > 16 * 1024 * 1024
    assert max(buffered) <= 4 * 65536  # it waited for the server instead of queueing megabytes


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_tls_to_a_trusted_server_and_not_to_an_untrusted_one(serve: MakeServer, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server = await serve(answering(OK), tls=tls)
    url = URL.build(scheme="https", host="localhost", port=server.url.port, path="/tls")
    trusting = Client(2, 2, ssl_context=ssl.create_default_context(cafile=str(cert)))
    try:
        for _ in range(2):
            assert await (await trusting.request("GET", url)).read() == b"ok"
        assert server.connections == 1
        assert server.requests[0][1].startswith(f"GET /tls HTTP/1.1\r\nHost: localhost:{url.port}\r\n".encode())
    finally:
        await trusting.close()
    system_trust = Client(2, 2)  # the production default: the system's roots, which do not know this cert
    try:
        with pytest.raises(ConnectError) as error:
            await system_trust.request("GET", url)
        assert isinstance(error.value.__cause__, ssl.SSLCertVerificationError)
    finally:
        await system_trust.close()


async def test_an_ipv6_literal_host(serve: MakeServer, client: Client) -> None:
    server = await serve(answering(OK), host="::1")
    assert await (await client.request("GET", server.url / "six")).read() == b"ok"
    assert server.requests[0][1].startswith(f"GET /six HTTP/1.1\r\nHost: [::1]:{server.url.port}\r\n".encode())


async def test_release_before_the_end_closes_and_close_is_idempotent(serve: MakeServer, client: Client) -> None:
    server = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfo", OK))
    answer = await client.request("GET", server.url)
    answer.release()
    answer.release()
    answer.close()
    assert client.idle_connections() == 0
    await asyncio.sleep(0.05)
    assert server.closed == 1


async def test_a_second_answer_in_the_same_read_neither_rewrites_the_first_nor_is_pooled(
        serve: MakeServer, client: Client) -> None:
    # An upstream that sends bytes past a sized body in the same segment: they are no answer to
    # anything. They must not rewrite this answer's status or headers, and the connection must
    # not go back to the pool, where they could become the next request's answer.
    server = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\n\r\nhi"
                                   b"HTTP/1.1 500 Evil\r\nContent-Length: 0\r\nX-Evil: 1\r\n\r\n"))
    answer = await client.request("GET", server.url)
    assert (answer.status, answer.reason) == (200, "OK") and "X-Evil" not in answer.headers
    assert answer.headers["Content-Length"] == "2" and await answer.read() == b"hi"
    assert client.idle_connections() == 0
    garbage = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi\x00not http"))
    answer = await client.request("GET", garbage.url)  # the answer itself was whole and valid
    assert answer.status == 200 and await answer.read() == b"hi" and client.idle_connections() == 0


async def test_an_answer_head_without_end_is_refused_not_buffered(serve: MakeServer, client: Client) -> None:
    sent = [0]

    async def endless_headers(conn: Conn) -> None:
        await conn.request()
        await conn.send(b"HTTP/1.1 200 OK\r\n")
        for _ in range(4096):  # 32 MiB of header lines, never a blank line
            await conn.send(b"X-Pad: " + b"a" * 8185 + b"\r\n")
            sent[0] += 8194
    server = await serve(endless_headers)
    with pytest.raises(ResponseError, match="head"):
        await client.request("GET", server.url)
    assert sent[0] < 16 * 1024 * 1024  # refused long before its end (loopback buffers hold a few MiB)

    async def interim_flood(conn: Conn) -> None:
        await conn.request()
        for _ in range(100_000):
            await conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")
    flood = await serve(interim_flood)
    with pytest.raises(ResponseError, match="head"):
        await client.request("POST", flood.url, data=b"x")


async def test_an_upstream_that_reads_none_of_a_streamed_body_times_out(serve: MakeServer) -> None:
    # A slowloris upstream on the request side: it accepts and never reads. The write buffer stays
    # full; without a bound the call (and the client's connection) waited for ever.
    stop = asyncio.Event()

    async def deaf(conn: Conn) -> None:
        await stop.wait()
    server = await serve(deaf)
    client = Client(2.0, 0.5)

    async def body() -> AsyncIterator[bytes]:
        for _ in range(1024):  # 64 MiB: more than any socket buffer holds
            yield b"y" * 65536
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError) as timed_out:
            async with asyncio.timeout(10):
                await client.request("POST", server.url, data=body())
        assert time.monotonic() - started < 5
        assert client_error(timed_out.value).code == "UPSTREAM_TIMEOUT"  # type: ignore[union-attr]
        assert client.idle_connections() == 0
    finally:
        stop.set()
        await client.close()



async def test_bytes_that_arrived_while_the_loop_was_busy_are_no_answer_to_the_next_request(client: Client) -> None:
    # An upstream that sends a stray answer after a sized one, in its own segment: if the event
    # loop was busy (other requests' CPU work) when it arrived, nothing had read it yet, and the
    # next request on the pooled connection took it as its own answer. The server runs in a
    # thread of its own, so it sends while this loop is blocked.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for answers in ([OK, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTALE"],
                        [b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal"]):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                for n, answer in enumerate(answers):
                    if n:
                        time.sleep(0.02)
                    conn.sendall(answer)
                with contextlib.suppress(OSError):  # the next request, or the close (a reset: bytes unread)
                    conn.recv(65536)
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    url = URL.build(scheme="http", host="127.0.0.1", port=port)
    try:
        assert await (await client.request("GET", url)).read() == b"ok"
        time.sleep(0.2)  # the loop busy elsewhere while the stray bytes arrive
        assert await (await client.request("GET", url)).read() == b"real"
    finally:
        listener.close()


async def test_an_answer_read_whole_leaves_no_cycle_for_the_collector(serve: MakeServer, client: Client) -> None:
    """Every call of a busy proxy leaves nothing for the cyclic GC: the parser's callbacks would
    tie each answer (its head, headers and futures) into a cycle until a collection, which at a
    few thousand calls a second cost about 5% of the CPU."""
    server = await serve(answering(OK))
    gc.collect()
    gc.disable()
    try:
        for method in ("GET", "POST", "GET", "POST"):
            answer = await client.request(method, server.url, data=b"{}" if method == "POST" else None)
            assert await answer.read() == b"ok"
        streamed = await client.request("GET", server.url)
        assert [chunk async for chunk in streamed.iter_any()] == [b"ok"]
        streamed.release()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if type(o).__name__ in ("Response", "HttpResponseParser")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
