"""The cost of attributing refusals in a long session (50,000 records): what an upstream accepted
is folded incrementally per session and format, so after the first refusal reads the records
once, later refusals read only what is new."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest

from projectionist.policy.events import RefRecord, RequestRecorded, ResponseRecorded
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import BACKENDS
from tests.system.refusals.hostile import StallMeter

RECORDS = 25_000  # calls: a request and a response record each


def _id(i: int) -> str:
    return "sha256:" + hashlib.sha256(str(i).encode()).hexdigest()


async def long_session(services: Any, session: str, accepted: str) -> None:
    batch: list[Any] = []
    for i in range(RECORDS):
        refs = (RefRecord("/messages/0/content/1/image_url/url", accepted, "inlined"),)
        shape = tuple((f"/messages/{k}", _id(k)[:23]) for k in range(20))
        batch += [RequestRecorded(f"old{i}", "openai_chat", "openai_chat", "openai", "POST", "/v1/chat/completions",
                                  0, _id(i), _id(i + 1), refs, shape),
                  ResponseRecorded(f"old{i}", 0, 200, 1.0)]
        if len(batch) >= 5000:
            await services.log.append(session, None, batch, durable=False)
            batch = []


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_later_refusals_in_a_long_session_read_only_what_is_new(make_harness: Any) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    services = harness.app[SERVICES]
    good = await harness.admit(color=21)
    await long_session(services, "long", good)
    assert (await harness.chat("long", good)).status == 200
    harness.upstream.refused[good] = False  # refused now, accepted many times before: unattributed
    reads: list[int] = []
    inner_read = services.log.read

    async def counting_read(session_id: str, after_seq: int = 0) -> Any:
        events = await inner_read(session_id, after_seq)
        reads.append(len(events))
        return events

    services.log.read = counting_read
    assert (await harness.chat("long", good)).status == 400  # the first refusal reads the records once
    first = sum(reads)
    reads.clear()
    started = time.perf_counter()
    async with StallMeter() as meter:
        for _ in range(3):  # every later call of the session is refused the same way
            assert (await harness.chat("long", good)).status == 400
    elapsed = time.perf_counter() - started
    print(f"\nfirst refusal read {first} rows; 3 more: {elapsed:.2f} s, rows read {reads}, longest stall {meter.longest:.2f} s")
    assert first >= 2 * RECORDS  # the whole history, once
    # rows read, not seconds: the property is deterministic (the stall is printed for a reader)
    assert sum(reads) < 1000, f"three later refusals read {sum(reads)} log rows ({elapsed:.1f} s)"
