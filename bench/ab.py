"""``python -m bench.ab OLD NEW``: projectionist's own CPU per request, two trees side by side.

``OLD`` and ``NEW`` are folders that each hold a checkout named ``projectionist`` (``git clone``
it into ``OLD/projectionist`` and check out the revision). Both serve on their defaults in front
of one fake upstream; ``--rounds`` rounds of ``--seconds`` of 1 KB text at c=16 alternate which
goes first, and each process's CPU time is read from ``/proc`` per round. The figure is the
ratio of the medians of CPU per request, new ÷ old: it tells a change in the proxy's own cost
apart from a busy machine, which the ratios to the bare proxy cannot do on their own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import load, scenarios
from bench.targets import CLK_TCK, Peers, Processes, cpu_ticks, free_pair, start_upstream


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--session", action="store_true", help="send X-Session-Id (the text path with a session)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    procs = Processes(work)
    servers: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    try:
        upstream = start_upstream(procs, Peers(None))
        for name, root in (("old", args.old), ("new", args.new)):
            port, home = free_pair(), work / name
            home.mkdir()
            (home / "p.toml").write_text(f'[upstreams.openai]\nformat = "openai"\nurl = "{upstream.base}"\n')
            servers[name] = (port, subprocess.Popen(
                [sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--config", str(home / "p.toml"),
                 "--port", str(port), "--data-dir", str(home / "data")],
                env={**os.environ, "PYTHONPATH": str(root.resolve()), "PROJECTIONIST_ADMIN_TOKEN": "t" * 32},
                cwd=root / "projectionist", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(4)
        body = work / "text.json"
        body.write_bytes(scenarios.text_body())
        headers = {"X-Session-Id": "bench-ab"} if args.session else {}
        cpu: dict[str, list[float]] = {name: [] for name in servers}
        for port, _ in servers.values():
            load.run("python", f"http://127.0.0.1:{port}/v1/chat/completions", body, headers, 16, 1.0)
        for index in range(args.rounds):
            order = list(servers.items()) if index % 2 == 0 else list(servers.items())[::-1]
            for name, (port, process) in order:
                before = cpu_ticks([process.pid])
                result = load.run("python", f"http://127.0.0.1:{port}/v1/chat/completions", body, headers, 16,
                                  args.seconds)
                if result.errors or not result.requests:
                    raise SystemExit(f"bench.ab: {name} answered {result.errors} errors")
                cpu[name].append((cpu_ticks([process.pid]) - before) * 1e6 / CLK_TCK / result.requests)
        for name, values in cpu.items():
            print(f"{name}: CPU {statistics.median(values):.1f} µs/request (median), rounds {[round(v) for v in values]}")
        print(f"new/old CPU per request: {statistics.median(cpu['new']) / statistics.median(cpu['old']):.3f}")
    finally:
        for _, process in servers.values():
            process.terminate()
        procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
