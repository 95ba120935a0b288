"""The long-session scenario: the first request of a 100,000-event session on a fresh process.

``long_session(procs, upstream, token)`` builds, in a fresh data dir on the default backends
(filesystem store, SQLite log), one session of ``events`` events as a proxy writes them: request
and response records with some quarantines and recoveries among them, appended through the
proxy's own ``CachedLog``. Then, on ``rounds`` freshly started projectionist processes per mode
(``_measure``), it times the first request in that session against the p50 of requests in a
fresh session on the same process, and reads the server's RSS before and after it. ``python -m bench.long_session``
runs it alone against the built-in fake upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import scenarios
from bench.scenarios import CHAT, JSON_HEADERS, ScenarioBroken
from bench.targets import Peers, Proc, Processes, memory_mb, start_projectionist, start_upstream

LONG_SESSION = "bench-long"
EVENTS = 100_000
#: One state event (a quarantine, or a recovery) per this many events; the rest are records.
STATE_EVERY = 100
#: Ids that come and go in the long session's history (quarantined, some recovered later).
HISTORY_IDS = 200
IMAGES = 2  # admitted images each measured request inlines (small ones: the fold is what we time)
MISSING = 2  # references that are quarantined in the long session (placeholders, no store read)
SAMPLES = 20
WARM_UP = 5


def _bodies(ids: list[str]) -> bytes:
    return scenarios.refs_body(ids[:IMAGES] + scenarios.quarantined_ids(MISSING))


def _records(seq: int, count: int, ids: list[str]) -> list[Any]:
    """``count`` request/response records as the proxy writes them (about 1 KB a pair)."""
    from projectionist.policy.events import RefRecord, RequestRecorded, ResponseRecorded

    out: list[Any] = []
    for index in range(seq, seq + count):
        if index % 2 == 0:
            refs = tuple(RefRecord(f"/messages/{m}/content/1", ids[m % len(ids)], "inlined") for m in range(4))
            shape = tuple((f"/messages/{m}", f"{index * 31 + m:016x}") for m in range(12))
            out.append(RequestRecorded(f"req-{index}", "openai_chat", "openai_chat", "openai", "POST", CHAT,
                                       index, "sha256:" + f"{index:064x}", "sha256:" + f"{index + 1:064x}",
                                       refs, shape))
        else:
            out.append(ResponseRecorded(f"req-{index - 1}", index, 200, 12.5,
                                        {"prompt_tokens": 1200 + index % 97, "completion_tokens": 64}))
    return out


async def build(data_dir: Path, events: int, admitted: list[str]) -> dict[str, int]:
    """Write the long session into ``data_dir``'s SQLite log through the proxy's ``CachedLog``
    (so it holds whatever that version writes along: checkpoints, from this change on)."""
    from projectionist.policy.events import Quarantine, Recovered
    from projectionist.proxy.sessionlog.cached import CachedLog
    from projectionist.proxy.sessionlog.sqlite import SqliteLog

    history = [scenarios.image_id(f"bench-long-history-{i}".encode()) for i in range(HISTORY_IDS)]
    log = CachedLog(SqliteLog(data_dir / "sessions.sqlite3"))
    try:
        seq = state_events = 0

        async def state(data: Any) -> None:
            nonlocal seq, state_events
            cached = log.state(LONG_SESSION)
            seq = (await log.append(LONG_SESSION, cached.last_seq if cached else 0, [data], durable=False))[-1].seq
            state_events += 1

        while seq < events - MISSING:
            batch = min(STATE_EVERY - 1, events - MISSING - seq - 1)
            if batch > 0:
                seq = (await log.append(LONG_SESSION, None, _records(seq + 1, batch, admitted), durable=False))[-1].seq
            aid = history[state_events % HISTORY_IDS]
            await state(Recovered(aid, 70, "image/png", 1, 1) if state_events % 4 == 3
                        else Quarantine(aid, "not_found", False, name=f"old-{state_events}.png"))
        for aid in scenarios.quarantined_ids(MISSING):  # what the measured request refers to
            await state(Quarantine(aid, "not_found", False))
    finally:
        await log.close()
    with sqlite3.connect(data_dir / "sessions.sqlite3") as conn:
        kinds = dict(conn.execute("SELECT type, count(*) FROM events WHERE session = ? GROUP BY type",
                                  (LONG_SESSION,)).fetchall())
    return {"events": sum(kinds.values()), "state_events": state_events, **kinds}


async def _post(http: aiohttp.ClientSession, url: str, body: bytes, session: str) -> float:
    started = time.perf_counter()
    async with http.post(url, data=body, headers={**JSON_HEADERS, "X-Session-Id": session}) as response:
        payload = await response.read()
        if response.status != 200 or not payload:
            raise ScenarioBroken(f"POST {url} ({session}): HTTP {response.status}: {payload[:300]!r}")
    return (time.perf_counter() - started) * 1000


async def _measure(proc: Proc, body: bytes, mode: str) -> dict[str, Any]:
    """One fresh process: the measured first request (``mode``), then ``SAMPLES`` in a fresh session.

    ``first_of_process``: the long session's request is the process's very first; ``control``:
    a fresh session's is, so what any first request of a process costs (connections, lazy
    imports, the first store reads) shows apart from the long session; ``after_warm_up``:
    ``WARM_UP`` requests with the same body in another session first (a process's first few
    requests all pay for something: connections each worker thread opens, first reads), so only
    the long session's cold fold remains."""
    url = proc.base + CHAT
    async with aiohttp.ClientSession(timeout=scenarios.TIMEOUT) as http:
        async with http.get(proc.base + "/healthz") as response:  # the client's connection, not the proxy's work
            await response.read()
        if mode == "after_warm_up":
            warm = "bench-warm-" + secrets.token_hex(4)
            for _ in range(WARM_UP):
                await _post(http, url, body, warm)
        session = "bench-control-" + secrets.token_hex(4) if mode == "control" else LONG_SESSION
        before = memory_mb(proc.pid)
        first = await _post(http, url, body, session)
        after = memory_mb(proc.pid)
        again = await _post(http, url, body, session)
        fresh_session = "bench-fresh-" + secrets.token_hex(4)
        fresh = [await _post(http, url, body, fresh_session) for _ in range(SAMPLES)]
    p50 = statistics.median(fresh)
    return {"first_ms": round(first, 2), "second_ms": round(again, 2), "fresh_p50_ms": round(p50, 2),
            "fresh_first_ms": round(fresh[0], 2), "ratio": round(first / p50, 2),
            "rss_before_mb": round(before.get("VmRSS", 0), 1), "rss_after_mb": round(after.get("VmRSS", 0), 1),
            "peak_mb": round(after.get("VmHWM", 0), 1)}


MODES = ("first_of_process", "control", "after_warm_up")


def long_session(procs: Processes, upstream: Proc, token: str, events: int = EVENTS, rounds: int = 3,
                 modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """Build the session, then measure ``rounds`` fresh processes in each of ``MODES``. Medians
    per mode, and every round."""
    name = "projectionist-long"
    builder = start_projectionist(procs, upstream, name, token)  # admits the images, then stops
    try:
        admitted = asyncio.run(scenarios.admit(builder.base, scenarios.make_images(IMAGES, side=16)))
    finally:
        procs.stop(builder)
    data_dir = procs.workdir / name / "data"
    started = time.perf_counter()
    built = asyncio.run(build(data_dir, events, admitted))
    built["build_s"] = round(time.perf_counter() - started, 1)
    built["log_mb"] = round(sum(p.stat().st_size for p in data_dir.glob("sessions.sqlite3*")) / 2**20, 1)
    body = _bodies(admitted)
    out: dict[str, Any] = {"session": built}
    for mode in modes:
        runs = []
        for _ in range(rounds):
            proc = start_projectionist(procs, upstream, name, token)
            try:
                runs.append(asyncio.run(_measure(proc, body, mode)))
            finally:
                procs.stop(proc)
        out[mode] = {"median": {key: statistics.median(r[key] for r in runs) for key in runs[0]}, "runs": runs}
        shown = out[mode]["median"]
        print(f"  long-session {mode:<17} first {shown['first_ms']:8.2f} ms  second {shown['second_ms']:6.2f} ms  "
              f"fresh-session p50 {shown['fresh_p50_ms']:6.2f} ms  ratio {shown['ratio']:6.2f}  "
              f"RSS {shown['rss_before_mb']:.1f} -> {shown['rss_after_mb']:.1f} MB (peak {shown['peak_mb']:.1f})",
              flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.long_session", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="projectionist-long-"))
    procs = Processes(workdir, args.loop)
    try:
        upstream = start_upstream(procs, Peers(None))
        result = long_session(procs, upstream, secrets.token_hex(16), args.events, args.rounds,
                              tuple(args.modes))
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result["session"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
