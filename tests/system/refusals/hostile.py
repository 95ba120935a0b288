"""Helpers for the refusal fault tests: a fake upstream whose answers a test scripts per call
(``script``), in front of the ordinary ``FakeUpstream`` (which answers whatever the script leaves alone)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import msgspec
from aiohttp import web

from tests.fakes import FakeUpstream

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: (request, its decoded JSON body) -> a response, or None to let the ordinary fake answer.
Script = Callable[[web.Request, Any], Awaitable[web.StreamResponse | None]]


class Hostile(FakeUpstream):
    script: Script | None = None
    calls: int = 0


def hostile_app(fake: Hostile) -> web.Application:
    app = fake.app()

    @web.middleware
    async def scripted(request: web.Request, handler: Handler) -> web.StreamResponse:
        if fake.script is None or request.method != "POST":
            return await handler(request)
        body = await request.read()
        try:
            doc = msgspec.json.decode(body)
        except msgspec.DecodeError:
            doc = None
        fake.calls += 1
        answer = await fake.script(request, doc)
        if answer is None:
            return await handler(request)
        from tests.fakes import Received
        fake.received.append(Received(request.method, request.path_qs, dict(request.headers), body))
        return answer

    app.middlewares.insert(0, scripted)
    return app


def chat_body(*refs: str, inline: list[str] | None = None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": f"attachment:{r}"}} for r in refs]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in inline or []]
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def anthropic_body(*refs: str) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
    blocks += [{"type": "image", "source": {"type": "url", "url": f"attachment:{r}"}} for r in refs]
    return {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": blocks}]}


class StallMeter:
    """``async with StallMeter() as meter``: the longest time the event loop went without running
    a ``tick``-second sleep on time (``meter.longest``, seconds), noted up to the block's end."""

    def __init__(self, tick: float = 0.005) -> None:
        self.tick = tick
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.tick)
            self.longest = max(self.longest, time.perf_counter() - before - self.tick)

    async def __aenter__(self) -> StallMeter:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await asyncio.sleep(10 * self.tick)  # the last stall is noted before the watch stops
        assert self._task is not None
        self._task.cancel()
