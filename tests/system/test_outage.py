"""Database outage: PostgreSQL disappears mid-run (every connection cut, new ones refused) and
comes back. Clients get clean 503s in their wire shape, no acknowledged event is lost, and
service returns without a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.backends import PG_DSN, FaultyTcpProxy, Seaweed
from tests.conftest import Harness, replicated_backend
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]


def via(port: int) -> str:
    parts = urlsplit(PG_DSN)
    host = f"{parts.username or 'postgres'}@127.0.0.1:{port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


@pytest.fixture
async def outage(seaweed: Seaweed, make_harness: MakeHarness) -> AsyncIterator[tuple[Harness, FaultyTcpProxy, str]]:
    target = urlsplit(PG_DSN)
    proxy = FaultyTcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    async with replicated_backend(seaweed) as overrides:
        overrides["log.postgres"] = {**overrides["log.postgres"], "dsn": via(proxy.port), "timeout": 2.0}
        harness = await make_harness(**overrides)
        try:
            yield harness, proxy, overrides["log.postgres"]["schema"]
        finally:
            await proxy.close()


async def send(harness: Harness, session: str, *ids: str) -> tuple[int, Any]:
    resp = await harness.chat(session, *ids)
    return resp.status, await resp.json()


async def test_database_outage_gives_clean_503s_loses_nothing_and_recovers(
    outage: tuple[Harness, FaultyTcpProxy, str]
) -> None:
    harness, proxy, schema = outage
    acknowledged: list[str] = []  # sessions whose request returned 200 with a recorded quarantine
    statuses: list[tuple[int, str | None]] = []

    async def one(i: int) -> None:
        session = f"s{i}"
        status, body = await send(harness, session, ref_id(make_image(color=i % 200, width=3 + i // 200)))
        statuses.append((status, body.get("error", {}).get("code") if status != 200 else None))
        if status == 200:
            acknowledged.append(session)

    await asyncio.gather(*(one(i) for i in range(20)))
    assert len(acknowledged) == 20

    # the database disappears while requests are in flight
    running = [asyncio.create_task(one(i)) for i in range(20, 60)]
    await asyncio.sleep(0.01)
    proxy.cut()
    await asyncio.gather(*running)
    during = [await send(harness, f"down{i}", ref_id(make_image(color=i))) for i in range(5)]
    assert {(status, body["error"]["code"]) for status, body in during} == {(503, "LOG_UNAVAILABLE")}
    statuses += [(status, body["error"]["code"]) for status, body in during]
    assert {s for s in statuses if s[0] != 200} <= {(503, "LOG_UNAVAILABLE")}  # no 500, no other code
    plain = await harness.client.post("/v1/chat/completions", json={"model": "m", "messages": []})
    assert plain.status == 200  # requests that need no log still flow
    # an Anthropic client gets the 503 in its own wire shape (what its SDK parses)
    image = {"type": "image", "source": {"type": "url", "url": f"attachment:{ref_id(make_image(color=251))}"}}
    claude = await harness.client.post("/v1/messages", headers={"X-Session-Id": "down-claude"}, json={
        "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [image]}]})
    answer = await claude.json()
    assert claude.status == 503 and claude.headers["x-projectionist-error-code"] == "LOG_UNAVAILABLE"
    assert answer["type"] == "error" and answer["error"]["details"] == {"error_code": "LOG_UNAVAILABLE"}

    proxy.restore()
    for _ in range(50):  # the pool reconnects by itself
        status, _ = await send(harness, "back", ref_id(make_image(color=250)))
        if status == 200:
            break
        await asyncio.sleep(0.1)
    assert status == 200
    assert all([(await send(harness, f"after{i}", ref_id(make_image(color=i))))[0] == 200 for i in range(5)])

    conn = await asyncpg.connect(PG_DSN)  # straight to the database, not through the fault injector
    try:
        rows = await conn.fetch(f'SELECT session FROM "{schema}".projectionist_events WHERE type = $1',
                                "attachment/quarantine")
    finally:
        await conn.close()
    stored = {row["session"] for row in rows}
    assert set(acknowledged) <= stored, "an acknowledged quarantine was lost"
    assert {"back", *(f"after{i}" for i in range(5))} <= stored
