"""``/readyz``: 200 only while the session log and the store answer within ``ready_timeout``, else
503 naming which one, fast, while ``/healthz`` (liveness) stays 200; a hung backend gets one probe
in flight however often it is asked; the path is the proxy's own (never forwarded) and quiet."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.stores.filesystem import FilesystemStore
from tests.backends import BACKENDS
from tests.conftest import Harness
from tests.imaging import make_image
from tests.system.test_hung_storage import unhang, until

MakeHarness = Callable[..., Awaitable[Harness]]
READY = {"status": "ready", "checks": {"log": "ok", "store": "ok"}}


async def readyz(harness: Harness) -> tuple[int, Any, float]:
    started = time.monotonic()
    resp = await harness.client.get("/readyz")
    return resp.status, await resp.json(), time.monotonic() - started


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_ready_when_both_backends_answer(harness: Harness) -> None:
    status, body, _ = await readyz(harness)
    assert (status, body) == (200, READY)
    assert (await harness.client.get("/healthz")).status == 200


def hold_a_stat(harness: Harness, attachment_id: str) -> Path:
    """Make ``stat`` of an object hang: its admission record becomes a FIFO nobody writes."""
    record = harness.path_of(attachment_id).with_suffix(".json")
    record.unlink()
    os.mkfifo(record)
    return record


async def test_a_hung_store_is_unready_within_the_timeout_with_one_probe_in_flight(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"server.ready_timeout": 0.4,
                                    "store.lanes": {"stamps": 2, "queue_timeout": 30.0, "stamp_timeout": 60.0,
                                                    "slow_after": 60.0}})
    store = harness.store.inner
    assert isinstance(store, FilesystemStore)
    ids = [await harness.admit(make_image(color=c)) for c in (1, 2)]
    fifos = [hold_a_stat(harness, aid) for aid in ids]
    held = [asyncio.create_task(harness.store.stat(aid)) for aid in ids]  # the disk holds every stamp thread
    try:
        await until(lambda: store.stamp_lane.in_use == 2, "both stamp threads held")
        stats = store.ops.snapshot()["stat"]
        with capture_logs() as logs:
            for _ in range(3):
                status, body, took = await readyz(harness)
                assert (status, body) == (503, {"status": "unready", "checks": {"log": "ok", "store": "timeout"}})
                assert took < 2.0  # the timeout (0.4 s), not the hung call's
                assert (await harness.client.get("/healthz")).status == 200  # liveness never waits on a backend
        changes = [e for e in logs if e["event"] == "readiness_changed"]
        assert changes == [{"event": "readiness_changed", "log_level": "warning", "ready": False,
                            "failing": {"store": "timeout"}}]  # one line per change, not per probe
    finally:
        for fifo in fifos:
            unhang(fifo)
    await asyncio.gather(*held)
    await until(lambda: store.stamp_lane.in_use == 0, "the stamp lane free again")
    assert store.ops.snapshot()["stat"] == stats + 1  # three checks, one probe (queued behind the hung stats)
    status, body, _ = await readyz(harness)
    assert (status, body) == (200, READY)


@pytest.fixture
def hung_log_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every SQLite read hangs (a disk that stops answering) until the event is set."""
    released = threading.Event()
    real = SqliteLog._call

    def call(self: SqliteLog, job: Any, deadline: float, op: str) -> Any:
        if op in ("ping", "read", "read_state"):
            released.wait(30)
        return real(self, job, deadline, op)

    monkeypatch.setattr(SqliteLog, "_call", call)
    try:
        yield released
    finally:
        released.set()


async def test_a_hung_log_is_unready_and_healthz_stays_live(make_harness: MakeHarness,
                                                            hung_log_reads: threading.Event) -> None:
    harness = await make_harness(**{"server.ready_timeout": 0.3, "log.busy_timeout": 5.0})
    status, body, took = await readyz(harness)
    assert (status, body) == (503, {"status": "unready", "checks": {"log": "timeout", "store": "ok"}})
    assert took < 2.0
    assert (await harness.client.get("/healthz")).status == 200
    hung_log_reads.set()
    await until(lambda: not harness.app[SERVICES].log.inner._reads.in_use, "the read lane free")  # type: ignore[attr-defined]
    status, body, _ = await readyz(harness)
    assert (status, body) == (200, READY)


async def test_a_failing_store_names_its_code(make_harness: MakeHarness) -> None:
    harness = await make_harness()
    objects = harness.store.inner.root / "objects"  # type: ignore[attr-defined]
    objects.rename(objects.with_name("moved"))
    status, body, _ = await readyz(harness)
    assert (status, body) == (503, {"status": "unready", "checks": {"log": "ok", "store": "STORE_UNAVAILABLE"}})
    objects.with_name("moved").rename(objects)
    assert (await readyz(harness))[:2] == (200, READY)


async def test_readyz_is_owned_open_and_quiet(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"server.client_tokens_env": "READYZ_TEST_TOKENS"})
    os.environ["READYZ_TEST_TOKENS"] = "ct-secret"
    try:
        guarded = await make_harness(**{"server.client_tokens_env": "READYZ_TEST_TOKENS"})
    finally:
        del os.environ["READYZ_TEST_TOKENS"]
    assert (await readyz(guarded))[:2] == (200, READY)  # open to probes, like /healthz
    metrics = harness.app[SERVICES].metrics
    with capture_logs() as logs:
        assert (await readyz(harness))[:2] == (200, READY)
    assert [e for e in logs if e["event"] == "request"] == [] and metrics.in_flight == 0
    for method, path, status in (("POST", "/readyz", 405), ("GET", "/READYZ", 404), ("GET", "/readyz;x", 404),
                                 ("GET", "/readyz/x", 404), ("GET", "/%72eadyz", 200)):
        resp = await harness.client.request(method, path, headers={"Authorization": "Bearer sk-x"})
        assert resp.status == status, (method, path, await resp.text())
    assert harness.upstream.received == []


async def test_a_store_whose_warm_up_fails_leaves_the_proxy_up_and_unready(make_harness: MakeHarness) -> None:
    # The start-up warm-up (the S3 client built before the first request) is a saving, not a
    # check: a store it cannot warm (here an endpoint without a scheme, which botocore refuses
    # when it builds the client) must not stop the process; readiness names it, as it did before.
    harness = await make_harness(**{"store.kind": "s3", "store.s3": {"endpoint": "minio:9000", "bucket": "b"}})
    status, body, _ = await readyz(harness)
    assert status == 503 and body["checks"]["log"] == "ok" and body["checks"]["store"] != "ok"
    assert (await harness.client.get("/healthz")).status == 200
