"""Observability: Prometheus ``/metrics`` and the ``x-projectionist-overhead-ms`` header."""

from __future__ import annotations

import re


from projectionist.policy.errors import READ_FAILED
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness
from tests.fakes import fail_with
from tests.imaging import make_image, ref_id


async def scrape(harness: Harness) -> dict[str, float]:
    resp = await harness.client.get("/metrics")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    samples: dict[str, float] = {}
    for line in (await resp.text()).splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


async def test_metrics_count_requests_reads_quarantines_retries_and_cache_hits(harness: Harness) -> None:
    healthy = await harness.admit(make_image(color=170))
    flaky = await harness.admit(make_image(color=171))
    gone = ref_id(make_image(color=172))
    await harness.chat("secret-session-xyz", healthy, gone)
    await harness.chat("secret-session-xyz", healthy, gone)  # healthy from cache, gone from the log
    harness.store.script = fail_with(READ_FAILED, times=2)
    await harness.chat("secret-session-xyz", flaky)
    m = await scrape(harness)
    assert m['projectionist_requests_total{route="openai_chat",status="200",upstream="openai"}'] == 3
    assert m['projectionist_quarantines_total{failure="not_found"}'] == 1
    assert m['projectionist_quarantines_total{failure="read_failed"}'] == 1
    assert m['projectionist_store_reads_total{result="ok"}'] == 1
    assert m['projectionist_store_reads_total{result="not_found"}'] == 1
    assert m['projectionist_store_reads_total{result="read_failed"}'] == 2
    assert m["projectionist_store_retries_total"] == 1
    assert m["projectionist_cache_hits_total"] == 1
    assert m["projectionist_projection_seconds_count"] == 3
    assert m['projectionist_upstream_seconds_count{upstream="openai"}'] == 3
    assert m["projectionist_in_flight_requests"] == 0


async def test_session_and_attachment_ids_never_become_labels(harness: Harness) -> None:
    gone = ref_id(make_image(color=173))
    await harness.chat("secret-session-xyz", gone)
    text = await (await harness.client.get("/metrics")).text()
    assert "secret-session-xyz" not in text and gone[7:] not in text
    ours = "\n".join(line for line in text.splitlines() if line.startswith("projectionist_"))
    labels = set(re.findall(r"(\w+)=\"", ours))
    assert labels <= {"route", "status", "upstream", "model", "failure", "result", "kind", "op", "le", "outcome"}


async def test_a_quarantined_reference_costs_zero_store_reads(harness: Harness) -> None:
    missing = [ref_id(make_image(color=180 + i)) for i in range(10)]
    await harness.chat("q", *missing)  # quarantines all ten
    before = (await scrape(harness))['projectionist_store_reads_total{result="not_found"}']
    reads, stamps = harness.store.total, sum(harness.store.stamp_checks.values())
    for _ in range(5):
        assert (await harness.chat("q", *missing)).status == 200
    after = await scrape(harness)
    assert (harness.store.total, sum(harness.store.stamp_checks.values())) == (reads, stamps)
    assert after['projectionist_store_reads_total{result="not_found"}'] == before == 10


async def test_relayed_responses_carry_the_proxy_overhead(harness: Harness) -> None:
    aid = await harness.admit(make_image(color=174))
    for stream in (False, True):
        resp = await harness.chat("o", aid, stream=stream)
        overhead = float(resp.headers["x-projectionist-overhead-ms"])
        assert 0 <= overhead < 5000
        await resp.read()
    plain = await harness.client.get("/v1/models")  # pass-through too
    assert float(plain.headers["x-projectionist-overhead-ms"]) >= 0
