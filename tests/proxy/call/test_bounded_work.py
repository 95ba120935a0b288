"""One request's work is bounded: too many distinct references are refused before any read, and a
request's reads in flight at once are capped."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec

from tests.conftest import Harness
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]


async def test_more_distinct_references_than_the_cap_are_refused_before_any_read(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"policy.max_references": 50})
    ids = ["sha256:" + f"{i:064x}" for i in range(51)]
    parts = [{"type": "image_url", "image_url": {"url": f"attachment:{i}"}} for i in ids]
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": parts}]})
    resp = await harness.client.post("/v1/chat/completions", data=body,
                                     headers={"X-Session-Id": "big", "Content-Type": "application/json"})
    assert resp.status == 400 and resp.headers["x-projectionist-error-code"] == "TOO_MANY_REFERENCES"
    assert harness.store.total == 0 and await harness.events("big") == [] and harness.upstream.received == []
    # the cap counts distinct ids: the same one many times is one reference
    same = [{"type": "image_url", "image_url": {"url": f"attachment:{ids[0]}"}}] * 500
    resp = await harness.client.post("/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": same}]}, headers={"X-Session-Id": "big"})
    assert resp.status == 200 and harness.store.total == 1


async def test_a_requests_reads_in_flight_are_capped(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"policy.parallel_reads": 3})
    ids = [await harness.admit(make_image(color=c)) for c in range(10)]
    in_flight = peak = 0

    async def slow(attachment_id: str, n: int) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1

    harness.store.script = slow
    assert (await harness.chat("capped", *ids)).status == 200
    assert peak == 3 and sum(harness.store.reads[i] for i in ids) == 10
    assert ref_id(make_image(color=0)) == ids[0]


async def test_the_reported_100000_reference_body_is_refused_at_once(harness: Harness) -> None:
    """The 13 MB body that once took 103 s, 1.7 GB and recorded 100,000 quarantines: refused with
    the default cap before any read or record (reports its time)."""
    import time

    parts = [{"type": "image_url", "image_url": {"url": f"attachment:sha256:{i:064x}"}} for i in range(100_000)]
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": parts}]})
    started = time.perf_counter()
    resp = await harness.client.post("/v1/chat/completions", data=body,
                                     headers={"X-Session-Id": "huge", "Content-Type": "application/json"})
    took = time.perf_counter() - started
    assert resp.status == 400 and resp.headers["x-projectionist-error-code"] == "TOO_MANY_REFERENCES"
    assert harness.store.total == 0 and await harness.events("huge") == []
    print(f"\n100,000-reference body ({len(body) / 1e6:.1f} MB): refused in {took * 1000:.0f} ms")


async def test_one_image_referenced_many_times_cannot_amplify_the_upstream_body(make_harness: MakeHarness) -> None:
    import io
    import random

    from PIL import Image

    harness = await make_harness(**{"policy.max_projected_bytes": 200_000})
    noise = io.BytesIO()
    Image.frombytes("RGB", (200, 200), random.Random(5).randbytes(200 * 200 * 3)).save(noise, format="PNG")
    aid = await harness.admit(noise.getvalue())  # ~120 KB: one copy fits, 150 do not
    one = {"type": "image_url", "image_url": {"url": f"attachment:{aid}"}}
    ok = await harness.client.post("/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": [one]}]}, headers={"X-Session-Id": "amp"})
    assert ok.status == 200
    resp = await harness.client.post("/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": [one] * 150}]}, headers={"X-Session-Id": "amp"})
    assert resp.status == 413 and resp.headers["x-projectionist-error-code"] == "PROJECTED_TOO_LARGE"
    assert len(harness.upstream.received) == 1
