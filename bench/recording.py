"""``python -m bench.recording ROOT [ROOT ...]``: recording's own CPU per call, in process (bench).

Each ``ROOT`` holds a checkout named ``projectionist`` (as for ``bench.ab``). Bursts of ``B``
(env, 200) P1-shaped calls are recorded (``Recording.start``, a 1 KB answer metered,
``finished``), then the writer drains them as one batch into a real ``SqliteLog``; the figure is
the CPU a call (``process_time``: the lane thread too) minus the same calls metered only, the
best of ``R`` (env, 5) runs of ``N`` (env, 20000) calls. No sockets and no other process: on a
noisy shared machine it tells recording's own cost apart where ``bench.ab`` rounds spread by a
fifth. It leaves out what only a served call has (the GIL passed between the loop and the lane
while requests arrive).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench.scenarios import text_body

#: The answer each call meters: a Chat Completions body with its usage, as the fake upstream's.
ANSWER: Final = (b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
                 b'"content":"hello there"},"finish_reason":"stop"}],'
                 b'"usage":{"prompt_tokens":10,"completion_tokens":7,"total_tokens":17}}')
#: The headers a P1 call goes upstream with (its key among them: recording leaves it out).
HEADERS: Final = (("Content-Type", "application/json"), ("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate"),
                  ("User-Agent", "Python/3.11 aiohttp/3.14.5"), ("Authorization", "Bearer sk-bench"))


async def _run(p: Any, calls: int, batch: int, record: bool) -> float:
    """CPU a call (µs) of ``calls`` calls in bursts of ``batch``, recorded or metered only."""
    from multidict import CIMultiDict
    raw, headers = text_body(), CIMultiDict(HEADERS)
    with tempfile.TemporaryDirectory() as folder:
        log = p.CachedLog(p.SqliteLog(Path(folder) / "s.db"))
        recording = p.Recording(log, None, "metadata", 1 << 20, p.Metrics(), 100_000, batch_wait=0.0, hold=30.0)

        async def burst(base: int) -> None:
            for i in range(batch):
                if record:
                    info = p.CallInfo("bench-text", f"r{base + i}", time.perf_counter(), "openai_chat", p.openai_chat,
                                      "openai", "POST", "/v1/chat/completions", p.headers_of(headers))
                    meter = recording.start(info, raw, p.of_unchanged(raw), None)
                else:
                    meter = p.Meter()
                meter.begin("application/json")
                meter.chunk(ANSWER)
                completed = meter.body_complete(200)
                if completed is not None:  # a checkout from before 5cb2b2e: a coroutine
                    await completed
                meter.reported(p.openai_chat)
                if record:
                    meter.finished(200)
            await recording.drain()  # the burst's records: one batch

        for warm in range(5):
            await burst(warm * batch)
        started = time.process_time()
        for j in range(calls // batch):
            await burst(1_000_000 + j * batch)
        spent = (time.process_time() - started) / calls * 1e6
        await recording.close()
        await log.close()
    return spent


def _one(root: str) -> None:
    """The figure for the checkout under ``root``, imported from there (one process per root)."""
    sys.path.insert(0, root)
    from types import SimpleNamespace

    from projectionist.adapters import openai_chat
    from projectionist.proxy.call.describe import of_unchanged
    from projectionist.proxy.call.outgoing import recordable_headers
    from projectionist.proxy.call.prepare import Outgoing
    from projectionist.proxy.call.record import CallInfo, Meter, Recording
    from projectionist.proxy.observe.metrics import Metrics
    from projectionist.proxy.sessionlog.cached import CachedLog
    from projectionist.proxy.sessionlog.sqlite import SqliteLog
    # what a call holds of the headers it sent: since 2026-12-07 the headers themselves (the writer
    # keeps the recordable ones), before that the recordable ones
    sent = "sent" in Outgoing.__dataclass_fields__
    headers_of = (lambda headers: tuple(headers.items())) if sent else recordable_headers
    p = SimpleNamespace(openai_chat=openai_chat, of_unchanged=of_unchanged, headers_of=headers_of,
                        CallInfo=CallInfo, Meter=Meter, Recording=Recording, Metrics=Metrics, CachedLog=CachedLog,
                        SqliteLog=SqliteLog)
    calls, batch, runs = int(os.environ.get("N", "20000")), int(os.environ.get("B", "200")), int(os.environ.get("R", "5"))
    recorded = min(asyncio.run(_run(p, calls, batch, True)) for _ in range(runs))
    metered = min(asyncio.run(_run(p, calls, batch, False)) for _ in range(runs))
    print(f"{root}: recording {recorded - metered:.2f} us/call (with {recorded:.2f}, metered only {metered:.2f})")


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        _one(sys.argv[2])
        return
    for root in sys.argv[1:]:  # side by side: each tree in a process of its own, one after another
        subprocess.run([sys.executable, "-m", "bench.recording", "--one", root], check=True)


if __name__ == "__main__":
    main()
