"""Only a read that ran out of time is a failed read (issue 41, item 3). A client that gives up on
a request whose image read hangs leaves the read running, blocked in the OS; the next request for
that image joins it and waits, up to ``read_timeout`` from its own start, instead of failing at
once because an earlier call for the object is still stuck. Eight requests, each abandoned before
``read_timeout``, record nothing; a request that waits past it still gets its retryable
quarantine; and the hung object costs one thread throughout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from tests.conftest import Harness
from tests.imaging import make_image
from tests.system.test_hung_storage import LANES, hang_with_a_fifo, quarantined, send, unhang

MakeHarness = Callable[..., Awaitable[Harness]]
READ_TIMEOUT = 0.8


async def test_requests_abandoned_before_the_read_timeout_record_nothing(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"store.read_timeout": READ_TIMEOUT, "store.lanes": LANES})
    reads = harness.store.inner.reads  # type: ignore[attr-defined]
    hung = await harness.admit(make_image(color=70))
    fifo = hang_with_a_fifo(harness, hung)
    try:
        for _ in range(8):  # each client gives up after 0.3 s, well within the read timeout, then comes back
            attempt = asyncio.create_task(send(harness, "impatient", hung))
            await asyncio.sleep(0.3)
            assert not attempt.done(), "a request concluded before its own read timeout"
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)
        assert await harness.events("impatient") == []
        assert reads.stuck == 1  # one read blocked in the OS, joined by every later request

        # a client that waits: its read ran past the timeout while it waited, so it is a failed read
        started = time.monotonic()
        status, _, _ = await send(harness, "patient", hung)
        waited = time.monotonic() - started
        assert status == 200 and harness.upstream.last.json()["messages"][0]["content"][1]["type"] == "text"
        assert waited >= READ_TIMEOUT
        events = await harness.events("patient")
        assert [(e["type"], e["data"]["failure"], e["data"]["retryable"]) for e in events] == \
            [("attachment/quarantine", "read_failed", True)]
        assert await quarantined(harness, "impatient") == set() and reads.stuck == 1
    finally:
        unhang(fifo)


async def test_a_request_that_waits_out_a_hung_read_is_not_made_to_wait_again(make_harness: MakeHarness) -> None:
    """Its immediate retry (a READ_FAILED gets one) would join the read it waited out: it fails at
    once instead, so the request answers after one read timeout, not two."""
    harness = await make_harness(**{"store.read_timeout": READ_TIMEOUT, "store.lanes": LANES})
    hung = await harness.admit(make_image(color=71))
    fifo = hang_with_a_fifo(harness, hung)
    try:
        started = time.monotonic()
        status, _, _ = await send(harness, "once", hung)
        waited = time.monotonic() - started
        assert status == 200 and READ_TIMEOUT <= waited < 1.6 * READ_TIMEOUT, waited
        assert await quarantined(harness, "once") == {hung}
    finally:
        unhang(fifo)
