"""Storage that hangs instead of failing never spreads: while reads of some objects block (a FIFO
at an object path; an S3 endpoint that never answers), healthy images are never quarantined,
requests that do not touch the hung objects answer while the hung ones still wait, a saturated
store answers 503 STORE_BUSY with nothing recorded, and SIGTERM still ends the process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from projectionist.proxy.inbound.services import SERVICES
from tests.backends import free_port_pair
from tests.conftest import Harness
from tests.imaging import make_image
from tests.paths import ROOT

MakeHarness = Callable[..., Awaitable[Harness]]
LANES = {"reads": 4, "stamps": 2, "writes": 2, "queue_timeout": 0.3}


def hang_with_a_fifo(harness: Harness, attachment_id: str) -> Path:
    path = harness.path_of(attachment_id)
    path.unlink()
    os.mkfifo(path)
    return path


def unhang(fifo: Path) -> None:
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def chat(*ids: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": f"attachment:{i}"}} for i in ids]
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}]}


async def send(harness: Harness, session: str, *ids: str) -> tuple[int, Any, dict[str, str]]:
    resp = await harness.client.post("/v1/chat/completions", json=chat(*ids), headers={"X-Session-Id": session})
    return resp.status, await resp.json(), dict(resp.headers)


async def quarantined(harness: Harness, session: str) -> set[str]:
    return {e["data"]["attachment_id"] for e in await harness.events(session) if e["type"] == "attachment/quarantine"}


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_hung_fifo_reads_never_spread_to_healthy_images(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"store.read_timeout": 60.0, "store.lanes": LANES})
    reads = harness.store.inner.reads  # type: ignore[attr-defined]
    cached, uncached, spare = [await harness.admit(make_image(color=c)) for c in (1, 2, 3)]
    hung = [await harness.admit(make_image(color=10 + i)) for i in range(4)]
    assert (await send(harness, "warm", cached))[0] == 200  # now in the verified cache
    fifos = [hang_with_a_fifo(harness, aid) for aid in hung]
    try:
        stuck = [asyncio.create_task(send(harness, f"hung-{i}", aid)) for i, aid in enumerate(hung[:3])]
        await until(lambda: reads.in_use == 3, "three hung reads")
        # a client that gives up and reconnects, eight times, on one hung object: one read in flight
        for _ in range(8):
            storm = asyncio.create_task(send(harness, "hung-0", hung[0]))
            await asyncio.sleep(0.05)
            storm.cancel()
        await asyncio.sleep(0.1)
        assert reads.in_use == 3

        # requests that touch no hung object answer now, while the hung ones still wait
        status, body, _ = await send(harness, "warm", cached)
        assert status == 200 and not any(s.done() for s in stuck)
        status, _, _ = await send(harness, "fresh", uncached)
        assert status == 200
        upload = await harness.client.post("/v1/attachments", data=make_image(color=20),
                                           headers={"Content-Type": "image/png"})
        assert upload.status == 200 and (await harness.client.get("/healthz")).status == 200
        assert harness.upstream.last.json()["messages"][0]["content"][1]["type"] == "image_url"

        # the fourth hung object fills the read lane: a new read is refused, not failed
        fourth = asyncio.create_task(send(harness, "hung-3", hung[3]))
        await until(lambda: reads.in_use == 4, "four hung reads")
        status, body, headers = await send(harness, "saturated", spare)
        assert status == 503 and body["error"]["code"] == "STORE_BUSY" and headers["Retry-After"]
        assert await harness.events("saturated") == []  # never started: no fact about the object
        assert not any(s.done() for s in [*stuck, fourth])
    finally:
        for fifo in fifos:
            unhang(fifo)
    await asyncio.gather(*stuck, fourth)
    for session in ("warm", "fresh", "saturated"):
        assert await quarantined(harness, session) == set()
    assert harness.app[SERVICES].metrics.store_reads.get("ok", 0) >= 2


HUNG = 32


async def test_thirty_two_hung_objects_cost_only_themselves(make_harness: MakeHarness) -> None:
    """k hung objects hold k threads at most (a retry of a stuck read takes none), and the read
    lane's places stay for what works: with 32 objects hung, other sessions' healthy images are
    still read and inlined."""
    harness = await make_harness(**{"store.read_timeout": 0.5,
                                    "store.lanes": {**LANES, "reads": 8, "queue_timeout": 2.0}})
    reads = harness.store.inner.reads  # type: ignore[attr-defined]
    healthy = [await harness.admit(make_image(color=200 + i)) for i in range(4)]
    hung = [await harness.admit(make_image(color=100 + i)) for i in range(HUNG)]
    fifos = [hang_with_a_fifo(harness, aid) for aid in hung]
    try:
        answers = await asyncio.gather(*(send(harness, f"hung-{i}", aid) for i, aid in enumerate(hung)))
        # each read timed out, its retry failed at once: a retryable quarantine and the placeholder
        assert [status for status, _, _ in answers] == [200] * HUNG
        assert reads.stuck == HUNG and reads.in_use == 0  # one thread each, none of the eight places
        for i, aid in enumerate(hung[:4]):
            assert await quarantined(harness, f"hung-{i}") == {aid}
        for n, aid in enumerate(healthy):  # other sessions: read, verified and inlined
            status, _, _ = await send(harness, f"healthy-{n}", aid)
            assert status == 200
            part = harness.upstream.last.json()["messages"][0]["content"][1]
            assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
            assert await quarantined(harness, f"healthy-{n}") == set()
    finally:
        for fifo in fifos:
            unhang(fifo)
    await until(lambda: reads.stuck == 0, "the stuck threads come back")


async def test_one_request_whose_eight_images_hang_leaves_the_read_lane_to_everyone_else(
        make_harness: MakeHarness) -> None:
    """Eight hung images in one request, as many as the read lane's places and its parallel
    reads: once slow (``slow_after``) each gives its place back, so other sessions' healthy cold
    images are read and inlined while that request still waits out its ``read_timeout``."""
    harness = await make_harness(**{"store.read_timeout": 30.0, "policy.parallel_reads": 8,
                                    "store.lanes": {**LANES, "reads": 8, "queue_timeout": 2.0, "slow_after": 0.2}})
    reads = harness.store.inner.reads  # type: ignore[attr-defined]
    healthy = [await harness.admit(make_image(color=230 + i)) for i in range(6)]
    hung = [await harness.admit(make_image(color=240 + i)) for i in range(8)]
    fifos = [hang_with_a_fifo(harness, aid) for aid in hung]
    waiting = asyncio.create_task(send(harness, "eight-hung", *hung))
    try:
        await until(lambda: reads.stuck == 8, "the eight reads are slow")
        assert reads.in_use == 0
        for n, aid in enumerate(healthy):
            status, body, _ = await send(harness, f"cold-{n}", aid)
            assert status == 200, body
            part = harness.upstream.last.json()["messages"][0]["content"][1]
            assert part["type"] == "image_url", part
        assert not waiting.done()  # the hung request is still reading: nothing was decided for it
    finally:
        for fifo in fifos:
            unhang(fifo)
        await asyncio.gather(waiting, return_exceptions=True)
    await until(lambda: reads.stuck == 0, "the slow threads come back")


async def test_with_tenants_a_hung_object_is_a_failed_read_never_not_found(
        make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grant lookup behind a tenant's reference reads the grant alone: an object whose file
    hangs (a FIFO), in a process that never read it, is the retryable ``read_failed`` of its own
    read, not a ``not_found`` said by a look at the file's type."""
    monkeypatch.setenv("PROJECTIONIST_TENANT_TOKENS", "alice:tok-a")
    first = await make_harness()
    aid = await admit_as(first, {"Authorization": "Bearer tok-a"}, make_image(color=250))
    fresh = await make_harness(**{"store.read_timeout": 0.3, "store.lanes": {**LANES, "slow_after": 0.1}})
    fifo = hang_with_a_fifo(fresh, aid)
    try:
        resp = await fresh.client.post("/v1/chat/completions", json=chat(aid),
                                       headers={"Authorization": "Bearer tok-a", "X-Session-Id": "t"})
        assert resp.status == 200, await resp.text()
        [event] = await fresh.events("alice~t")
        assert (event["data"]["failure"], event["data"]["retryable"]) == ("read_failed", True)
    finally:
        unhang(fifo)


async def admit_as(harness: Harness, headers: dict[str, str], data: bytes) -> str:
    resp = await harness.client.post("/v1/attachments", data=data, headers={**headers, "Content-Type": "image/png"})
    assert resp.status == 200, await resp.text()
    return str((await resp.json())["id"])


class HangingS3:
    """A loopback HTTP proxy in front of an S3 endpoint that never answers requests for some keys
    (they hang, connection open), or for every key once ``all_hang`` is set. One request per
    connection (``Connection: close`` is added), so each request is looked at."""

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("http://").partition(":")
        self.target = (host, int(port))
        self.hang: set[str] = set()
        self.all_hang = False
        self.hanging = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b" ", 2)[1].decode()
            if self.all_hang or any(key in target for key in self.hang):
                self.hanging += 1
                await asyncio.Event().wait()  # accepted, never answered
            lines = [line for line in head.split(b"\r\n") if line and not line.lower().startswith(b"connection:")]
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            up_writer.write(b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n")

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                with contextlib.suppress(OSError):
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                with contextlib.suppress(OSError):
                    dst.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def hanging_s3(seaweed: Any) -> AsyncIterator[HangingS3]:
    proxy = HangingS3(seaweed.endpoint)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.mark.parametrize("backend", ["replicated"], indirect=True)
async def test_an_s3_endpoint_that_never_answers_never_spreads(
        make_harness: MakeHarness, backend_overrides: dict[str, Any], hanging_s3: HangingS3) -> None:
    s3 = {**backend_overrides["store.s3"], "endpoint": hanging_s3.url}
    harness = await make_harness(**{"store.s3": s3, "store.read_timeout": 4.0, "store.lanes": LANES})
    reads = harness.store.inner.reads  # type: ignore[attr-defined]
    cached, uncached, spare = [await harness.admit(make_image(color=c)) for c in (31, 32, 33)]
    hung = [await harness.admit(make_image(color=40 + i)) for i in range(4)]
    assert (await send(harness, "warm", cached))[0] == 200
    hanging_s3.hang = {aid[len("sha256:"):] for aid in hung}
    stuck = [asyncio.create_task(send(harness, f"hung-{i}", aid)) for i, aid in enumerate(hung[:3])]
    await until(lambda: hanging_s3.hanging == 3, "three hung GETs")
    assert (await send(harness, "warm", cached))[0] == 200
    assert (await send(harness, "fresh", uncached))[0] == 200
    assert not any(s.done() for s in stuck)
    fourth = asyncio.create_task(send(harness, "hung-3", hung[3]))
    await until(lambda: hanging_s3.hanging == 4, "four hung GETs")
    status, body, _ = await send(harness, "saturated", spare)
    assert status == 503 and body["error"]["code"] == "STORE_BUSY"
    assert await harness.events("saturated") == []
    for task in [*stuck, fourth]:
        task.cancel()
    await asyncio.gather(*stuck, fourth, return_exceptions=True)
    for session in ("warm", "fresh", "saturated", "hung-0", "hung-1", "hung-2", "hung-3"):
        assert await quarantined(harness, session) == set()  # cancelled reads record nothing

    # the hung reads nobody waits for any more run to their own timeout, then free their places
    await until(lambda: reads._room._value == reads.size, "the abandoned reads time out")
    # the whole endpoint stops answering: each read that starts times out as READ_FAILED (its own
    # read was attempted); the proxy itself keeps answering
    hanging_s3.all_hang = True
    reads.timeout = 0.3
    status, body, _ = await send(harness, "outage", spare)
    assert status == 200 and body["choices"]
    assert await quarantined(harness, "outage") == {spare}
    assert (await harness.client.get("/healthz")).status == 200


async def test_sigterm_ends_the_process_within_its_grace_even_with_hung_reads(tmp_path: Path) -> None:
    port, data = free_port_pair(), tmp_path / "data"  # and its console on port + 1
    config = tmp_path / "c.toml"
    config.write_text('[server]\nshutdown_grace = 2.0\n[store]\nread_timeout = 600.0\n')
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--config", str(config), "--port", str(port),
        "--data-dir", str(data), "--upstream", "openai=http://127.0.0.1:9", cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    fifos: list[Path] = []
    try:
        assert msgspec.json.decode(await asyncio.wait_for(proc.stderr.readline(), 30))["event"] == "listening"
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            ids = []
            for color in range(3):
                async with http.post(f"{base}/v1/attachments", data=make_image(color=50 + color),
                                     headers={"Content-Type": "image/png"}) as resp:
                    ids.append((await resp.json())["id"])
            for aid in ids:
                hexdigest = aid[len("sha256:"):]
                path = data / "attachments" / "objects" / hexdigest[:2] / hexdigest
                path.unlink()
                os.mkfifo(path)
                fifos.append(path)
            hung = [asyncio.create_task(http.post(f"{base}/v1/chat/completions", json=chat(aid),
                                                  headers={"X-Session-Id": f"s{i}"})) for i, aid in enumerate(ids)]
            await asyncio.sleep(0.5)
            assert not any(h.done() for h in hung)
            signalled = asyncio.get_running_loop().time()
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 15)
            # within its 2 s grace (and a margin for a busy machine); the blocked threads hold nothing
            assert asyncio.get_running_loop().time() - signalled < 3.5
            for h in hung:
                h.cancel()
            await asyncio.gather(*hung, return_exceptions=True)
        assert proc.returncode is not None
    finally:
        for fifo in fifos:
            unhang(fifo)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_client_that_gives_up_and_comes_back_never_fills_the_read_lane(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"store.read_timeout": 60.0, "store.lanes": LANES})
    reads = harness.store.inner.reads  # type: ignore[attr-defined]
    stuck, healthy = [await harness.admit(make_image(color=c)) for c in (60, 61)]
    fifo = hang_with_a_fifo(harness, stuck)
    try:
        for _ in range(6):  # impatient: gives up after 0.3 s and tries again
            attempt = asyncio.create_task(send(harness, "impatient", stuck))
            await asyncio.sleep(0.3)
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)
        # every attempt joined the one read still blocked, which gave its place back once slow
        assert (reads.in_use, reads.stuck) == (0, 1)
        assert (await send(harness, "other", healthy))[0] == 200
        assert await harness.events("impatient") == []
    finally:
        unhang(fifo)


async def test_a_due_probe_of_a_still_hung_image_keeps_the_placeholder_and_answers(make_harness: MakeHarness) -> None:
    from projectionist.policy.errors import READ_FAILED
    from tests.fakes import fail_with

    harness = await make_harness(**{"store.read_timeout": 60.0, "store.lanes": LANES,
                                    "policy.retryable_probe_after": 0.2, "policy.probe_wait": 0.3})
    reads = harness.store.inner.reads  # type: ignore[attr-defined]
    flaky = await harness.admit(make_image(color=62))
    harness.store.script = fail_with(READ_FAILED, times=2)
    assert (await send(harness, "probe", flaky))[0] == 200  # a retryable quarantine
    harness.store.script = None
    fifo = hang_with_a_fifo(harness, flaky)
    try:
        for _ in range(4):  # four periods: each probe finds the read still hung
            await asyncio.sleep(0.25)
            status, body, _ = await send(harness, "probe", flaky)
            assert status == 200
            assert harness.upstream.last.json()["messages"][0]["content"][1]["type"] == "text"
        assert (reads.in_use, reads.stuck) == (0, 1)  # one shared read, not one more stuck thread per probe
        assert [e["type"] for e in await harness.events("probe")] == ["attachment/quarantine"]
    finally:
        unhang(fifo)
