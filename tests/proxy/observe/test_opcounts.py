"""Store operations and log round trips, counted by the backends themselves, for a known request
sequence on both backend pairs (filesystem + SQLite, S3 + PostgreSQL), read from ``GET /metrics``."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import BACKENDS, Harness
from tests.imaging import make_image

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
_SAMPLE = re.compile(r'^(projectionist_\w+)_total\{op="(\w+)"\} ([0-9.e+]+)$', re.M)


#: SQLite's watch polls every half second in these tests (its default 25 ms would have a test on a
#: loaded machine race its own poller), so a request within the poll's reach reads no state.
WATCH_INTERVAL = 0.5


async def counts(harness: Harness) -> tuple[Counter[str], Counter[str]]:
    """(store operations, log round trips) by op, as scraped; the SQLite watch's periodic polls
    are no request's and left out."""
    resp = await harness.client.get("/metrics")
    text = await resp.text()
    store: Counter[str] = Counter()
    log: Counter[str] = Counter()
    for name, op, value in _SAMPLE.findall(text):
        if name == "projectionist_store_operations":
            store[op] += int(float(value))
        elif name == "projectionist_log_round_trips" and op != "watch":
            log[op] += int(float(value))
    return store, log


async def listening(harness: Harness, backend: str) -> None:
    """Wait until the log's state-change watch vouches: PostgreSQL's listens (it connects at
    start-up), SQLite's has polled since it was first asked."""
    watch = harness.app[SERVICES].log.watch
    assert watch is not None
    for _ in range(100):
        if watch.healthy and (backend != "embedded" or watch.current()):
            return
        watch.mark()  # asking wakes a poller
        await asyncio.sleep(0.05)
    raise AssertionError("the log's watch never vouched")


async def test_a_cold_then_a_warm_request_cost_what_the_backends_say(
        make_harness: Callable[..., Awaitable[Harness]], backend: str) -> None:
    harness = await make_harness(**{"store.stamp_ttl": 0, "log.watch_interval": WATCH_INTERVAL})
    await listening(harness, backend)
    aid = await harness.admit(make_image(color=180))
    store0, log0 = await counts(harness)
    await harness.chat("n", aid)  # cold: one verified read; the session's log read from the start
    store1, log1 = await counts(harness)
    await harness.chat("n", aid)  # warm: one stamp check; the log's tail
    store2, log2 = await counts(harness)
    if backend == "embedded":
        assert store1 - store0 == Counter(stat=2, read=2)  # the stamp (data, record), then both files
        assert store2 - store1 == Counter(stat=2)
    else:
        assert store1 - store0 == Counter(get=1)  # the stamp comes with the GET
        assert store2 - store1 == Counter(head=1)
    # the cold request: a state read of the session (the last seq and the state events in one
    # statement or one job; no reset statement after every pooled job), and one of the tenant's
    # refusals (``call.refusals``), once per process: later requests find its fold cached
    assert log1 - log0 == Counter(read_state=2)
    # the warm one: no notice came (PostgreSQL), no poll named the session (SQLite): the cached fold stands
    assert log2 - log1 == Counter()


async def test_within_the_stamp_window_a_request_costs_no_store_op_and_at_most_one_log_round_trip(
        make_harness: Callable[..., Awaitable[Harness]], backend: str) -> None:
    harness = await make_harness(**{"store.stamp_ttl": 60, "log.watch_interval": WATCH_INTERVAL})
    await listening(harness, backend)
    ids = [await harness.admit(make_image(color=181 + i)) for i in range(3)]
    await harness.chat("w", *ids)
    store0, log0 = await counts(harness)
    for _ in range(5):
        await harness.chat("w", *ids)
    store1, log1 = await counts(harness)
    assert store1 - store0 == Counter()
    assert log1 - log0 == Counter()
    assert harness.app[SERVICES].metrics.cache_hits == 15
