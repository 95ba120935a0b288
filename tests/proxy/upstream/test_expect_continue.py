"""Found by a red team, and held since: a client's ``Expect: 100-continue`` (curl sends it for any body over 1 KiB; so do
.NET's HttpClient and many Java clients) is an end-to-end header to the relay and goes upstream.
The built-in transport sends the body at once (RFC 9110 allows it) and skips a 100 if one comes;
aiohttp's transport, seeing that header, holds the body back until the upstream says
``100 Continue``. An upstream that does not answer 100 (many do not: HTTP/1.0 servers, some
gateways, servers that wait for the body first) then waits for a body that never comes, and the
call hangs for the upstream's whole ``read_timeout`` (600 s by default) and ends in a 504, on
that transport only. The proxy already answered the client's Expect itself: the header is the
proxy's own hop, not one to pass on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.calls import raw_bytes
from tests.conftest import Harness
from tests.proxy.upstream.test_client import Conn, MakeServer, RawServer, serve  # noqa: F401 (a fixture)

MakeHarness = Callable[..., Awaitable[Harness]]


async def never_says_continue(conn: Conn) -> None:
    """Reads head and body before it answers, never sends a 100; gives up on a body that has not
    come in 4 s (so the test ends: aiohttp's own wait has no deadline, not even ``read_timeout``;
    ``/tmp/redteam2/expect.py`` waited 40 s with a 2 s read timeout)."""
    try:
        while await asyncio.wait_for(conn.request(), 4):
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    except TimeoutError:
        return


@pytest.mark.parametrize("transport", ["builtin", "aiohttp"])
async def test_a_clients_expect_100_continue_does_not_stall_the_upstream_call(
        make_harness: MakeHarness, make_config: Callable[..., Any], serve: MakeServer, transport: str) -> None:  # noqa: F811
    raw: RawServer = await serve(never_says_continue)
    harness = await make_harness(make_config(**{"upstreams.openai": {
        "format": "openai", "url": str(raw.url), "transport": transport, "read_timeout": 3.0}}))
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 2000 + b'"}]}'
    started = asyncio.get_running_loop().time()
    got = await raw_bytes(harness, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode()
                          + b"\r\n\r\n" + body)
    took = asyncio.get_running_loop().time() - started
    final = [line for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.1 ") and not line.startswith(b"HTTP/1.1 100")]
    assert final[:1] == [b"HTTP/1.1 200 OK"] and took < 2, f"{final[:1]} after {took:.1f} s"
