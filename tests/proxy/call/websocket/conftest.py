"""Fixtures of the WebSocket relay's tests: the fake upstream (``fake``) and proxies in front of it
(``make_ws``: ``make_harness`` with the ``openai`` upstream pointed at the fake)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from projectionist.proxy.config import Config
from tests.conftest import Harness
from tests.proxy.call.websocket.fake import FakeSocket


@pytest.fixture
async def fake(aiohttp_server: Any) -> FakeSocket:
    socket = FakeSocket()
    server = await aiohttp_server(socket.app())
    socket.url = str(server.make_url("")).rstrip("/")
    return socket


@pytest.fixture
def make_ws(make_harness: Callable[..., Awaitable[Harness]], make_config: Callable[..., Config],
            fake: FakeSocket) -> Callable[..., Awaitable[Harness]]:
    """A proxy whose ``openai`` upstream is the fake (``openai=`` adds to that upstream's table)."""
    async def make(openai: dict[str, Any] | None = None, **overrides: Any) -> Harness:
        upstream = {"format": "openai", "url": fake.url, **(openai or {})}
        return await make_harness(make_config(**{"upstreams.openai": upstream, **overrides}))
    return make
