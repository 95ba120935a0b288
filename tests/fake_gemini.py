"""Fake upstream routes for Gemini ``generateContent`` / ``streamGenerateContent``.

Requests are recorded in ``fake.received`` like every other fake route. Answers are valid
``GenerateContentResponse`` objects in the REST (camelCase) spelling; streaming answers are SSE
``data:`` events (``\\r\\n\\r\\n``-terminated, as Google sends them), one per chunk, the last
carrying ``finishReason`` and ``usageMetadata``. Other model methods fall through to the echo route.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

if TYPE_CHECKING:
    from tests.fakes import FakeUpstream

GEMINI_TEXT = "Hello from the fake Gemini upstream."
USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 7, "totalTokenCount": 17}


def gemini_response(model: str, text: str, *, finish: str | None = "STOP", usage: bool = True) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    body: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": "fake-gemini-response"}
    if usage:
        body["usageMetadata"] = USAGE
    return body


def install_gemini(app: web.Application, fake: FakeUpstream) -> None:
    """Register the Gemini model routes on the fake upstream."""

    async def model_method(request: web.Request) -> web.StreamResponse:
        model, sep, method = request.match_info["target"].partition(":")
        if not sep or method not in ("generateContent", "streamGenerateContent"):
            return await fake.echo(request)
        await fake._record(request)
        if method == "generateContent":
            return web.json_response(gemini_response(model, GEMINI_TEXT))
        if request.query.get("alt") != "sse":
            # Without alt=sse Google streams one JSON array; tests always use the SDK's SSE mode.
            chunks = [gemini_response(model, f"tok{i} ", finish=None, usage=False) for i in range(fake.chunks)]
            return web.json_response(chunks)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(fake.chunks):
            last = i == fake.chunks - 1
            chunk = gemini_response(model, f"tok{i} ", finish="STOP" if last else None, usage=last)
            await resp.write(b"data: " + msgspec.json.encode(chunk) + b"\r\n\r\n")
            if i == 0 and fake.gate is not None:
                await fake.gate.wait()
            if fake.chunk_delay:
                await asyncio.sleep(fake.chunk_delay)
        await resp.write_eof()
        return resp

    for version in ("v1beta", "v1alpha", "v1"):
        app.router.add_post(f"/{version}/models/{{target}}", model_method)
