"""Bytes an upstream sends that answer nothing never reach the next client: an answer followed by
more (a second answer, or garbage) right after its framed end, in the same segment or a little
later while its connection sits in the pool; a body on an answer to HEAD or on a 204/304; an
answer that came before the request was all sent (the upstream read none of its body: what it
makes of the rest is unknown). Each time the connection is closed, never reused, and the next
request, from another client, gets its own answer on a connection of its own.

The upstream is a raw asyncio server that answers byte-exact scripts and counts the connections
it accepted; the requests go through a proxy harness whose openai upstream it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from yarl import URL

from projectionist.proxy.upstream.client import Client
from tests.conftest import Harness

MakeHarness = Callable[..., Awaitable[Harness]]

STOLEN = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nstolen"


def own(n: int) -> bytes:
    """The answer to the ``n``-th request the upstream read (counted over all its connections)."""
    body = b"own-%d" % n
    return b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body


class StrayUpstream:
    """A keep-alive upstream: the first request it reads gets ``first`` and then, ``delay`` seconds
    later (0: in the same write), ``stray``; every later request, on whichever connection, gets its
    own answer (``own``). With ``read_body`` false it answers the first request from its head alone
    and reads nothing for a while; then it takes whatever that connection carries (the rest of
    the body, and any request after it) for requests, each answered with ``stray``."""

    def __init__(self, first: bytes, stray: bytes = STOLEN, *, delay: float = 0.0, read_body: bool = True) -> None:
        self.first, self.stray, self.delay, self.read_body = first, stray, delay, read_body
        self.connections = 0
        self.requests = 0
        self.url = ""
        self._server: asyncio.Server | None = None
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> StrayUpstream:
        listener = socket.create_server(("127.0.0.1", 0))
        # a small receive buffer: a body it does not read stays in the sender's buffers
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self._server = await asyncio.start_server(self._serve, sock=listener)
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._hold(asyncio.current_task())
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                n = self.requests
                length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                               if line.startswith(b"content-length:")), 0)
                if n == 1 and not self.read_body:
                    writer.write(self.first)
                    await writer.drain()
                    with contextlib.suppress(TimeoutError):  # answered; the body unread when the next request comes
                        await asyncio.wait_for(self._stopping.wait(), 0.3)
                    while await reader.read(65536):  # the body, then what followed it, taken for requests
                        writer.write(self.stray)
                    return
                await reader.readexactly(length)
                if n > 1:
                    writer.write(own(n))
                elif not self.delay:
                    writer.write(self.first + self.stray)  # one write: one segment on loopback
                else:
                    writer.write(self.first)
                    self._hold(asyncio.create_task(self._later(writer)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def _hold(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _later(self, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(self.delay)
        if not writer.is_closing():
            writer.write(self.stray)

    async def stop(self) -> None:
        self._stopping.set()
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[..., Awaitable[StrayUpstream]]]:
    started: list[StrayUpstream] = []

    async def start(*args: Any, **kwargs: Any) -> StrayUpstream:
        upstream = await StrayUpstream(*args, **kwargs).start()
        started.append(upstream)
        return upstream
    yield start
    for upstream in started:
        await upstream.stop()


async def through(make_harness: MakeHarness, upstream: StrayUpstream) -> Harness:
    return await make_harness(**{"upstreams.openai": {"format": "openai", "url": upstream.url}})


async def another_client(harness: Harness, method: str = "GET", path: str = "/v1/models") -> tuple[int, bytes]:
    """One request from a client of its own (its own connection to the proxy)."""
    url = harness.client.proxy.make_url(path)  # type: ignore[attr-defined]  # a tests.conftest.Routed
    async with aiohttp.ClientSession() as session, session.request(method, url) as resp:
        return resp.status, await resp.read()


SAME_SEGMENT = {
    "sized": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "empty": b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("framing", list(SAME_SEGMENT))
@pytest.mark.parametrize("stray", [STOLEN, b"\x00garbage after the end"], ids=["answer", "garbage"])
async def test_bytes_after_the_end_in_the_same_segment_close_the_connection(
        make_harness: MakeHarness, upstreams: Any, framing: str, stray: bytes) -> None:
    upstream = await upstreams(SAME_SEGMENT[framing], stray)
    harness = await through(make_harness, upstream)
    first = await harness.client.get("/v1/models")
    assert first.status == 200 and await first.read() == (b"" if framing == "empty" else b"ok")
    assert await another_client(harness) == (200, b"own-2")
    assert upstream.connections == 2  # the first connection was never reused


async def test_bytes_after_the_end_a_little_later_close_the_pooled_connection(
        make_harness: MakeHarness, upstreams: Any) -> None:
    upstream = await upstreams(SAME_SEGMENT["sized"], delay=0.05)
    harness = await through(make_harness, upstream)
    first = await harness.client.get("/v1/models")
    assert first.status == 200 and await first.read() == b"ok"
    await asyncio.sleep(0.2)  # the stray answer arrives while the connection sits in the pool
    assert await another_client(harness) == (200, b"own-2")
    assert upstream.connections == 2


async def test_a_body_on_an_answer_to_head_closes_the_connection(make_harness: MakeHarness, upstreams: Any) -> None:
    # the length a GET would get, then that body anyway, then a stray answer
    upstream = await upstreams(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    harness = await through(make_harness, upstream)
    first = await harness.client.head("/v1/models")
    assert first.status == 200 and await first.read() == b""
    assert await another_client(harness) == (200, b"own-2")
    assert upstream.connections == 2


@pytest.mark.parametrize("status", [204, 304])
async def test_a_body_on_a_204_or_304_closes_the_connection(make_harness: MakeHarness, upstreams: Any,
                                                             status: int) -> None:
    upstream = await upstreams(f"HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok".encode())
    harness = await through(make_harness, upstream)
    first = await harness.client.get("/v1/models")
    assert first.status == status and await first.read() == b""
    assert await another_client(harness) == (200, b"own-2")
    assert upstream.connections == 2


BIG = 16 * 1024 * 1024  # more than the socket buffers hold: most of it is in the proxy's own buffer
SMALL = 64 * 1024  # all of it in the kernel's buffers at once: what the upstream's kernel did not take is queued


def chat(size: int) -> bytes:
    return b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * size + b'"}]}'


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/chat/completions", chat(BIG)),  # projected: sent upstream as one buffer
    ("POST", "/v1/chat/completions", chat(SMALL)),
    ("PUT", "/v1/batches/b1", b"x" * BIG),  # passed through: streamed upstream as it comes
], ids=["bytes", "small-bytes", "streamed"])
async def test_an_early_answer_to_an_unread_body_closes_the_connection(
        make_harness: MakeHarness, upstreams: Any, method: str, path: str, body: bytes) -> None:
    upstream = await upstreams(b"HTTP/1.1 413 Too Large\r\nContent-Length: 7\r\n\r\ntoo big", read_body=False)
    harness = await through(make_harness, upstream)
    first = await harness.client.request(method, path, data=body, headers={"Content-Type": "application/json"})
    assert first.status == 413 and await first.read() == b"too big"
    assert await another_client(harness) == (200, b"own-2")
    assert upstream.connections == 2


# The client itself, for the bodies the proxy sends (bytes, and a stream).

@pytest.mark.parametrize("body", ["bytes", "small-bytes", "streamed"])
async def test_the_client_closes_a_connection_answered_before_its_request_was_sent(upstreams: Any,
                                                                                  body: str) -> None:
    async def streamed() -> AsyncIterator[bytes]:
        for _ in range(BIG // 65536):
            yield b"y" * 65536
    data: bytes | AsyncIterator[bytes] = {"bytes": b"x" * BIG, "small-bytes": b"x" * SMALL}.get(body) or streamed()
    upstream = await upstreams(b"HTTP/1.1 413 Too Large\r\nContent-Length: 7\r\n\r\ntoo big", read_body=False)
    url = URL(upstream.url)
    client = Client(2, 5)
    try:
        answer = await client.request("POST", url, data=data)
        assert answer.status == 413 and await answer.read() == b"too big"
        assert client.idle_connections() == 0
        assert await (await client.request("GET", url)).read() == b"own-2"
        assert upstream.connections == 2
    finally:
        await client.close()


async def test_a_connection_whose_request_was_all_read_is_still_reused(upstreams: Any) -> None:
    # the checks cost no reuse: an answer after the whole body (read by the upstream) keeps it
    upstream = await upstreams(SAME_SEGMENT["sized"], b"")
    url = URL(upstream.url)
    client = Client(2, 5)
    try:
        assert await (await client.request("POST", url, data=b"x" * BIG)).read() == b"ok"
        assert client.idle_connections() == 1
        assert await (await client.request("GET", url)).read() == b"own-2"
        assert upstream.connections == 1
    finally:
        await client.close()
