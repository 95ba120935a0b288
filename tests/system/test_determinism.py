"""Determinism, proven by property tests: the session log plus the content-addressed store define
every upstream request byte for byte.

Hypothesis draws random histories: requests in every wire format referencing healthy, missing,
corrupt and flaky images (one failed read, or two), each request with its own random schedule of
transient read faults, and damage, recoveries, restarts and forks (the history then continues in
the fork) between them. After every request the upstream body bytes must be identical when the
same call is

- rebuilt by ``replay`` from the log prefix and the store,
- sent again after a restart (a new app instance on the same data),
- sent in a fork made at that point, through a second app instance.

``PROJECTIONIST_PROPERTY_EXAMPLES`` bounds the number of cases (CI uses the default).
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings, strategies as st

from projectionist.policy.errors import READ_FAILED, AttachmentError
from projectionist.proxy.edge.app import create_app, open_store
from projectionist.proxy.inbound.services import ADMIN_APP
from projectionist.proxy.config import Config, load_config, with_upstreams
from projectionist.proxy.call.replay import rebuild
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import Routed
from tests.fakes import CountingStore, FakeUpstream
from tests.imaging import make_image, ref_id

EXAMPLES = int(os.environ.get("PROJECTIONIST_PROPERTY_EXAMPLES", "60"))
ADMIN = {"Authorization": "Bearer det"}
SESSION = "det"
#: The image pool: what each image is when a history starts.
KINDS = ("healthy", "healthy", "missing", "corrupt", "flaky1", "flaky2")
FORMATS = ("chat", "anthropic", "responses", "gemini")
IMAGES = [make_image(3 + i, 2 + i % 3, color=100 + i) for i in range(len(KINDS))]
IDS = [ref_id(data) for data in IMAGES]

#: A random fault schedule for one request: image index -> how many of its reads fail first
#: (READ_FAILED; 1 is healed by the retry, 2 is a retryable quarantine). Transient: it ends with
#: the request.
faults = st.dictionaries(st.integers(0, len(KINDS) - 1), st.integers(1, 2), max_size=3)
send = st.tuples(st.just("send"), st.sampled_from(FORMATS),
                 st.lists(st.integers(0, len(KINDS) - 1), min_size=1, max_size=5), faults)
step = st.one_of(
    send,
    send,  # twice: requests are what the properties are about
    st.tuples(st.just("restart")),
    st.tuples(st.just("fork")),  # the rest of the history continues in a fork made here
    st.tuples(st.just("damage"), st.integers(0, len(KINDS) - 1), st.sampled_from(["delete", "corrupt"])),
    st.tuples(st.just("recover"), st.integers(0, len(KINDS) - 1)),
)
histories = st.lists(step, min_size=2, max_size=10).filter(lambda steps: any(s[0] == "send" for s in steps))


def body_for(fmt: str, picks: list[int]) -> tuple[str, bytes]:
    """A request in ``fmt`` referencing the picked images (every reference syntax in turn)."""
    ids = [IDS[i] for i in picks]
    if fmt == "chat":
        parts: list[Any] = [{"type": "text", "text": "compare"}]
        parts += [{"type": "image_url", "image_url": {"url": f"attachment:{i}?name=img{n}.png"}} for n, i in enumerate(ids)]
        return "/v1/chat/completions", msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": parts}]})
    if fmt == "anthropic":
        blocks = [{"type": "image", "source": {"type": "file", "file_id": i} if n % 2 else {"type": "url", "url": f"attachment:{i}"}}
                  for n, i in enumerate(ids)]
        nested = {"type": "tool_result", "tool_use_id": "t1", "content": blocks[1:]}
        return "/v1/messages", msgspec.json.encode({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": [blocks[0], nested, {"type": "text", "text": "compare"}]}]})
    if fmt == "responses":
        parts = [{"type": "input_image", "file_id": i} if n % 2 else {"type": "input_image", "image_url": f"attachment:{i}"}
                 for n, i in enumerate(ids)]
        return "/v1/responses", msgspec.json.encode({"model": "m", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "compare"}, *parts[:2]]},
            {"type": "function_call_output", "call_id": "c1", "output": parts[2:]}]})
    parts = [{"fileData": {"fileUri": f"attachment:{i}", "mimeType": "image/png"}} for i in ids]
    return "/v1beta/models/g:generateContent", msgspec.json.encode({"contents": [{"role": "user", "parts": [
        parts[0], {"functionResponse": {"name": "shot", "response": {"ok": True}, "parts": parts[1:]}}]}]})


class Faults:
    """Reads counted per image across every app instance; flaky images fail their first reads,
    and a request's own fault schedule fails the next reads of the images it names."""

    def __init__(self) -> None:
        self.reads: Counter[str] = Counter()
        self.pending: Counter[str] = Counter()
        self.injected = 0

    def script(self, attachment_id: str, _: int) -> None:
        self.reads[attachment_id] += 1
        kind = KINDS[IDS.index(attachment_id)] if attachment_id in IDS else "healthy"
        failing = {"flaky1": 1, "flaky2": 2}.get(kind, 0)
        if self.reads[attachment_id] <= failing:
            raise AttachmentError(READ_FAILED, attachment_id=attachment_id)
        if self.pending[attachment_id] > 0:
            self.pending[attachment_id] -= 1
            self.injected += 1
            raise AttachmentError(READ_FAILED, attachment_id=attachment_id)


class World:
    """One history: a fake upstream, the data dir, the primary app and a second instance."""

    def __init__(self, config: Config, upstream: FakeUpstream, faults: Faults) -> None:
        self.config, self.upstream, self.faults = config, upstream, faults
        self.clients: list[Any] = []
        self.session = SESSION

    async def app(self) -> Any:
        store = CountingStore(open_store(self.config))
        store.script = self.faults.script
        app = create_app(self.config, store=store)
        proxy: TestClient[Any, Any] = TestClient(TestServer(app))
        await proxy.start_server()
        console: TestClient[Any, Any] = TestClient(TestServer(app[ADMIN_APP]))  # the console's own listener
        await console.start_server()
        client: Any = Routed(proxy, console)
        self.clients.append(client)
        return client

    async def close(self, client: Any) -> None:
        self.clients.remove(client)
        await client.admin.close()
        await client.proxy.close()

    async def send(self, client: TestClient[Any, Any], session: str, path: str, body: bytes) -> bytes:
        resp = await client.post(path, data=body, headers={"X-Session-Id": session, "Content-Type": "application/json"})
        assert resp.status == 200, await resp.text()
        await resp.read()
        return self.upstream.last.body

    def object_path(self, index: int) -> Path:
        hexd = IDS[index].removeprefix("sha256:")
        return self.config.store_path / "objects" / hexd[:2] / hexd


async def run_history(steps: list[tuple[Any, ...]], stats: Counter[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        upstream = FakeUpstream()
        upstream_server = TestServer(upstream.app())
        await upstream_server.start_server()
        upstream.url = str(upstream_server.make_url("")).rstrip("/")
        config = with_upstreams(
            # stamp_ttl 0: a damage step is noticed by the very next request, so what each call sent
            # (and its replay) follows the damage at once; with a window, a call inside it still
            # inlines the cached verified bytes, and replaying it needs bytes the damage removed
            load_config(None, **{"server.data_dir": tmp, "server.admin_token": "det", "record.mode": "full",
                                 "store.stamp_ttl": 0}),
            [(name, None, upstream.url) for name in ("openai", "anthropic", "gemini")])
        world = World(config, upstream, Faults())
        raw = open_store(config)  # the operator's own handle on the store: admission and repairs
        try:
            primary, second = await world.app(), await world.app()
            for index, kind in enumerate(KINDS):
                if kind != "missing":
                    await raw.admit(IMAGES[index])
                if kind == "corrupt":
                    world.object_path(index).write_bytes(bytes(len(IMAGES[index])))
            for n, action in enumerate(steps):
                if action[0] == "send":
                    primary = await check_send(world, primary, second, n, action[1], action[2], action[3], stats)
                elif action[0] == "restart":
                    await world.close(primary)
                    primary = await world.app()
                elif action[0] == "fork":
                    new = f"{SESSION}-{n}"
                    resp = await primary.post(f"/admin/sessions/{world.session}/fork",
                                              json={"new_session_id": new}, headers=ADMIN)
                    assert resp.status == 201
                    world.session = new
                    stats["forks"] += 1
                elif action[0] == "damage":
                    target = world.object_path(action[1])
                    if target.exists():
                        target.unlink() if action[2] == "delete" else target.write_bytes(b"\0" * 9)
                else:
                    await raw.admit(IMAGES[action[1]])  # the explicit repair, then a verified recovery
                    await primary.post(f"/admin/sessions/{world.session}/attachments/{IDS[action[1]]}/recover",
                                       headers=ADMIN)
            stats["examples"] += 1
        finally:
            for client in list(world.clients):
                await world.close(client)
            await raw.close()
            await upstream_server.close()


async def check_send(world: World, primary: TestClient[Any, Any], second: TestClient[Any, Any], n: int,
                     fmt: str, picks: list[int], schedule: dict[int, int], stats: Counter[str]) -> TestClient[Any, Any]:
    path, body = body_for(fmt, picks)
    session = world.session
    world.faults.pending.update({IDS[i]: k for i, k in schedule.items()})
    original = await world.send(primary, session, path, body)
    world.faults.pending.clear()  # the faults were transient: they end with this request
    stats["sends"] += 1
    stats["injected faults"] += world.faults.injected
    world.faults.injected = 0

    state = primary.server.app[SERVICES]  # type: ignore[union-attr]
    await state.recording.drain()  # records are written off the request path
    rebuilt = await rebuild(state.log, state.store, session)
    assert rebuilt.matches and rebuilt.body == original, f"replay differs at {rebuilt.first_difference}"

    await world.close(primary)  # restart: a new instance on the same data
    primary = await world.app()
    assert await world.send(primary, session, path, body) == original, "differs after a restart"

    fork = f"{session}-fork-{n}"
    resp = await second.post(f"/admin/sessions/{session}/fork", json={"new_session_id": fork}, headers=ADMIN)
    assert resp.status == 201
    assert await world.send(second, fork, path, body) == original, "differs in a fork via a second instance"
    stats["comparisons"] += 3
    stats["placeholders"] += original.count(b"[image unavailable:")
    return primary


def test_the_upstream_body_is_the_same_after_restart_fork_second_instance_and_replay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stats: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(histories)
    def check(steps: list[tuple[Any, ...]]) -> None:
        asyncio.run(run_history(steps, stats))

    check()
    with capsys.disabled():
        print(f"\ndeterminism: {stats['examples']} histories, {stats['sends']} requests, "
              f"{stats['injected faults']} injected read faults, {stats['forks']} mid-history forks, "
              f"{stats['comparisons']} byte comparisons, {stats['placeholders']} placeholders seen, 0 mismatches")
    assert stats["examples"] >= EXAMPLES and stats["sends"] >= EXAMPLES
    assert stats["placeholders"] > 0  # the histories did exercise unreadable images


def test_request_builders_reference_every_picked_image() -> None:
    for fmt in FORMATS:
        _, body = body_for(fmt, [0, 2, 4])
        assert all(IDS[i].encode() in body for i in (0, 2, 4)), fmt
    assert base64.b64encode(IMAGES[0])[:20] not in body_for("chat", [0])[1]
