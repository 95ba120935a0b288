"""Test double for the aider tests: a scripted OpenAI Chat Completions + Anthropic Messages upstream.

It answers one scripted reply (``answer``), streamed as SSE when the request asks for a stream
(aider streams by default) or as one JSON document otherwise, and records every request it gets:
method, path, query, headers and the decoded body (aiohttp undoes any ``Content-Encoding``; the
header itself is kept, so a test sees what the client offered and sent).

It refuses, as providers do, any request whose body inlines an image whose decoded bytes have a
sha256 in ``refused`` (``sha256:<hex>`` -> whether the error names the image's place), in the
shapes ``tests/refusing.py`` documents:

- Anthropic: 400 ``invalid_request_error`` "Could not process image", or, named,
  ``messages.N.content.M.image.source.base64.data: Could not process image``;
- OpenAI: 400 "You uploaded an unsupported image..." with ``code: invalid_image_format`` and
  ``param: null``, or, named, ``param: "messages[N].content[M].image_url"``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.refusing import OPENAI_MESSAGE, inlined, refusal

#: What the scripted model answers when a test does not say otherwise.
ANSWER = "The screenshot shows a small test pattern. AIDER-SCRIPTED-ANSWER-7f3a."


@dataclass
class Call:
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    raw: bytes
    body: Any  # the decoded JSON body, or None

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    @property
    def images(self) -> list[tuple[tuple[str, ...], str]]:
        """Every inlined image: (path of the value in the body, ``sha256:`` of its decoded bytes)."""
        return list(inlined(self.body)) if self.body is not None else []

    @property
    def text(self) -> str:
        return self.raw.decode(errors="replace")


def openai_place(path: tuple[str, ...]) -> str:
    """``("messages", "0", "content", "1", "image_url", "url")`` -> ``messages[0].content[1].image_url``."""
    out: list[str] = []
    for i, step in enumerate(path[:path.index("image_url") + 1] if "image_url" in path else path):
        out.append(f"[{step}]" if step.isdigit() else ("." if i else "") + step)
    return "".join(out)


def anthropic_place(path: tuple[str, ...]) -> str:
    """``("messages", "0", "content", "1", "source", "data")`` -> ``messages.0.content.1.image.source.base64.data``."""
    block = path[:path.index("source")] if "source" in path else path
    return ".".join(block) + ".image.source.base64.data"


def refuse(route: str, path: tuple[str, ...], named: bool) -> web.Response:
    if not named:
        return refusal(route, path, False)  # tests/refusing.py's unnamed shapes, as they are
    if route.endswith("/messages"):
        return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                             "message": anthropic_place(path) + ": Could not process image"},
                                  "request_id": "req_fake"}, status=400)
    return web.json_response({"error": {"message": OPENAI_MESSAGE, "type": "invalid_request_error",
                                        "param": openai_place(path), "code": "invalid_image_format"}}, status=400)


@dataclass
class ScriptedUpstream:
    answer: str = ANSWER
    refused: dict[str, bool] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    refusals: int = 0
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        for prefix in ("", "/v1"):
            app.router.add_post(prefix + "/chat/completions", self.chat)
            app.router.add_post(prefix + "/messages", self.messages)
            app.router.add_post(prefix + "/messages/count_tokens", self.count_tokens)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    def posts(self, suffix: str) -> list[Call]:
        return [c for c in self.calls if c.method == "POST" and c.path.endswith(suffix)]

    async def _record(self, request: web.Request) -> Call:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        call = Call(request.method, request.path, request.query_string, list(request.headers.items()), raw, body)
        self.calls.append(call)
        return call

    def _refusal(self, request: web.Request, call: Call) -> web.Response | None:
        hit = next(((path, found) for path, found in call.images if found in self.refused), None)
        if hit is None:
            return None
        self.refusals += 1
        return refuse(request.path, hit[0], self.refused[hit[1]])

    async def other(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        return web.json_response({"error": {"message": f"no route {request.method} {request.path}",
                                            "type": "not_found"}}, status=404)

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        return web.json_response({"input_tokens": 42})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        call = await self._record(request)
        refused = self._refusal(request, call)
        if refused is not None:
            return refused
        doc = call.body or {}
        model = doc.get("model", "gpt-4o")
        usage = {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112}
        if not doc.get("stream"):
            return web.json_response({
                "id": "chatcmpl-scripted", "object": "chat.completion", "created": 1700000000, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.answer},
                             "finish_reason": "stop"}], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
            data = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1700000000,
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")

        await chunk({"role": "assistant", "content": ""})
        words = self.answer.split(" ")
        for i, word in enumerate(words):
            await chunk({"content": word + (" " if i < len(words) - 1 else "")})
        await chunk({}, "stop")
        if (doc.get("stream_options") or {}).get("include_usage"):
            data = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1700000000,
                    "model": model, "choices": [], "usage": usage}
            await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def messages(self, request: web.Request) -> web.StreamResponse:
        call = await self._record(request)
        refused = self._refusal(request, call)
        if refused is not None:
            return refused
        doc = call.body or {}
        model = doc.get("model", "claude-sonnet-4-5")
        message = {"id": "msg_scripted", "type": "message", "role": "assistant", "model": model,
                   "content": [{"type": "text", "text": self.answer}], "stop_reason": "end_turn",
                   "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 12}}
        if not doc.get("stream"):
            return web.json_response(message)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def event(name: str, data: dict[str, Any]) -> None:
            await resp.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())

        start = dict(message, content=[], stop_reason=None, usage={"input_tokens": 100, "output_tokens": 1})
        await event("message_start", {"type": "message_start", "message": start})
        await event("content_block_start", {"type": "content_block_start", "index": 0,
                                            "content_block": {"type": "text", "text": ""}})
        await event("ping", {"type": "ping"})
        words = self.answer.split(" ")
        for i, word in enumerate(words):
            await event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
                "type": "text_delta", "text": word + (" " if i < len(words) - 1 else "")}})
        await event("content_block_stop", {"type": "content_block_stop", "index": 0})
        await event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                      "stop_sequence": None}, "usage": {"output_tokens": 12}})
        await event("message_stop", {"type": "message_stop"})
        await resp.write_eof()
        return resp


class Trap:
    """A dead-end HTTP proxy on loopback: the runs' ``HTTP(S)_PROXY``, so that anything a client
    tries to reach beyond loopback (release checks, price maps, analytics) is recorded here and
    refused (403), never sent out. Loopback itself is in ``NO_PROXY``."""

    def __init__(self) -> None:
        self.requests: list[str] = []  # each attempt's request line, e.g. ``CONNECT pypi.org:443 HTTP/1.1``
        self.url = ""
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> Trap:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            self.requests.append(line.decode(errors="replace").strip())
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def env(self) -> dict[str, str]:
        loopback = "127.0.0.1,localhost,::1"
        return {"HTTP_PROXY": self.url, "HTTPS_PROXY": self.url, "http_proxy": self.url, "https_proxy": self.url,
                "ALL_PROXY": self.url, "NO_PROXY": loopback, "no_proxy": loopback}
