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
import asyncio, sys, time, tempfile, os
from pathlib import Path


def _main() -> None:
    import subprocess
    for root in sys.argv[1:]:
        subprocess.run([sys.executable, __file__, "--one", root], check=True)


if __name__ == "__main__" and sys.argv[1:2] != ["--one"]:
    _main()
    raise SystemExit(0)
sys.path.insert(0, sys.argv[2])
from projectionist.proxy.call.record import Recording, CallInfo, Meter
from projectionist.proxy.call.describe import of_unchanged
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.sessionlog.cached import CachedLog
from projectionist.proxy.observe.metrics import Metrics
from projectionist.proxy.call.outgoing import recordable_headers
from projectionist.adapters import openai_chat
from multidict import CIMultiDict
import json
raw = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 950}]}).encode()
resp = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":7,"total_tokens":17}}'
hdrs = CIMultiDict([("Content-Type", "application/json"), ("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate"), ("User-Agent", "Python/3.11 aiohttp/3.14.5"), ("Authorization", "Bearer sk-bench")])
B = int(os.environ.get("B", "200"))
async def run(n, record):
    d = tempfile.mkdtemp()
    log = CachedLog(SqliteLog(Path(d) / "s.db"))
    rec = Recording(log, None, "metadata", 1 << 20, Metrics(), 100000, batch_wait=0.0, hold=30.0)
    async def burst(base):
        for i in range(B):
            if record:
                info = CallInfo("bench-text", f"r{base+i}", time.perf_counter(), "openai_chat", openai_chat, "openai", "POST", "/v1/chat/completions", recordable_headers(hdrs))
                r = rec.start(info, raw, of_unchanged(raw), None)
            else:
                r = Meter()
            r.begin("application/json"); r.chunk(resp); await r.body_complete(200); r.reported(openai_chat)
            if record: r.finished(200)
        await rec.drain()
    for j in range(5): await burst(j * B)
    t0 = time.process_time()
    for j in range(n // B): await burst(10**6 + j * B)
    t = (time.process_time() - t0) / n * 1e6
    await rec.close(); await log.close()
    return t
n = int(os.environ.get("N", "20000"))
with_, without = [], []
for _ in range(int(os.environ.get("R", "5"))):
    with_.append(asyncio.run(run(n, True))); without.append(asyncio.run(run(n, False)))
print(f"{sys.argv[2]}: recording {min(with_) - min(without):.2f} us/call (with {min(with_):.2f}, metered only {min(without):.2f})")
