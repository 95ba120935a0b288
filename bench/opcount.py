"""Operation counts of the image scenario: store operations and log round trips per request (bench).

For each backend pair (``embedded``: filesystem + SQLite; ``replicated``: S3 on a SeaweedFS of
its own + PostgreSQL in a database of its own), start projectionist in front of the fake
upstream, admit the ten ~200 KB images of ``scenarios.make_images``, warm the cache, then send
``requests`` more requests of one session that references all ten. The figures are deltas of
``projectionist_store_operations_total`` and ``projectionist_log_round_trips_total`` on
``GET /metrics`` (what the backends counted where they talk to their service), per request and
per image per request, cross-checked by the services' own counters where that is cheap:
SeaweedFS's ``SeaweedFS_s3_request_total`` and PostgreSQL's ``pg_stat_database`` transactions.
``run`` returns plain dicts; ``main`` prints them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench import scenarios
from bench.targets import Peers, Processes, free_port, start_projectionist, start_upstream

PAIRS = ("embedded", "replicated")
DATABASE = "projectionist_opcount"
BUCKET = "projectionist-opcount"
_SAMPLE = re.compile(r'^(\w+)(?:\{([^}]*)\})? ([0-9.e+-]+)$')


def parse_metrics(text: str, name: str) -> Counter[str]:
    """``name``'s samples in Prometheus text, by the value of their first label ('' when none)."""
    found: Counter[str] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match[1] != name:
            continue
        label = match[2].split("=", 1)[1].strip('"') if match[2] else ""
        found[label] += int(float(match[3]))
    return found


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.text()


async def send(base: str, body: bytes, count: int, concurrency: int) -> float:
    """``count`` image requests of one session, ``concurrency`` at a time; their wall time."""
    headers = {**scenarios.JSON_HEADERS, "X-Session-Id": scenarios.IMAGES_SESSION}
    left = iter(range(count))
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=scenarios.TIMEOUT) as session:
        async def worker() -> None:
            for _ in left:
                async with session.post(base + scenarios.CHAT, data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        raise scenarios.ScenarioBroken(f"image request answered HTTP {response.status}")
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


async def pg_transactions(admin_dsn: str) -> int | None:
    """Committed plus rolled-back transactions of the bench database (None without asyncpg)."""
    import asyncpg

    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        value = await conn.fetchval("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1",
                                    DATABASE)
        return None if value is None else int(value)
    finally:
        await conn.close()


async def recreate_database(admin_dsn: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await conn.close()


def _with_database(dsn: str, database: str) -> str:
    return dsn.rsplit("/", 1)[0] + "/" + database


def measure(pair: str, requests: int, concurrency: int, workdir: Path, pg_dsn: str | None = None,
            stamp_ttl: float | None = None) -> dict[str, Any]:
    """One backend pair's figures (see the module docstring)."""
    procs = Processes(workdir)
    seaweed: Any = None
    admin_dsn = pg_dsn or os.environ.get("PROJECTIONIST_TEST_PG_DSN", "")
    weed_metrics = 0
    toml = "\n[store]\n" + (f"stamp_ttl = {stamp_ttl}\n" if stamp_ttl is not None else "")
    try:
        if pair == "replicated":
            from tests.backends import Seaweed  # the test suite's SeaweedFS runner, started by pid

            if not admin_dsn:
                raise SystemExit("the replicated pair needs --pg-dsn or PROJECTIONIST_TEST_PG_DSN")
            seaweed = Seaweed(workdir / "seaweed")
            weed_metrics = free_port()
            seaweed.extra_args = [f"-metricsPort={weed_metrics}"]
            seaweed.start()
            seaweed.create_bucket(BUCKET)
            asyncio.run(recreate_database(admin_dsn))
            toml += (f'kind = "s3"\n[store.s3]\nendpoint = "{seaweed.endpoint}"\nbucket = "{BUCKET}"\n'
                     'access_key_id = "bench"\nsecret_access_key = "bench"\n'
                     f'[log]\nkind = "postgres"\n[log.postgres]\ndsn = "{_with_database(admin_dsn, DATABASE)}"\n')
        upstream = start_upstream(procs, Peers(None))
        proxy = start_projectionist(procs, upstream, f"projectionist-{pair}", "opcount", extra_toml=toml)
        ids = asyncio.run(scenarios.admit(proxy.base, scenarios.make_images()))
        body = scenarios.refs_body(ids)
        asyncio.run(send(proxy.base, body, 2, 1))  # cold read, then one warm hit
        time.sleep(1.0)  # the warm-up's records are written
        if pair == "replicated":
            time.sleep(11.0)  # PostgreSQL flushes an idle backend's statistics within 10 s
        before = asyncio.run(_snapshot(proxy.base, weed_metrics, admin_dsn if pair == "replicated" else ""))
        wall = asyncio.run(send(proxy.base, body, requests, concurrency))
        time.sleep(1.0)  # records of the last requests are written
        after = asyncio.run(_snapshot(proxy.base, weed_metrics, ""))
        procs.stop(proxy)  # its connections close: PostgreSQL flushes their statistics
        if pair == "replicated":
            time.sleep(1.0)
            after["pg_transactions"] = asyncio.run(pg_transactions(admin_dsn))
        return _figures(pair, requests, concurrency, len(ids), before, after, wall)
    finally:
        procs.stop_all()
        if seaweed is not None:
            seaweed.stop()


async def _snapshot(base: str, weed_metrics: int, admin_dsn: str) -> dict[str, Any]:
    text = await scrape(base + "/metrics")
    found: dict[str, Any] = {
        "store": parse_metrics(text, "projectionist_store_operations_total"),
        "log": parse_metrics(text, "projectionist_log_round_trips_total"),
        "reads": parse_metrics(text, "projectionist_store_reads_total"),
    }
    if weed_metrics:
        try:
            weed = await scrape(f"http://127.0.0.1:{weed_metrics}/metrics")
            found["weed"] = sum(parse_metrics(weed, "SeaweedFS_s3_request_total").values())
        except aiohttp.ClientError:
            found["weed"] = None
    if admin_dsn:
        found["pg_transactions"] = await pg_transactions(admin_dsn)
    return found


def _figures(pair: str, requests: int, concurrency: int, images: int, before: dict[str, Any],
             after: dict[str, Any], wall: float) -> dict[str, Any]:
    store = after["store"] - before["store"]
    log = after["log"] - before["log"]
    out: dict[str, Any] = {
        "pair": pair, "requests": requests, "concurrency": concurrency, "images_per_request": images,
        "requests_per_second": round(requests / wall, 1),
        "store_ops": dict(sorted(store.items())),
        "store_ops_per_request": round(sum(store.values()) / requests, 3),
        "store_ops_per_image_per_request": round(sum(store.values()) / requests / images, 4),
        "verified_reads": sum((after["reads"] - before["reads"]).values()),
        "log_round_trips": dict(sorted(log.items())),
        "log_round_trips_per_request": round(sum(log.values()) / requests, 3),
    }
    if after.get("weed") is not None and before.get("weed") is not None:
        out["seaweedfs_s3_requests_per_request"] = round((after["weed"] - before["weed"]) / requests, 3)
    if after.get("pg_transactions") is not None and before.get("pg_transactions") is not None:
        out["pg_transactions_per_request"] = round(
            (after["pg_transactions"] - before["pg_transactions"]) / requests, 3)
        out["pg_note"] = "includes the pool's connection close at shutdown"
    return out


def run(pairs: Sequence[str] = PAIRS, requests: int = 200, concurrency: int = 1, pg_dsn: str | None = None,
        stamp_ttl: float | None = None) -> list[dict[str, Any]]:
    """The figures of each pair, in a temporary work directory removed afterwards."""
    results = []
    with tempfile.TemporaryDirectory(prefix="projectionist-opcount-") as tmp:
        for pair in pairs:
            workdir = Path(tmp) / pair
            workdir.mkdir()
            results.append(measure(pair, requests, concurrency, workdir, pg_dsn, stamp_ttl))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.opcount", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", choices=PAIRS, default=list(PAIRS))
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--pg-dsn", default=None, help="a superuser DSN (default: $PROJECTIONIST_TEST_PG_DSN)")
    parser.add_argument("--stamp-ttl", type=float, default=None, help="[store] stamp_ttl (default: the proxy's)")
    args = parser.parse_args(argv)
    for result in run(args.pairs, args.requests, args.concurrency, args.pg_dsn, args.stamp_ttl):
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
