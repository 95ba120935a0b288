"""Red team (redteam2): bytes of the memory budget that never come back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from aiohttp import web

from projectionist.proxy.call import websocket_calls
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import Harness
from tests.proxy.call.websocket.fake import FakeSocket
from tests.proxy.call.websocket.conftest import fake, make_ws  # noqa: F401 (fixtures)
from tests.proxy.call.websocket.test_relay import create

MakeWs = Callable[..., Awaitable[Harness]]
KiB = 1024


async def settled(budget: Any, held: int) -> None:
    for _ in range(300):
        if budget.held == held:
            return
        await asyncio.sleep(0.01)
    assert budget.held == held


async def test_a_response_create_whose_socket_ends_while_it_is_prepared_gives_its_bytes_back(
        make_ws: MakeWs, fake: FakeSocket, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``response.create`` holds its message of the budget (``Calls._create``) before it is
    prepared; the projection awaits (a store read, a session lock, an image fetch). When the
    socket ends meanwhile (here: the upstream closes it) the inward pump is cancelled in
    ``prepare``: the call never became a lane, ``refuse`` never ran, and the bytes stay held
    for the life of the process."""
    harness = await make_ws()
    budget = harness.app[SERVICES].budget
    preparing = asyncio.Event()
    real = websocket_calls.prepare

    async def slow_prepare(*args: Any, **kwargs: Any) -> Any:
        preparing.set()
        await asyncio.sleep(3600)  # a projection that takes its time (a slow store, a held lock)
        return await real(*args, **kwargs)

    monkeypatch.setattr(websocket_calls, "prepare", slow_prepare)

    async def close_soon(ws: web.WebSocketResponse, data: bytes) -> bool:
        async def later() -> None:
            await preparing.wait()
            await ws.close()
        asyncio.ensure_future(later())
        return True

    fake.script = close_soon
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str('{"type":"session.update","session":{}}')  # goes upstream as it came
        await asyncio.wait_for(fake.arrived.wait(), 5)
        await ws.send_str(msgspec.json.encode(create({"type": "input_text", "text": "x" * (200 * KiB)})).decode())
        await asyncio.wait_for(preparing.wait(), 5)
        assert budget.held >= 200 * KiB
        await ws.receive(timeout=5)  # the socket ends: the upstream closed it
    await settled(budget, 0)


async def test_a_resumable_upload_s_finalize_holds_the_whole_file_it_joins(
        make_harness: Callable[..., Awaitable[Harness]], upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemini's resumable finalize joins every stored part with the last chunk (``Uploads.finish``)
    and admits the result: the whole file (up to ``store.limits.max_bytes``, 20 MiB by default,
    twice over while ``earlier + last`` is joined) is in memory, but only the last chunk is held
    of the budget. A client that opens uploads and finalizes them together holds N x max_bytes
    the budget never sees."""
    from yarl import URL

    from tests.proxy.inbound.test_resumable_shared import noise_png
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    budget = harness.app[SERVICES].budget
    data = noise_png(300, 300, 1)  # ~270 KB
    size, third = len(data), len(data) // 3
    started = await harness.client.post(
        "/upload/v1beta/files", json={"file": {"displayName": "big.png"}},
        headers={"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
                 "X-Goog-Upload-Header-Content-Type": "image/png",
                 "X-Goog-Upload-Header-Content-Length": str(size), "x-goog-api-key": "k"})
    assert started.status == 200, await started.text()
    path = URL(started.headers["X-Goog-Upload-URL"]).path
    for at in (0, third):
        resp = await harness.client.post(path, data=data[at:at + third],
                                         headers={"X-Goog-Upload-Command": "upload", "X-Goog-Upload-Offset": str(at)})
        assert resp.status == 200, await resp.text()
    seen: list[int] = []
    visible = harness.app[SERVICES].visible
    real = visible.admit

    async def admit(*args: Any, **kwargs: Any) -> Any:
        seen.append(budget.held)
        return await real(*args, **kwargs)

    monkeypatch.setattr(visible, "admit", admit)
    done = await harness.client.post(path, data=data[2 * third:], headers={
        "X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": str(2 * third)})
    assert done.status == 200, await done.text()
    assert seen and seen[0] >= size, f"the finalize holds {seen[0]} bytes of the budget with {size} joined in memory"
