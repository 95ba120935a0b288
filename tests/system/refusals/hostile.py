"""Helpers for the refusal fault tests: a fake upstream whose answers a test scripts per call
(``script``), in front of the ordinary ``FakeUpstream`` (which answers whatever the script leaves alone)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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
