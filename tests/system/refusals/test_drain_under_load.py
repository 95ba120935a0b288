"""A refused call waits only for its own session's queued records (at most ``SETTLE_MAX``), never
for the whole app's record backlog: under steady traffic on other sessions it still finishes
promptly ("records are evidence, not state: a request never waits for one")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from projectionist.policy.events import RequestRecorded
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.call.record import _Pending


class SlowRecords:
    """The session log, with record appends taking 50 ms (a busy disk or database)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append(self, session_id: str, expected_seq: Any, data: Any, *, durable: bool = True) -> Any:
        if not durable:
            await asyncio.sleep(0.05)
        return await self.inner.append(session_id, expected_seq, data, durable=durable)


@contextlib.asynccontextmanager
async def other_sessions_busy(services: Any) -> AsyncIterator[None]:
    """Other sessions' calls, one record every 10 ms, into a log whose record appends take 50 ms."""
    services.recording.log = SlowRecords(services.recording.log)

    async def traffic() -> None:
        for i in range(100_000):
            record = RequestRecorded(f"bg{i}", "openai_chat", "openai_chat", "openai", "POST", "/v1/chat/completions",
                                     0, "sha256:" + "0" * 64, "sha256:" + "0" * 64)
            services.recording._put(_Pending(f"busy-{i % 50}", f"bg{i}", record))
            await asyncio.sleep(0.01)

    background = asyncio.create_task(traffic())
    try:
        await asyncio.sleep(0.2)
        yield
    finally:
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background


async def test_a_refused_call_does_not_wait_for_other_sessions_records(make_harness: Any) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    bad = await harness.admit(color=31)
    harness.upstream.refused[bad] = False
    async with other_sessions_busy(harness.app[SERVICES]):
        resp = await asyncio.wait_for(harness.chat("victim", bad), 5.0)
        assert resp.status == 200


async def test_control_the_same_traffic_leaves_an_accepted_call_alone(make_harness: Any) -> None:
    """With no refusal the same traffic costs a call nothing."""
    harness = await make_harness(**{"record.mode": "metadata"})
    good = await harness.admit(color=32)
    async with other_sessions_busy(harness.app[SERVICES]):
        resp = await asyncio.wait_for(harness.chat("calm", good), 5.0)
        assert resp.status == 200
