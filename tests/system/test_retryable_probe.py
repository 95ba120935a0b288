"""A retryable quarantine is retried: once ``retryable_probe_after`` has passed, the next request
that meets the image reads it once more and, if it verifies, lifts the quarantine (one
``attachment/recovered`` with ``automatic: true``, also under concurrency and across two app
instances) and already carries the image; a probe that fails appends nothing and the next one
waits another full period. Restart and replay rebuild the same bytes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from projectionist.policy.errors import READ_FAILED
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.call.replay import rebuild
from tests.backends import backend_on_both  # noqa: F401  (every test here on both backends)
from tests.conftest import Harness
from tests.fakes import fail_with
from tests.imaging import make_image

MakeHarness = Callable[..., Awaitable[Harness]]
PERIOD = 0.5


def image_parts(harness: Harness) -> list[str]:
    return [p["type"] for p in harness.upstream.last.json()["messages"][0]["content"][1:]]


async def quarantine_retryably(harness: Harness, session: str) -> str:
    aid = await harness.admit(make_image(color=77))
    harness.store.script = fail_with(READ_FAILED, times=2)  # the read and its one retry fail
    assert (await harness.chat(session, aid)).status == 200
    harness.store.script = None
    [event] = [e for e in await harness.events(session) if e["type"] == "attachment/quarantine"]
    assert event["data"] == {"attachment_id": aid, "failure": "read_failed", "retryable": True}
    return aid


async def test_a_due_probe_that_verifies_lifts_the_quarantine_once_and_the_request_carries_the_image(
        make_harness: MakeHarness, make_config: Callable[..., Any]) -> None:
    config = make_config(**{"policy.retryable_probe_after": PERIOD, "record.mode": "full"})
    one, two = await make_harness(config), await make_harness(config)
    aid = await quarantine_retryably(one, "s")
    assert (await one.chat("s", aid)).status == 200 and image_parts(one) == ["text"]  # not due yet
    reads = one.store.reads[aid]
    assert reads == 2  # a quarantined reference is not read before its probe is due
    await asyncio.sleep(PERIOD + 0.1)
    responses = await asyncio.gather(*(h.chat("s", aid) for h in (one, two) for _ in range(5)))
    assert [r.status for r in responses] == [200] * 10
    assert all(p == ["image_url"] for p in [image_parts(one), image_parts(two)])
    events = [e for e in await one.events("s") if e["type"].startswith("attachment/")]
    assert [e["type"] for e in events] == ["attachment/quarantine", "attachment/recovered"]
    assert events[1]["data"]["automatic"] is True and events[1]["data"]["attachment_id"] == aid
    lifted = one.app[SERVICES].metrics.automatic_recoveries + two.app[SERVICES].metrics.automatic_recoveries
    assert lifted == 1
    # replay of a call that carried the image again rebuilds it byte for byte
    services = one.app[SERVICES]
    rebuilt = await rebuild(services.log, services.store, "s")
    assert rebuilt.matches and rebuilt.body in {h.upstream.last.body for h in (one, two)}


async def test_a_probe_that_fails_appends_nothing_and_the_next_waits_a_full_period(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"policy.retryable_probe_after": PERIOD})
    aid = await quarantine_retryably(harness, "p")
    await asyncio.sleep(PERIOD + 0.1)
    harness.store.script = fail_with(READ_FAILED)
    assert (await harness.chat("p", aid)).status == 200 and image_parts(harness) == ["text"]
    probed = harness.store.reads[aid]
    assert probed == 3  # the probe: one read, no retry
    assert (await harness.chat("p", aid)).status == 200
    assert harness.store.reads[aid] == probed  # within the period after a failed probe: no read
    assert [e["type"] for e in await harness.events("p")] == ["attachment/quarantine"]


async def test_not_found_is_never_probed(make_harness: MakeHarness) -> None:
    from tests.imaging import ref_id

    harness = await make_harness(**{"policy.retryable_probe_after": 0.05})
    gone = ref_id(make_image(color=78))
    assert (await harness.chat("n", gone)).status == 200
    await asyncio.sleep(0.2)
    await harness.admit(make_image(color=78))  # the bytes came back, but only an operator may say so
    assert (await harness.chat("n", gone)).status == 200 and image_parts(harness) == ["text"]
    assert harness.store.reads[gone] == 1
