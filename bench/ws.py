"""The Responses WebSocket row: a fake upstream, the bare relay it is held against, and the load.

``python -m bench.ws upstream`` serves ``/v1/responses`` as a WebSocket: each ``response.create``
text frame is answered with ``response.created``, the message's ``response.output_item.added``,
``N_DELTAS`` ``response.output_text.delta`` events, ``response.output_item.done`` and
``response.completed`` (with usage), one frame each, as the Responses WebSocket mode streams a
turn (enough for the Codex CLI to finish one: ``bench/codex_turns.py``). ``python -m bench.ws relay`` is the floor: a bare aiohttp WebSocket relay that
opens one upstream socket per client socket and pumps text frames both ways, nothing else.
``run`` drives ``concurrency`` sockets, each sending one turn after another for ``duration``
seconds; a turn's latency runs from its ``response.create`` to its ``response.completed``. Each
socket's handshake names its conversation in a ``session-id`` header, as the Codex CLI's does
(``tests/system/test_codex_websocket.py`` sees it), so the proxy finds the session Codex names
rather than deriving one each turn.
Env: ``PORT``, ``UPSTREAM`` (the relay's), ``UVLOOP=1``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from bench.load import AUTH_KEY, LoadResult, summary

PATH = "/v1/responses"
N_DELTAS = 20
MAX_MESSAGE = 64 * 1024 * 1024
_encode = msgspec.json.encode


def _events(turn: int) -> list[str]:
    deltas = [f"tok{i} " for i in range(N_DELTAS)]
    text = "".join(deltas)
    response = {"id": f"resp_bench_{turn}", "object": "response", "status": "in_progress", "model": "fake-model",
                "output": []}
    item = {"type": "message", "id": "msg_bench", "role": "assistant", "status": "in_progress", "content": []}
    done_item = {**item, "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": response},
                                    {"type": "response.output_item.added", "output_index": 0, "item": item}]
    events += [{"type": "response.output_text.delta", "item_id": "msg_bench", "output_index": 0,
                "content_index": 0, "delta": delta} for delta in deltas]
    events.append({"type": "response.output_item.done", "output_index": 0, "item": done_item})
    events.append({"type": "response.completed", "response": {
        **response, "status": "completed", "output": [done_item],
        "usage": {"input_tokens": 10, "output_tokens": N_DELTAS, "total_tokens": 10 + N_DELTAS}}})
    return [_encode({**event, "sequence_number": seq}).decode() for seq, event in enumerate(events)]


EVENTS = _events(0)


async def upstream(request: web.Request) -> web.WebSocketResponse:
    socket = web.WebSocketResponse(max_msg_size=MAX_MESSAGE, autoping=True)
    await socket.prepare(request)
    async for message in socket:
        if message.type != aiohttp.WSMsgType.TEXT:
            break
        for event in EVENTS:
            await socket.send_str(event)
    return socket


def upstream_app() -> web.Application:
    app = web.Application()
    app.router.add_get(PATH, upstream)
    return app


async def relay(request: web.Request) -> web.WebSocketResponse:
    """The bare relay: one upstream socket per client socket, frames pumped as they come."""
    session: aiohttp.ClientSession = request.app["session"]
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "openai-beta")}
    async with session.ws_connect(request.app["upstream"] + PATH, headers=headers, max_msg_size=MAX_MESSAGE) as up:
        socket = web.WebSocketResponse(max_msg_size=MAX_MESSAGE)
        await socket.prepare(request)

        async def down() -> None:
            async for message in up:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                await socket.send_str(message.data)
            await socket.close()

        pump = asyncio.create_task(down())
        try:
            async for message in socket:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                await up.send_str(message.data)
        finally:
            pump.cancel()
    return socket


async def _session(app: web.Application) -> Any:
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app["session"].close()


def relay_app(upstream_base: str) -> web.Application:
    app = web.Application()
    app["upstream"] = upstream_base.rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_get(PATH, relay)
    return app


async def run_turns(url: str, message: str, headers: dict[str, str], concurrency: int, duration: float) -> LoadResult:
    """``concurrency`` sockets at ``url`` (``ws://``), each sending ``message`` turn after turn;
    each socket's handshake names a conversation of its own in a ``session-id`` header unless
    ``headers`` name one, as the Codex CLI's does (the bare relay ignores it)."""
    latencies: list[float] = []
    errors = 0
    all_headers = {"Authorization": f"Bearer {AUTH_KEY}", **headers}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        deadline = time.perf_counter() + duration

        async def one() -> None:
            nonlocal errors
            own = {} if "session-id" in all_headers else {"session-id": str(uuid.uuid4())}
            try:
                async with session.ws_connect(url, headers={**all_headers, **own}, max_msg_size=MAX_MESSAGE) as socket:
                    while time.perf_counter() < deadline:
                        started = time.perf_counter()
                        await socket.send_str(message)
                        while True:
                            frame = await asyncio.wait_for(socket.receive(), 30)
                            if frame.type != aiohttp.WSMsgType.TEXT:
                                raise RuntimeError(f"socket ended: {frame.type}")
                            if '"response.completed"' in frame.data[:64]:
                                break
                            if '"error"' in frame.data[:32]:
                                raise RuntimeError("error event")
                        latencies.append(time.perf_counter() - started)
            except (TimeoutError, aiohttp.ClientError, RuntimeError):
                errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return summary(latencies, errors, elapsed)


def run(url: str, message: str, headers: dict[str, str], concurrency: int, duration: float) -> LoadResult:
    return asyncio.run(run_turns(url, message, headers, concurrency, duration))


def turn_message(body: bytes) -> str:
    """A ``response.create`` frame with the fields of a ``POST /v1/responses`` body."""
    fields = msgspec.json.decode(body)
    fields.pop("stream", None)
    return _encode({"type": "response.create", **fields}).decode()


def main(argv: list[str]) -> None:
    role = argv[1] if len(argv) > 1 else "upstream"
    if os.environ.get("UVLOOP") == "1":
        import uvloop

        asyncio.set_event_loop(uvloop.new_event_loop())
    app = upstream_app() if role == "upstream" else relay_app(os.environ["UPSTREAM"])
    web.run_app(app, host="127.0.0.1", port=int(os.environ.get("PORT", "18011")), access_log=None, print=None,
                loop=asyncio.get_event_loop())


if __name__ == "__main__":
    main(sys.argv)
