"""Many replicas: two ``projectionist serve`` OS processes sharing one PostgreSQL schema and one
S3 bucket (real SeaweedFS), in front of one recording fake upstream."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.backends import Seaweed, free_port
from tests.calls import recorded_calls, state_kinds
from tests.conftest import replicated_backend
from tests.fakes import FakeUpstream
from tests.imaging import make_image, ref_id
from tests.paths import ROOT

TOKEN = "replica-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def toml_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value).lower() if isinstance(value, bool) else str(value)


def write_config(path: Path, overrides: dict[str, Any], upstream_url: str) -> None:
    """The replicas' shared config file, as a user would write it."""
    lines = ['[server]', f'admin_token = {toml_value(TOKEN)}', "",
             "[store]", 'kind = "s3"', "", "[store.s3]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in overrides["store.s3"].items()]
    lines += ["", "[log]", 'kind = "postgres"', "", "[log.postgres]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in overrides["log.postgres"].items()]
    lines += ["", "[upstreams.openai]", 'format = "openai"', f"url = {toml_value(upstream_url)}", ""]
    path.write_text("\n".join(lines))


class Replica:
    def __init__(self, config: Path, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        admin = free_port()
        self.admin_url = f"http://127.0.0.1:{admin}"  # the console's own listener
        self.args = [sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--config", str(config),
                     "--port", str(self.port), "--data-dir", str(data_dir), "--admin-listen", f"127.0.0.1:{admin}"]
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, http: aiohttp.ClientSession) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.args, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        for _ in range(150):
            try:
                async with http.get(f"{self.url}/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
        raise RuntimeError("replica did not come up")

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()


@pytest.fixture
async def replicas(
    seaweed: Seaweed, upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[tuple[Replica, Replica, aiohttp.ClientSession]]:
    async with replicated_backend(seaweed) as overrides, aiohttp.ClientSession() as http:
        config = tmp_path / "replicas.toml"
        write_config(config, overrides, upstream.url)
        pair = Replica(config, tmp_path / "a"), Replica(config, tmp_path / "b")
        try:
            await asyncio.gather(*(r.start(http) for r in pair))
            yield pair[0], pair[1], http
        finally:
            await asyncio.gather(*(r.stop() for r in pair))


async def chat(http: aiohttp.ClientSession, replica: Replica, session: str, *ids: str) -> tuple[int, Any]:
    parts = [{"type": "image_url", "image_url": {"url": f"attachment:{i}"}} for i in ids]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    async with http.post(f"{replica.url}/v1/chat/completions", json=body, headers={"X-Session-Id": session}) as resp:
        return resp.status, await resp.json()


async def events(http: aiohttp.ClientSession, replica: Replica, session: str, *, records: bool = False
                 ) -> list[dict[str, Any]]:
    """The session's events; without ``records``, only the quarantine and recovery transitions."""
    async with http.get(f"{replica.admin_url}/admin/sessions/{session}/events", headers=ADMIN) as resp:
        body = await resp.json()
        assert resp.status == 200, body
        found: list[dict[str, Any]] = body["events"]
        return [e for e in found if records or not e["type"].endswith("/recorded")]


async def admit(http: aiohttp.ClientSession, replica: Replica, data: bytes) -> str:
    async with http.post(f"{replica.url}/v1/attachments", data=data, headers={"Content-Type": "image/png"}) as resp:
        assert resp.status == 200
        return str((await resp.json())["id"])


async def test_two_hundred_concurrent_requests_across_two_replicas_make_one_event(
    replicas: tuple[Replica, Replica, aiohttp.ClientSession], upstream: FakeUpstream
) -> None:
    a, b, http = replicas
    missing = ref_id(make_image(color=150))
    started = time.perf_counter()
    results = await asyncio.gather(*(chat(http, (a, b)[i % 2], "race", missing) for i in range(200)))
    elapsed = time.perf_counter() - started
    found = await events(http, b, "race")
    print(f"\nreplica race: requests sent={len(results)} quarantine events={len(found)} seconds={elapsed:.2f}")
    assert [status for status, _ in results] == [200] * 200
    assert [(e["seq"], e["type"], e["data"]["attachment_id"]) for e in found] == [
        (1, "attachment/quarantine", missing)]
    recorded = await events(http, a, "race", records=True)
    assert Counter(state_kinds(recorded)) == {"attachment/quarantine": 1, "request/recorded": 200}
    assert [outcome and outcome["status"] for _, outcome in recorded_calls(recorded)] == [200] * 200
    assert len({r.body for r in upstream.received}) == 1  # every replica projected the same bytes


async def notices(http: aiohttp.ClientSession, replica: Replica) -> int:
    """State-change notices the replica's log watch received (``/metrics``)."""
    async with http.get(f"{replica.url}/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("projectionist_log_state_notices_total "):
                return int(float(line.split()[1]))
    raise AssertionError("no projectionist_log_state_notices_total in /metrics")


async def test_recovery_through_one_replica_is_seen_by_the_other_once_its_notice_arrives(
    replicas: tuple[Replica, Replica, aiohttp.ClientSession], upstream: FakeUpstream
) -> None:
    a, b, http = replicas
    data = make_image(color=151)
    aid = ref_id(data)
    assert (await chat(http, b, "heal", aid))[0] == 200  # B quarantines it (not admitted yet)
    assert upstream.last.json()["messages"][0]["content"][0]["type"] == "text"
    assert await admit(http, a, data) == aid
    seen = await notices(http, b)
    async with http.post(f"{a.admin_url}/admin/sessions/heal/attachments/{aid}/recover", headers=ADMIN) as resp:
        assert resp.status == 200 and (await resp.json())["recovered"] is True
    for _ in range(250):  # the notice is sent at A's commit; B acts on it when it arrives (milliseconds)
        if await notices(http, b) > seen:
            break
        await asyncio.sleep(0.02)
    assert (await chat(http, b, "heal", aid))[0] == 200  # B cached the quarantine; it must see the recovery
    assert upstream.last.json()["messages"][0]["content"][0]["type"] == "image_url"
    assert [e["type"] for e in await events(http, b, "heal")] == ["attachment/quarantine", "attachment/recovered"]


async def test_fork_through_one_replica_gives_byte_identical_bodies_through_the_other(
    replicas: tuple[Replica, Replica, aiohttp.ClientSession], upstream: FakeUpstream
) -> None:
    a, b, http = replicas
    healthy = await admit(http, a, make_image(color=152))
    missing = ref_id(make_image(color=153))
    await chat(http, a, "parent", healthy, missing, healthy)
    original = upstream.last.body
    async with http.post(f"{a.admin_url}/admin/sessions/parent/fork", json={"new_session_id": "child"}, headers=ADMIN) as resp:
        assert resp.status == 201
    await chat(http, b, "child", healthy, missing, healthy)
    assert upstream.last.body == original
    await chat(http, b, "parent", healthy, missing, healthy)
    assert upstream.last.body == original
    assert os.environ.get("PROJECTIONIST_PG_DSN") is None  # the replicas took the DSN from the config file


async def test_an_image_refused_through_both_replicas_is_one_rejected_quarantine(
    replicas: tuple[Replica, Replica, aiohttp.ClientSession], upstream: FakeUpstream
) -> None:
    a, b, http = replicas
    bad = await admit(http, a, make_image(color=154))
    upstream.refused[bad] = False
    results = await asyncio.gather(*(chat(http, (a, b)[i % 2], "refused", bad) for i in range(40)))
    assert [status for status, _ in results] == [200] * 40
    found = await events(http, a, "refused")
    assert [(e["type"], e["data"]["format"]) for e in found] == [("attachment/rejected", "openai")]
    assert upstream.refusals <= 40  # each client request cost at most one extra call
    assert upstream.last.json()["messages"][0]["content"][0]["type"] == "text"
