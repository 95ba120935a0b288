"""A WebSocket fake upstream: OpenAI's Responses WebSocket mode and a Realtime echo, on a real
aiohttp server a test starts.

``FakeSocket`` records each handshake's headers and subprotocols and every message it gets. It
answers each ``response.create`` with the Responses event sequence the SDK expects
(``tests.fake_responses.stream_events``; ``stream_id`` echoed), or, when the message inlines an
image whose id is in ``refused``, with OpenAI's image refusal as an ``error`` event (the
``status`` and ``error`` object the SDK's ``ResponseWsError`` has). ``script`` answers a message
first (return True when it did). ``/v1/realtime`` echoes every frame back as it came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from tests.fake_responses import stream_events
from tests.refusing import OPENAI_MESSAGE, inlined

Script = Callable[[web.WebSocketResponse, bytes], Awaitable[bool]]

REFUSAL: dict[str, Any] = {"type": "error", "status": 400,
                           "error": {"type": "invalid_request_error", "code": "invalid_image_format",
                                     "message": OPENAI_MESSAGE, "param": None}}


@dataclass
class Handshake:
    path_qs: str
    headers: dict[str, str]
    protocols: list[str]


@dataclass
class FakeSocket:
    url: str = ""
    handshakes: list[Handshake] = field(default_factory=list)
    messages: list[bytes] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)
    refusals: int = 0
    chunks: int = 3
    script: Script | None = None
    #: The subprotocol the fake chooses, if the client offers it.
    protocol: str | None = None
    max_message: int = 256 * 1024 * 1024
    #: Set when a message arrives (a test awaits it instead of sleeping).
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_code: int | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/responses", self.responses)
        app.router.add_get("/v1/realtime", self.realtime)
        return app

    def bodies(self) -> list[Any]:
        return [msgspec.json.decode(m) for m in self.messages]

    async def _open(self, request: web.Request) -> web.WebSocketResponse:
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        self.handshakes.append(Handshake(request.path_qs, dict(request.headers), offered))
        ws = web.WebSocketResponse(protocols=(self.protocol,) if self.protocol else (), max_msg_size=self.max_message)
        await ws.prepare(request)
        return ws

    async def responses(self, request: web.Request) -> web.StreamResponse:
        ws = await self._open(request)
        async for msg in ws:
            if msg.type is not WSMsgType.TEXT:
                continue
            data = msg.data.encode()
            self.messages.append(data)
            self.arrived.set()
            if self.script is not None and await self.script(ws, data):
                continue
            await self.answer(ws, msgspec.json.decode(data))
        self.close_code = ws.close_code
        self.closed.set()
        return ws

    async def answer(self, ws: web.WebSocketResponse, doc: Any) -> None:
        lane = {"stream_id": doc["stream_id"]} if isinstance(doc, dict) and "stream_id" in doc else {}
        if any(found in self.refused for _, found in inlined(doc)):
            self.refusals += 1
            await ws.send_str(msgspec.json.encode({**REFUSAL, **lane}).decode())
            return
        for event in stream_events(self.chunks):
            await ws.send_str(msgspec.json.encode({**event, **lane}).decode())

    async def realtime(self, request: web.Request) -> web.StreamResponse:
        ws = await self._open(request)
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                self.messages.append(msg.data.encode())
                await ws.send_str(msg.data)
            elif msg.type is WSMsgType.BINARY:
                self.messages.append(msg.data)
                await ws.send_bytes(msg.data)
        self.close_code = ws.close_code
        self.closed.set()
        return ws
