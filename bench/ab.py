"""``python -m bench.ab OLD NEW``: projectionist's own CPU per request, two trees side by side.

``OLD`` and ``NEW`` are folders that each hold a checkout named ``projectionist`` (``git clone``
it into ``OLD/projectionist`` and check out the revision). Both serve on their defaults in front
of one fake upstream; ``--rounds`` rounds of ``--seconds`` of 1 KB text at c=16 (wrk when it is
installed, as the bench's P1; ``--loadgen``) alternate which goes first, and each process's CPU
time is read from ``/proc`` per round. With ``--procs N`` each tree serves from N processes,
every one measured each round: two processes of one tree differ by several percent in CPU per
request, so a change of that size needs several a side. The figure is the ratio of the medians
of CPU per request, new ÷ old: it tells a change in the proxy's own cost apart from a busy
machine, which the ratios to the bare proxy cannot do on their own. With ``--ws text`` or
``--ws image`` the same for the Responses WebSocket (``bench.ws``): turns at c=16 on one socket
each, a 1 KB text turn or one with an inlined image, CPU per turn and turns/s.
With ``--images`` the HTTP body is the bench's P7 body (ten PNGs the client inlined, re-sent
every request, with a session): what fitting costs when every image is seen before.

With ``--together`` each round loads an old and a new process at the same time, each from its
own load generator, instead of one after the other: whatever else the machine does then slows
both alike, so a pair's ratio holds still where two runs seconds apart do not (on a shared
2-core machine, the same tree against itself: rounds apart spread by a fifth, together by a
twentieth). The figure is then the median of the pairs' ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import load, scenarios, ws
from bench.targets import CLK_TCK, Peers, Processes, cpu_ticks, free_pair, free_port, start_upstream


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto",
                        help="HTTP load generator (auto: wrk when installed, as the bench's P1)")
    parser.add_argument("--procs", type=int, default=1, help="server processes per tree (each measured per round)")
    parser.add_argument("--session", action="store_true", help="send X-Session-Id (the text path with a session)")
    parser.add_argument("--ws", choices=("text", "image"), help="Responses WebSocket turns instead of HTTP")
    parser.add_argument("--record", help="[record] mode of both (off, metadata, full; default: theirs), or OLD:NEW "
                                         "for each its own (the same tree twice: what recording costs)")
    parser.add_argument("--together", action="store_true",
                        help="load an old and a new process at once each round; the figure is the median of "
                             "the pairs' ratios")
    parser.add_argument("--images", action="store_true",
                        help="the P7 body instead of text: ten ~203 KB PNGs inlined by the client (with a session)")
    args = parser.parse_args(argv)
    loadgen = load.pick(args.loadgen)
    work = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    procs = Processes(work)
    servers: list[tuple[str, int, subprocess.Popen[bytes]]] = []
    try:
        if args.ws:
            port = free_port()
            upstream = procs.start("ws-upstream", [sys.executable, "-m", "bench.ws", "upstream"], {"PORT": str(port)},
                                   port)
        else:
            upstream = start_upstream(procs, Peers(None))
        sides = (("old", args.old), ("new", args.new))
        trees = [(name, root, index) for index in range(args.procs) for name, root in sides]
        for name, root, index in trees:
            port, home = free_pair(), work / f"{name}{index}"
            home.mkdir()
            modes = (args.record or "").split(":")
            mode = modes[0] if name == "old" or len(modes) == 1 else modes[1]
            record = f'[record]\nmode = "{mode}"\n' if mode else ""
            (home / "p.toml").write_text(f'[upstreams.openai]\nformat = "openai"\nurl = "{upstream.base}"\n{record}')
            servers.append((name, port, subprocess.Popen(
                [sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--config", str(home / "p.toml"),
                 "--port", str(port), "--data-dir", str(home / "data")],
                env={**os.environ, "PYTHONPATH": str(root.resolve()), "PROJECTIONIST_ADMIN_TOKEN": "t" * 32},
                cwd=root / "projectionist", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        time.sleep(4 + 2 * (args.procs - 1))  # the servers start (several at once share two cores)
        body = work / "text.json"
        body.write_bytes(scenarios.inline_body(scenarios.make_images()) if args.images else scenarios.text_body())
        headers = {"X-Session-Id": "bench-ab"} if args.session or args.images else {}
        message = ws.turn_message(scenarios.responses_body(images=scenarios.make_images(1) if args.ws == "image"
                                                            else ()))

        def run(port: int, seconds: float) -> load.LoadResult:
            if args.ws:
                return ws.run(f"ws://127.0.0.1:{port}{ws.PATH}", message, headers, 16, seconds)
            return load.run(loadgen, f"http://127.0.0.1:{port}/v1/chat/completions", body, headers, 16, seconds)

        cpu: dict[str, list[float]] = {"old": [], "new": []}
        rates: dict[str, list[float]] = {"old": [], "new": []}
        for _, port, _ in servers:
            run(port, 1.0)

        def measured(group: list[tuple[str, int, subprocess.Popen[bytes]]]) -> None:
            """Load ``group``'s processes at once (a generator each); keep each one's CPU per unit."""
            before = [cpu_ticks([process.pid]) for _, _, process in group]
            with ThreadPoolExecutor(len(group)) as pool:
                results = list(pool.map(lambda server: run(server[1], args.seconds), group))
            for (name, _, process), ticks, result in zip(group, before, results):
                if result.errors or not result.requests:
                    raise SystemExit(f"bench.ab: {name} answered {result.errors} errors")
                cpu[name].append((cpu_ticks([process.pid]) - ticks) * 1e6 / CLK_TCK / result.requests)
                rates[name].append(result.rps)

        for index in range(args.rounds):
            if args.together:  # each old process with its new one: (old0, new0), (old1, new1), ...
                for pair in range(args.procs):
                    measured(servers[2 * pair:2 * pair + 2])
                continue
            for server in servers if index % 2 == 0 else servers[::-1]:
                measured([server])
        unit = "turn" if args.ws else "request"
        for name, values in cpu.items():
            print(f"{name}: CPU {statistics.median(values):.1f} µs/{unit} (median), rounds {[round(v) for v in values]}"
                  f", {statistics.median(rates[name]):,.0f} {unit}s/s")
        if args.together:
            pairs = [new / old for new, old in zip(cpu["new"], cpu["old"])]
            rate_pairs = [new / old for new, old in zip(rates["new"], rates["old"])]
            quartiles = " ".join(f"{q:.3f}" for q in statistics.quantiles(pairs, n=4))
            print(f"new/old CPU per {unit}, median of {len(pairs)} pairs: {statistics.median(pairs):.3f} "
                  f"(quartiles {quartiles}), {unit}s/s: {statistics.median(rate_pairs):.3f}")
            return 0
        print(f"new/old CPU per {unit}: {statistics.median(cpu['new']) / statistics.median(cpu['old']):.3f}, "
              f"{unit}s/s: {statistics.median(rates['new']) / statistics.median(rates['old']):.3f}")
    finally:
        for _, _, process in servers:
            process.terminate()
        procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
