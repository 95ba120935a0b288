"""Red team: a gzip body whose decode is cancelled (the client goes away while the worker thread
inflates it) leaks its decoded bytes from the memory budget for good.

The middleware releases ``ctx.held`` when the cancelled handler unwinds, but ``asyncio.to_thread``
cannot stop the worker: it goes on calling ``held.grow`` for every 64 KiB it inflates, after the
release, and nobody releases those bytes again. A client that repeats this spends the budget
and every later request is 503 MEMORY_BUSY."""

from __future__ import annotations

import asyncio
import gzip
import threading
from typing import Any

from projectionist.proxy.inbound import bodies
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import Harness, routed_client
from projectionist.proxy.edge.app import create_app, open_log, open_store
from tests.fakes import CountingStore

KiB = 1024


async def test_cancelled_gzip_decode_gives_back_every_byte(aiohttp_client: Any, make_config: Any, upstream: Any,
                                                          monkeypatch: Any) -> None:
    config = make_config(**{"server.memory_budget": 2 * 1024 * KiB, "server.client_max_size": 1024 * KiB,
                            "server.websocket_max_message": 1024 * KiB})
    store = CountingStore(open_store(config))
    client = await routed_client(aiohttp_client, create_app(config, store=store, log=open_log(config)),
                                 server_kwargs={"handler_cancellation": True})  # as the CLI runs it
    harness = Harness(client, store, upstream)
    budget = harness.app[SERVICES].budget

    started, go = threading.Event(), threading.Event()
    real = bodies.inflate

    def slow_inflate(*args: Any) -> bytes:
        started.set()
        go.wait(10)  # the client goes away while this thread decodes
        return real(*args)

    monkeypatch.setattr(bodies, "inflate", slow_inflate)
    plain = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * (600 * KiB) + b'"}]}'
    packed = gzip.compress(plain, mtime=0)
    server = client.proxy.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(packed) + packed)
    await writer.drain()
    assert await asyncio.to_thread(started.wait, 10)
    writer.close()  # the client disconnects mid-decode: the handler is cancelled
    for _ in range(200):
        if budget.held == 0:
            break
        await asyncio.sleep(0.01)
    assert budget.held == 0  # the middleware gave back what the request held so far
    go.set()  # the worker thread finishes its decode now
    await asyncio.sleep(0.5)
    assert budget.held == 0, f"{budget.held} bytes of the budget held by a request that ended"
