"""``python -m bench.codex_turns``: the Codex CLI's wall time per turn, straight at a WebSocket
upstream and through projectionist, measured side by side.

Codex (pinned, ``tests/agents.py`` installs it from npm) runs on its built-in OpenAI provider with
only ``openai_base_url`` moved, so each turn is a Responses WebSocket (a prewarm and the turn);
the upstream is ``bench/ws.py``'s. Each round runs one ``codex exec`` straight at the upstream and
one through projectionist on its defaults, alternating which goes first; the figure is the median
wall time of each and their ratio. ``--image`` attaches a 270 KB PNG to every turn (``-i``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.scenarios import make_images
from bench.targets import Processes, free_port, start_projectionist
from tests.agents import CODEX_VERSION, codex, codex_builtin_config, quiet_env

def one_turn(executable: Path, url: str, work: Path, image: bool) -> float:
    home = Path(tempfile.mkdtemp(prefix="codex-bench-", dir=work))
    codex_builtin_config(home / ".codex", f"{url}/v1")
    argv = [str(executable), "exec", "--skip-git-repo-check", "Say hello.", *(["-i", "shot.png"] if image else [])]
    env = {**quiet_env(home), "HOME": str(home), "CODEX_HOME": str(home / ".codex"), "CODEX_API_KEY": "sk-bench"}
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, timeout=120,
                          check=False)
    elapsed = time.perf_counter() - started
    shutil.rmtree(home, ignore_errors=True)
    if done.returncode != 0 or b"tok19" not in done.stdout:
        raise RuntimeError(f"codex turn failed ({done.returncode}): {done.stderr.decode(errors='replace')[-800:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--image", action="store_true")
    args = parser.parse_args(argv)
    executable = codex(CODEX_VERSION)
    work = Path(tempfile.mkdtemp(prefix="codex-turns-"))
    (work / "shot.png").write_bytes(make_images(1)[0])
    procs = Processes(work)
    try:
        port = free_port()
        upstream = procs.start("ws-upstream", [sys.executable, "-m", "bench.ws", "upstream"], {"PORT": str(port)}, port)
        proxy = start_projectionist(procs, upstream, "projectionist", "t" * 32)
        urls = {"direct": upstream.base, "projectionist": proxy.base}
        times: dict[str, list[float]] = {name: [] for name in urls}
        for name, url in urls.items():  # warm-up: Codex's first run on a machine pays for its caches
            one_turn(executable, url, work, args.image)
        for index in range(args.rounds):
            order = list(urls.items()) if index % 2 == 0 else list(urls.items())[::-1]
            for name, url in order:
                times[name].append(one_turn(executable, url, work, args.image))
        direct, proxied = (statistics.median(times[name]) for name in urls)
        print(f"codex {CODEX_VERSION} on its built-in provider, {args.rounds} rounds, image={args.image}")
        for name in urls:
            print(f"  {name:<14} median {statistics.median(times[name]) * 1000:7.1f} ms  "
                  f"runs {[round(t * 1000) for t in times[name]]}")
        print(f"  wall time per turn, projectionist/direct: {proxied / direct:.3f} (target <= 1.1)")
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
