"""Found by a red team, and held since: hostile upstream answers, on both transports.

- An unasked-for ``101 Switching Protocols``: the built-in client refuses it (a 502), the aiohttp
  transport hands it back as an answer, and the proxy tells its client ``101 Switching Protocols``.
- A head bigger than ``client.MAX_HEAD`` (64 KiB) is refused only when it arrives over several
  reads: one that comes in a single read (up to the loop's read size) is accepted whole, and the
  proxy relays a 100 KB header line that its clients' HTTP parsers refuse (h11: 16 KiB; aiohttp:
  8 KiB), where the aiohttp transport gives the client a 502 in its own shape.
- A status outside 100-599 (``099``, ``600``) goes to the client as the status line ``99``/``600``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from multidict import CIMultiDict

from projectionist.proxy.upstream.client import MAX_HEAD, Client, ResponseError
from tests.calls import raw_bytes
from tests.conftest import Harness
from tests.proxy.upstream.test_client import Conn, MakeServer, RawServer, serve  # noqa: F401 (a fixture)

MakeHarness = Callable[..., Awaitable[Harness]]


def once(answer: bytes) -> Callable[[Conn], Awaitable[None]]:
    async def serve_one(conn: Conn) -> None:
        if await conn.request():
            await conn.send(answer)
            await asyncio.sleep(0.3)
    return serve_one


async def status_through_proxy(make_harness: MakeHarness, make_config: Callable[..., Any], raw: RawServer,
                               transport: str) -> bytes:
    harness = await make_harness(make_config(**{"upstreams.openai": {
        "format": "openai", "url": str(raw.url), "transport": transport, "read_timeout": 2.0}}))
    body = b'{"model":"m","messages":[]}'
    got = await raw_bytes(harness, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return got.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("transport", ["builtin", "aiohttp"])
async def test_an_unasked_for_101_is_a_502_on_both_transports(
        make_harness: MakeHarness, make_config: Callable[..., Any], serve: MakeServer, transport: str) -> None:  # noqa: F811
    raw = await serve(once(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nxxxx"))
    assert await status_through_proxy(make_harness, make_config, raw, transport) == b"HTTP/1.1 502 Bad Gateway"


@pytest.mark.parametrize("status", [b"099", b"600"])
@pytest.mark.parametrize("transport", ["builtin", "aiohttp"])
async def test_a_status_outside_100_to_599_is_a_502(make_harness: MakeHarness, make_config: Callable[..., Any],
                                                    serve: MakeServer, transport: str, status: bytes) -> None:  # noqa: F811
    raw = await serve(once(b"HTTP/1.1 " + status + b" Odd\r\nContent-Length: 2\r\n\r\nok"))
    assert await status_through_proxy(make_harness, make_config, raw, transport) == b"HTTP/1.1 502 Bad Gateway"


async def test_a_head_within_max_head_in_bytes_is_accepted_whatever_its_fields(serve: MakeServer) -> None:  # noqa: F811
    """The bound is on the head's bytes: 12,000 compact fields (``a:b``) in 60 KB are a head
    within it, though the old estimate (4 bytes a field) put them at 72 KB."""
    compact = b"HTTP/1.1 200 OK\r\n" + b"a:b\r\n" * 12_000 + b"Content-Length: 2\r\n\r\nok"
    assert len(compact) < MAX_HEAD
    raw = await serve(once(compact))
    client = Client(2.0, 2.0)
    try:
        answer = await client.request("GET", raw.url / "h", headers=CIMultiDict())
        assert answer.status == 200 and len(answer.headers.getall("a")) == 12_000
        assert await answer.read() == b"ok"
    finally:
        await client.close()


async def test_a_head_over_max_head_is_refused_even_in_one_read(serve: MakeServer) -> None:  # noqa: F811
    big = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD + 36 * 1024) + b"\r\nContent-Length: 2\r\n\r\nok"
    raw = await serve(once(big))
    client = Client(2.0, 2.0)
    try:
        with pytest.raises(ResponseError):
            answer = await client.request("GET", raw.url / "h", headers=CIMultiDict())
            answer.release()
    finally:
        await client.close()
