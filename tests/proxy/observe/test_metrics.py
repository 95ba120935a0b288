"""Observability: Prometheus ``/metrics`` and the ``x-projectionist-overhead-ms`` header."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from projectionist.policy.errors import READ_FAILED
from projectionist.proxy.observe.metrics import MODEL_LABELS, Metrics
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.calls import recorded_calls
from tests.conftest import Harness
from tests.fakes import FakeUpstream, fail_with
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
    assert labels <= {"route", "status", "upstream", "model", "failure", "result", "kind", "op", "le", "outcome", "what"}


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


async def test_requests_latency_and_tokens_are_labelled_by_upstream_and_model(
        make_harness: Callable[..., Awaitable[Harness]], upstream: FakeUpstream) -> None:
    harness = await make_harness(**{"upstreams.second": {"format": "openai", "url": upstream.url}})
    aid = await harness.admit(make_image(color=176))
    assert (await harness.chat("t", aid)).status == 200  # a reference: the body is decoded
    resp = await harness.client.post("/u/second/v1/chat/completions", json={"model": "m", "messages": []})
    assert resp.status == 200  # no reference: sent as it came, never decoded
    resp = await harness.client.post("/v1/messages", headers={"anthropic-version": "2023-06-01"},
                                     json={"model": "claude-x", "max_tokens": 5, "stream": True, "messages": []})
    await resp.read()

    async def no_model(request: web.Request, body: Any) -> web.StreamResponse | None:
        return web.json_response({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}})

    upstream.script = no_model  # an answer naming no model: the model the request named counts
    assert (await harness.chat("t", aid, model="named-by-request")).status == 200
    m = await scrape(harness)
    assert m['projectionist_requests_total{route="openai_chat",status="200",upstream="openai"}'] == 2
    assert m['projectionist_requests_total{route="openai_chat",status="200",upstream="second"}'] == 1
    assert m['projectionist_requests_total{route="anthropic_messages",status="200",upstream="anthropic"}'] == 1
    assert m['projectionist_requests_total{route="attachments.create",status="200",upstream=""}'] == 1
    assert m['projectionist_upstream_seconds_count{upstream="openai"}'] == 2
    assert m['projectionist_upstream_seconds_count{upstream="second"}'] == 1
    # the fake's answers say "fake-model" whatever was asked; the chat answer reports 10 in, 7 out
    tokens = {k: v for k, v in m.items() if k.startswith("projectionist_tokens_total")}
    assert tokens == {
        'projectionist_tokens_total{kind="input",model="fake-model",upstream="openai"}': 10,
        'projectionist_tokens_total{kind="output",model="fake-model",upstream="openai"}': 7,
        'projectionist_tokens_total{kind="input",model="fake-model",upstream="second"}': 10,
        'projectionist_tokens_total{kind="output",model="fake-model",upstream="second"}': 7,
        # a Messages stream: input from message_start, output from message_delta (one per chunk)
        'projectionist_tokens_total{kind="input",model="fake-model",upstream="anthropic"}': 10,
        'projectionist_tokens_total{kind="output",model="fake-model",upstream="anthropic"}': upstream.chunks,
        'projectionist_tokens_total{kind="input",model="named-by-request",upstream="openai"}': 2,
        'projectionist_tokens_total{kind="output",model="named-by-request",upstream="openai"}': 3,
    }


async def test_recorded_calls_are_metered_once_by_their_recorder(
        make_harness: Callable[..., Awaitable[Harness]]) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    for stream in (False, True):
        resp = await harness.client.post("/v1/messages", headers={"anthropic-version": "2023-06-01", "X-Session-Id": "r"},
                                         json={"model": "c", "max_tokens": 5, "stream": stream, "messages": []})
        await resp.read()
    m = await scrape(harness)
    assert m['projectionist_tokens_total{kind="input",model="fake-model",upstream="anthropic"}'] == 20
    assert m['projectionist_tokens_total{kind="output",model="fake-model",upstream="anthropic"}'] == \
        7 + harness.upstream.chunks
    recorded = [outcome["usage"] for _, outcome in recorded_calls(await harness.events("r")) if outcome]
    assert recorded == [{"input_tokens": 10, "output_tokens": 7}, {"input_tokens": 10, "output_tokens": 5}]


def test_model_labels_are_capped_and_normalised() -> None:
    metrics = Metrics()
    assert metrics.model_label(None) == metrics.model_label("") == "unknown"
    assert metrics.model_label("gpt-4o") == "gpt-4o"
    assert metrics.model_label("accounts/fireworks/models/llama-v3p1:free") == "accounts/fireworks/models/llama-v3p1:free"
    assert metrics.model_label("has space") == metrics.model_label('quo"te') == metrics.model_label("x" * 101) == "other"
    for i in range(MODEL_LABELS):
        metrics.model_label(f"model-{i}")
    assert metrics.model_label("one-too-many") == "other"
    assert metrics.model_label("gpt-4o") == "gpt-4o"  # admitted before the cap: stays itself
    metrics.used("openai", "one-more", 4, 0)
    assert metrics.tokens == {("openai", "other", "input"): 4}


async def test_the_registry_carries_the_process_platform_and_gc_collectors(harness: Harness) -> None:
    m = await scrape(harness)
    assert m["process_resident_memory_bytes"] > 0 and m["process_cpu_seconds_total"] >= 0
    assert any(name.startswith("python_info{") for name in m)
    assert any(name.startswith("python_gc_objects_collected_total{") for name in m)
