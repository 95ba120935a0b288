"""A small sized upstream answer is read whole before the response starts, so it leaves in one
write: its head is the upstream's (one Content-Type, the true Content-Length), and an answer that
breaks off before its declared length is still an error in the client's shape, never a cut body.
Bodies past ``WHOLE_BODY_MAX``, bodies without a length and event streams still stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from projectionist.proxy.call.relay import WHOLE_BODY_MAX
from tests.calls import raw_exchange, recorded_calls
from tests.conftest import Harness

MakeHarness = Callable[..., Awaitable[Harness]]


class RawUpstream:
    """Answers every request with the bytes in ``answer``, then closes the connection."""

    def __init__(self) -> None:
        self.answer = b""
        self.url = ""
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(self.answer)
        await writer.drain()
        writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    upstream = RawUpstream()
    await upstream.start()
    yield upstream
    await upstream.stop()


async def proxied(make_harness: MakeHarness, raw: RawUpstream) -> Harness:
    return await make_harness(**{"record.mode": "metadata",
                                 "upstreams.openai": {"format": "openai", "url": raw.url}})


async def exchange(harness: Harness, method: str = "POST") -> bytes:
    """Every byte the proxy sent back for one chat call (with a session) on a raw socket."""
    return await raw_exchange(harness, b'{"model": "m", "messages": []}', session="whole", method=method)


def answer_of(body: bytes, *, declared: int | None = None, content_type: bytes = b"application/json") -> bytes:
    length = str(len(body) if declared is None else declared).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nContent-Length: " + length
            + b"\r\nX-Upstream: yes\r\n\r\n" + body)


def header_lines(answer: bytes, name: bytes) -> list[bytes]:
    head = answer.partition(b"\r\n\r\n")[0]
    return [line for line in head.split(b"\r\n")[1:] if line.lower().startswith(name.lower() + b":")]


async def test_a_small_answer_goes_back_with_the_upstreams_head_once(make_harness: MakeHarness,
                                                                      raw_upstream: RawUpstream) -> None:
    body = b'{"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}'
    raw_upstream.answer = answer_of(body)
    harness = await proxied(make_harness, raw_upstream)
    answer = await exchange(harness)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.") == 1
    assert header_lines(answer, b"content-type") == [b"Content-Type: application/json"]
    assert header_lines(answer, b"content-length") == [b"Content-Length: " + str(len(body)).encode()]
    assert header_lines(answer, b"x-upstream") == [b"X-Upstream: yes"]
    assert answer.partition(b"\r\n\r\n")[2] == body
    [(_, outcome)] = recorded_calls(await harness.events("whole"))
    assert outcome is not None and outcome["status"] == 200 and outcome["usage"]["prompt_tokens"] == 3


async def test_a_small_answer_that_breaks_off_is_an_error_in_the_clients_shape(
        make_harness: MakeHarness, raw_upstream: RawUpstream) -> None:
    raw_upstream.answer = answer_of(b'{"id": "x", "cho', declared=200)
    harness = await proxied(make_harness, raw_upstream)
    resp = await harness.client.post("/v1/chat/completions", json={"model": "m", "messages": []},
                                     headers={"X-Session-Id": "whole"})
    assert resp.status == 502
    assert (await resp.json())["error"]["code"] == "UPSTREAM_UNAVAILABLE"
    [(_, outcome)] = recorded_calls(await harness.events("whole"))
    assert outcome is not None and outcome["error_code"] == "UPSTREAM_UNAVAILABLE"


async def test_a_large_answer_that_breaks_off_is_a_cut_stream(make_harness: MakeHarness,
                                                             raw_upstream: RawUpstream) -> None:
    sent = b"x" * (WHOLE_BODY_MAX + 10)
    raw_upstream.answer = answer_of(sent, declared=len(sent) + 100)
    harness = await proxied(make_harness, raw_upstream)
    answer = await exchange(harness)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.") == 1
    assert len(answer.partition(b"\r\n\r\n")[2]) < len(sent) + 100  # the client sees fewer bytes than announced


async def test_an_event_stream_is_never_held_back(make_harness: MakeHarness, raw_upstream: RawUpstream) -> None:
    events = b'data: {"choices": []}\n\ndata: [DONE]\n\n'
    raw_upstream.answer = answer_of(events, declared=len(events) + 50, content_type=b"text/event-stream")
    harness = await proxied(make_harness, raw_upstream)
    answer = await exchange(harness)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.partition(b"\r\n\r\n")[2] == events  # relayed as it came, then cut


async def test_a_head_answer_keeps_its_declared_length(make_harness: MakeHarness, raw_upstream: RawUpstream) -> None:
    raw_upstream.answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1234\r\n\r\n"
    harness = await proxied(make_harness, raw_upstream)
    answer = await exchange(harness, method="HEAD")
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert header_lines(answer, b"content-length") == [b"Content-Length: 1234"]
