"""Built-in fake OpenAI upstream, used when no peers directory is available.

``POST /v1/chat/completions`` answers a fixed completion, or ``N_CHUNKS`` SSE ``data:`` chunks
plus ``data: [DONE]`` when the body says ``"stream": true``. Env: ``PORT``, ``N_CHUNKS`` (20),
``CHUNK_DELAY_MS`` (0, a pause before each chunk). Run as ``python -m bench.fake_upstream``.
"""

from __future__ import annotations

import asyncio
import json
import os

import msgspec
from aiohttp import web

N_CHUNKS = int(os.environ.get("N_CHUNKS", "20"))
CHUNK_DELAY_S = float(os.environ.get("CHUNK_DELAY_MS", "0")) / 1000.0

COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "fake-model",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "Hello from the bench upstream."}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17},
}).encode()


def _chunk(index: int) -> bytes:
    last = index == N_CHUNKS - 1
    delta = {} if last else {"content": f"tok{index} "} if index else {"role": "assistant", "content": ""}
    payload = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
               "model": "fake-model",
               "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if last else None}]}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


CHUNKS = [_chunk(i) for i in range(N_CHUNKS)]


class _Request(msgspec.Struct):
    stream: bool = False


_decode = msgspec.json.Decoder(_Request).decode


async def chat(request: web.Request) -> web.StreamResponse:
    if not _decode(await request.read()).stream:
        return web.Response(body=COMPLETION, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in CHUNKS:
        if CHUNK_DELAY_S:
            await asyncio.sleep(CHUNK_DELAY_S)
        await response.write(chunk)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def make_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    return app


if __name__ == "__main__":
    if os.environ.get("UVLOOP") == "1":
        import uvloop

        asyncio.set_event_loop(loop := uvloop.new_event_loop())
    web.run_app(make_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "18001")),
                access_log=None, print=None, loop=asyncio.get_event_loop())
