"""Where one stored image's time goes on a cold read: each stage of the verified read and of
inlining it, timed in this process on the bench's own images (P4's breakdown).

Stages, in the order a cache-cold projected request meets them: the lane hop (event loop to a
store thread and back), reading the object and its admission record, hashing the bytes, parsing
the image header, base64, and splicing the base64 into the upstream JSON. ``read_image`` is the
real filesystem store doing the first five end to end, so the parts can be checked against the
whole. Figures are CPU microseconds per image (process time), the median of ``rounds``.
"""

from __future__ import annotations

import asyncio
import pybase64
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from projectionist.proxy.lanes import Lane
from projectionist.proxy.config import ImageLimits
from projectionist.proxy.stores.admission import header_info
from projectionist.proxy.stores.cache import Encoded
from projectionist.proxy.stores.filesystem import FilesystemStore
from projectionist.proxy.call.describe import UPSTREAM


def _per_image(run: Callable[[], Any], images: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.process_time()
        run()
        samples.append((time.process_time() - started) / images * 1e6)
    return round(statistics.median(samples), 1)


async def _lane_hops(lane: Lane, count: int) -> None:
    for _ in range(count):
        await lane.run(lambda: None)


async def _store_reads(store: FilesystemStore, ids: list[str]) -> None:
    for attachment_id in ids:
        await store.read_image(attachment_id)


def measure(pngs: list[bytes], rounds: int = 30) -> dict[str, Any]:
    """CPU microseconds per image for each stage (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="projectionist-image-costs-") as folder:
        root = Path(folder)

        async def admit_all(store: FilesystemStore) -> list[str]:
            return [(await store.admit(png, "image/png")).id for png in pngs]

        async def scenario() -> dict[str, float]:
            store = FilesystemStore(root / "store", limits=ImageLimits())
            ids = await admit_all(store)
            paths = [store._paths(i.removeprefix("sha256:")) for i in ids]  # the files read_image opens
            n = len(pngs)
            lane = Lane("bench", 1, timeout=5.0, queue_timeout=5.0)
            hop_start = time.process_time()
            for _ in range(rounds):
                await _lane_hops(lane, n)
            hop = (time.process_time() - hop_start) / (rounds * n) * 1e6
            read_start = time.process_time()
            for _ in range(rounds):
                await _store_reads(store, ids)
            whole = (time.process_time() - read_start) / (rounds * n) * 1e6
            lane.close()
            await store.close()
            encoded = [Encoded("image/png", pybase64.b64encode(png)) for png in pngs]
            body = {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": e.data_url()}} for e in encoded]}]}
            return {
                "lane hop (loop -> store thread -> loop)": round(hop, 1),
                "read object + admission record": _per_image(
                    lambda: [(data.read_bytes(), record.read_bytes()) for data, record in paths], n, rounds),
                "sha256 of the bytes": _per_image(lambda: [hashlib.sha256(p).hexdigest() for p in pngs], n, rounds),
                "image header parse": _per_image(lambda: [header_info(p) for p in pngs], n, rounds),
                "base64 encode": _per_image(lambda: [pybase64.b64encode(p) for p in pngs], n, rounds),
                "splice into the upstream JSON": _per_image(lambda: UPSTREAM.encode(body), n, rounds),
                "read_image end to end (filesystem store)": round(whole, 1),
            }

        stages = asyncio.run(scenario())
    return {"us_per_image": stages, "image_bytes": round(statistics.mean(len(p) for p in pngs)),
            "images": len(pngs), "rounds": rounds}


def lines(result: dict[str, Any]) -> list[str]:
    stages: dict[str, float] = result["us_per_image"]
    width = max(len(name) for name in stages)
    return [f"  {name:<{width}}  {value:8.1f} µs CPU per image" for name, value in stages.items()]


if __name__ == "__main__":
    from bench.scenarios import make_images

    figures = measure(make_images())
    print(msgspec.json.encode(figures).decode())
    print("\n".join(lines(figures)))


def measure_inline(pngs: list[bytes], rounds: int = 30) -> dict[str, Any]:
    """CPU microseconds per image of a body whose images the client inlined itself, the agents'
    shape, for each stage the proxy runs on it: the raw scan (finding each base64 run and cutting
    it out, the small document decoded), an identity found again (xxh3 of the run and a compare
    in place), an identity the first time (base64 decode and sha256), the record's spliced digest,
    and, only on a request that must change the body (a rejection holds for one of its images),
    the whole decode and encode of it. ``build`` is the whole of a request that sends the
    client's bytes unchanged, divided by its images."""
    from projectionist.adapters import openai_chat
    from projectionist.policy.fold import EMPTY
    from projectionist.policy.projection import Projection
    from projectionist.proxy.upstream.identity import Identities
    from projectionist.proxy.call.body import build, decode_json, digest_of, scan_body
    from projectionist.proxy.call import scan as scanning

    raw = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + pybase64.b64encode(p).decode()}}
        for p in pngs]}]})
    count = len(pngs)
    warm = Identities()
    scanned = scan_body(openai_chat, raw, warm)
    assert scanned is not None and scanned.complete and len(scanned.client) == count
    cuts = scanning.runs(raw, openai_chat.INLINE_MARKERS)
    assert cuts is not None

    async def projected(asked: Any) -> Projection:
        return Projection((), EMPTY)

    loop = asyncio.new_event_loop()

    def whole() -> None:
        loop.run_until_complete(build(openai_chat, raw, projected, describe=True, shape_unchanged=False,
                                      identities=warm))

    stages = {
        "scan (runs, small decode)": _per_image(lambda: scan_body(openai_chat, raw, warm), count, rounds),
        "identity, seen before": _per_image(lambda: [warm.of_run(raw, a, b) for a, b in cuts], count, rounds),
        "identity, first time": _per_image(lambda: [Identities().of_run(raw, a, b) for a, b in cuts], count, rounds),
        "spliced digest": _per_image(lambda: digest_of(raw, scanned, scanned.client), count, rounds),
        "whole decode + encode (body changes)": _per_image(lambda: UPSTREAM.encode(decode_json(raw)), count, rounds),
        "build, body sent unchanged": _per_image(whole, count, rounds),
    }
    loop.close()
    return {"us_per_image": stages, "body_bytes": len(raw), "rounds": rounds}
