"""Load generators: ``wrk`` (preferred) or a small aiohttp client, same result shape.

Both POST one JSON body file with fixed headers from N connections for a fixed duration and
report completed requests, failures (non-2xx/3xx or socket errors), req/s and p50/p99 latency.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

LUA = Path(__file__).resolve().parent / "post.lua"
AUTH_KEY = "sk-bench"  # also LiteLLM's master key; the others ignore it
_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


@dataclass
class LoadResult:
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float


def pick(name: str) -> str:
    """'wrk' or 'python' for ``--loadgen auto|wrk|python``."""
    if name == "auto":
        return "wrk" if shutil.which("wrk") else "python"
    if name == "wrk" and not shutil.which("wrk"):
        raise SystemExit("bench: --loadgen wrk but wrk is not installed")
    return name


def run(loadgen: str, url: str, body: Path, headers: dict[str, str], concurrency: int,
        duration: float) -> LoadResult:
    if loadgen == "wrk":
        return run_wrk(url, body, headers, concurrency, duration)
    return asyncio.run(run_python(url, body.read_bytes(), headers, concurrency, duration))


def run_wrk(url: str, body: Path, headers: dict[str, str], concurrency: int, duration: float) -> LoadResult:
    seconds = max(1, round(duration))
    env = {**os.environ, "BODY": str(body), "AUTH_KEY": AUTH_KEY,
           "HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items())}
    argv = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--latency", "--timeout", "30s", "-s", str(LUA), url]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 60,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return parse_wrk(done.stdout)


def parse_wrk(out: str) -> LoadResult:
    def latency(pct: str) -> float:
        found = re.search(rf"^\s*{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.MULTILINE)
        return float(found.group(1)) * _UNITS_MS[found.group(2)] if found else float("nan")

    requests = re.search(r"^\s*(\d+) requests in", out, re.MULTILINE)
    rps = re.search(r"^Requests/sec:\s*([\d.]+)", out, re.MULTILINE)
    if not requests or not rps:
        raise RuntimeError(f"cannot parse wrk output:\n{out}")
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses:\s*(\d+)", out))
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if socket_errors:
        errors += sum(int(n) for n in socket_errors.groups())
    return LoadResult(int(requests.group(1)), errors, float(rps.group(1)), latency("50"), latency("99"))


async def run_python(url: str, body: bytes, headers: dict[str, str], concurrency: int,
                     duration: float) -> LoadResult:
    all_headers = {"Content-Type": "application/json", "Authorization": f"Bearer {AUTH_KEY}", **headers}
    latencies: list[float] = []
    errors = 0
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        deadline = time.perf_counter() + duration

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=all_headers) as response:
                        await response.read()
                        ok = response.status < 400
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                latencies.append(time.perf_counter() - started)
                errors += not ok

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return summary(latencies, errors, elapsed)


def summary(latencies: list[float], errors: int, elapsed: float) -> LoadResult:
    """What a run of ``elapsed`` seconds measured: its count, rate and latency percentiles."""
    latencies.sort()
    return LoadResult(len(latencies), errors, len(latencies) / elapsed,
                      percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000)


def percentile(ordered: list[float], pct: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))]
