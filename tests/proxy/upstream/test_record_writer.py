"""The record writer gathers records for ``batch_wait`` before it writes them, so light traffic
pays one transaction for many calls; a drain (the admin API, shutdown) never waits for the
interval; a full batch goes at once; a full queue drops and counts, never blocks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from projectionist.adapters import openai_chat
from projectionist.policy.events import EventData, envelope
from projectionist.proxy.observe.metrics import Metrics
from projectionist.proxy.upstream.describe import of_raw
from projectionist.proxy.upstream.recording import CallInfo, Recording


class AppendsLog:
    """A session log that keeps each append call (one call is one transaction in a backend)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.seq: dict[str, int] = {}

    async def append(self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *,
                     durable: bool = True) -> list[Any]:
        self.calls.append((session_id, len(data)))
        start = self.seq.get(session_id, 0)
        self.seq[session_id] = start + len(data)
        return [envelope(start + i, "2026-01-01T00:00:00Z", item) for i, item in enumerate(data, 1)]


def record(recording: Recording, index: int, session: str = "s") -> None:
    raw = b'{"model": "m", "messages": []}'
    call = CallInfo(session, f"req-{index}", time.perf_counter(), "openai_chat", openai_chat, "openai", "POST",
                    "/v1/chat/completions")
    recorder = recording.start(call, raw, of_raw(raw), None)
    recorder.complete = True
    recorder._record(200, None)


def writer(batch_wait: float, queue_size: int = 10_000, batch: int = 256) -> tuple[Recording, AppendsLog]:
    log = AppendsLog()
    return Recording(log, None, "metadata", 1024, Metrics(), queue_size, batch,  # type: ignore[arg-type]
                     batch_wait=batch_wait), log


async def test_records_of_light_traffic_gather_into_one_write() -> None:
    recording, log = writer(batch_wait=0.3)
    for index in range(5):
        record(recording, index)
        await asyncio.sleep(0.01)  # calls a few milliseconds apart, as at concurrency 1
    assert log.calls == []  # nothing written yet: the writer is gathering
    await asyncio.sleep(1.0)
    assert sum(n for _, n in log.calls) == 10 and len(log.calls) <= 2  # requests, then their responses
    await recording.close()


async def test_without_an_interval_each_record_goes_as_soon_as_the_writer_is_free() -> None:
    recording, log = writer(batch_wait=0.0)
    for index in range(3):
        record(recording, index)
        await asyncio.sleep(0.01)
    assert len(log.calls) >= 3
    await recording.close()


async def test_a_drain_never_waits_for_the_interval() -> None:
    recording, log = writer(batch_wait=30.0)
    record(recording, 1)
    started = time.monotonic()
    await asyncio.wait_for(recording.drain(), 5)
    assert time.monotonic() - started < 5 and sum(n for _, n in log.calls) == 2
    await recording.close()


async def test_a_full_batch_goes_at_once() -> None:
    recording, log = writer(batch_wait=30.0, batch=8)
    for index in range(4):  # 8 records
        record(recording, index)
    await asyncio.sleep(0.2)
    assert sum(n for _, n in log.calls) >= 4  # the request records went without waiting 30 s
    await recording.close()
    assert sum(n for _, n in log.calls) == 8  # their responses waited for the next batch (their seqs)


async def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    recording, log = writer(batch_wait=30.0, queue_size=4)
    for index in range(3):  # 6 records into a queue of 4
        record(recording, index)
    assert recording.metrics.records_dropped["request"] + recording.metrics.records_dropped["response"] == 2
    await recording.close()
    assert sum(n for _, n in log.calls) == 4
