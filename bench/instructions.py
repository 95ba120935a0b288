"""``python -m bench.instructions ROOT [ROOT ...]``: instructions per Responses WebSocket turn (or per
HTTP text call, ``--http``), counted.

Each ``ROOT`` is a folder that holds a checkout named ``projectionist`` (as for ``bench.ab``); with
``--bare`` the bare aiohttp relay (``bench.ws relay``) is counted beside them. Each target runs
under ``valgrind --tool=callgrind`` in front of the fake WebSocket upstream (``bench.ws``), twice:
once serving ``--turns A`` turns and once ``B`` (4 sockets, the turns shared among them), and the
figure is the difference of the two totals divided by ``B - A``, so start-up, imports and
warm-up cancel out.

An instruction count does not move with a busy or throttled machine the way seconds of CPU do (on
a shared 2-core machine ``bench.ab`` rounds spread by a tenth), so it tells small changes apart.
It is not time: a Python step retires fewer instructions per cycle than a copy does, so the
interpreter's share of the time is larger than its share of the count. Timing still shapes a
little of the count (how many frames one read brings, how records batch), so quote differences of
a percent or more. Needs valgrind on ``PATH``; a run takes about a minute per target.

With ``--http`` the unit is P1's request instead: a 1 KB Chat Completions call with
``X-Session-Id`` at c=16 (``--turns`` counts calls), ``--record MODE`` sets every ROOT's
``[record] mode`` (two runs, ``off`` and ``metadata``, give recording's own cost), and ``--bare``
counts the peers' bare aiohttp proxy (``--peers``, on asyncio; ``--bare-uvloop`` on uvloop too).
``--threads`` counts each thread apart and gives the event loop's share (the main thread) beside
the others' (the session log's lane): only the loop's share holds up every call.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import aiohttp

from bench import scenarios, ws
from bench.load import AUTH_KEY
from bench.targets import (
    DEFAULT_PEERS, Peers, Proc, Processes, TargetFailed, free_pair, free_port, start_upstream,
)

SOCKETS = 4
#: How long a target under callgrind may take to start, and to write its counts once stopped.
START_S, STOP_S = 600.0, 300.0


async def _turns(url: str, message: str, turns: int) -> None:
    """``turns`` turns of ``message``, shared among ``SOCKETS`` sockets, one after another on each."""
    async with aiohttp.ClientSession() as session:
        async def one(count: int) -> None:
            async with session.ws_connect(url, headers={"Authorization": f"Bearer {AUTH_KEY}"},
                                          max_msg_size=ws.MAX_MESSAGE) as socket:
                for _ in range(count):
                    await socket.send_str(message)
                    while True:
                        frame = await socket.receive(timeout=120)
                        if frame.type is not aiohttp.WSMsgType.TEXT:
                            raise SystemExit(f"bench.instructions: the socket ended ({frame.type.name})")
                        if '"response.completed"' in frame.data[:64]:
                            break

        await asyncio.gather(*(one(turns // SOCKETS + (i < turns % SOCKETS)) for i in range(SOCKETS)))


async def _calls(url: str, body: bytes, calls: int, concurrency: int = 16) -> None:
    """``calls`` POSTs of ``body`` with a session header from ``concurrency`` connections."""
    left = calls
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {AUTH_KEY}",
               "X-Session-Id": "bench-instructions"}

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with session.post(url, data=body, headers=headers) as answer:
                await answer.read()
                if answer.status != 200:
                    raise TargetFailed(f"bench.instructions: {url} answered {answer.status}")

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))


def _total(path: Path) -> int:
    """The instructions a callgrind output file counted in all."""
    found = re.search(r"^(?:summary|totals):\s*(\d+)", path.read_text(errors="replace"), re.M)
    if found is None:
        raise SystemExit(f"bench.instructions: no totals in {path}")
    return int(found[1])


def thread_totals(path: Path) -> tuple[int, int]:
    """The instructions of a run counted with ``--separate-threads=yes`` (one file per thread,
    ``path-01``, ``path-02``, ...): the main thread's (the event loop's: ``-01``, the thread that
    started the program) and all the others' together (the session log's lane among them)."""
    files = sorted(path.parent.glob(path.name + "-*"), key=lambda file: int(file.name.rsplit("-", 1)[1]))
    if not files or not files[0].name.endswith("-01"):
        raise SystemExit(f"bench.instructions: no per-thread counts at {path}-01")
    return _total(files[0]), sum(_total(file) for file in files[1:])


def _counted(procs: Processes, name: str, root: Path | None, upstream: Proc, message: str, turns: int,
             http: Http | None = None, uvloop: bool = False, threads: bool = False) -> tuple[int, int]:
    """One target under callgrind, serving ``turns`` turns (``http``: calls): the instructions it
    ran on its main thread and on the others (all on the main one unless ``threads``).
    ``uvloop``: the bare proxy's loop (``root`` None with ``http``)."""
    home = procs.workdir / f"{name}-{turns}"
    home.mkdir()
    out = home / "callgrind.out"
    grind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-line=no",
             *(["--separate-threads=yes"] if threads else [])]
    if root is None:
        port = free_port()
        relay = [sys.executable, "-m", "bench.ws", "relay"] if http is None else [sys.executable, str(http.bare)]
        env = {"PORT": str(port), "UPSTREAM": upstream.base, "UVLOOP": "1" if uvloop else "0"}
        proc = procs.start(f"{name}-{turns}", [*grind, *relay], env, port, timeout=START_S)
    else:
        port = free_pair()
        record = f'[record]\nmode = "{http.record}"\n' if http is not None and http.record else ""
        (home / "p.toml").write_text(f'[upstreams.openai]\nformat = "openai"\nurl = "{upstream.base}"\n{record}')
        argv = [*grind, sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--config",
                str(home / "p.toml"), "--port", str(port), "--data-dir", str(home / "data")]
        proc = procs.start(f"{name}-{turns}", argv, {"PYTHONPATH": str(root.resolve()),
                                                     "PROJECTIONIST_ADMIN_TOKEN": "t" * 32},
                           port, "/healthz", need_200=True, timeout=START_S)
    try:
        if http is not None:
            asyncio.run(_calls(proc.base + "/v1/chat/completions", http.body, turns))
        else:
            asyncio.run(_turns(proc.base.replace("http://", "ws://", 1) + ws.PATH, message, turns))
    finally:
        procs.stop(proc, grace=STOP_S)  # SIGTERM: the program exits and callgrind writes its counts
    return thread_totals(out) if threads else (_total(out), 0)


class Http(NamedTuple):
    """``--http``: the call each target serves, the record mode of the ROOTs, the bare proxy."""

    body: bytes
    record: str | None
    bare: Path | None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", type=Path, nargs="*")
    parser.add_argument("--bare", action="store_true", help="count the bare aiohttp relay too")
    parser.add_argument("--ws", choices=("text", "image"), default="image",
                        help="a 1 KB text turn or one with an inlined image (the default)")
    parser.add_argument("--turns", type=int, nargs=2, default=(40, 200), metavar=("A", "B"))
    parser.add_argument("--http", action="store_true", help="P1's HTTP text call instead of WebSocket turns")
    parser.add_argument("--record", help="with --http: the [record] mode of every ROOT (default: its default)")
    parser.add_argument("--bare-uvloop", action="store_true", help="with --http: the bare proxy on uvloop too")
    parser.add_argument("--threads", action="store_true",
                        help="count the main thread (the event loop) and the others (the log's lane) apart")
    parser.add_argument("--peers", type=Path, default=DEFAULT_PEERS,
                        help="with --http --bare: the folder of bare_proxy.py (default ../shared/peers)")
    args = parser.parse_args(argv)
    http = None
    if args.bare_uvloop and not args.http:
        parser.error("--bare-uvloop counts the bare HTTP proxy: it needs --http")
    if args.http:
        bare = Peers(args.peers if args.peers.is_dir() else None).bare_proxy
        if (args.bare or args.bare_uvloop) and bare is None:
            parser.error(f"--bare with --http needs the peers' bare_proxy.py ({args.peers} not found)")
        http = Http(scenarios.text_body(), args.record, bare)
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    low, high = args.turns
    if not 0 <= low < high:
        parser.error("--turns A B needs 0 <= A < B")
    targets: list[tuple[str, Path | None, bool]] = [(root.name or str(root), root, False) for root in args.roots]
    if args.bare:
        targets.append(("bare", None, False))
    if args.bare_uvloop:
        targets.append(("bare-uvloop", None, True))
    if not targets:
        parser.error("name a ROOT, or --bare")
    message = ws.turn_message(scenarios.responses_body(images=scenarios.make_images(1) if args.ws == "image" else ()))
    procs = Processes(Path(tempfile.mkdtemp(prefix="bench-instructions-")))
    try:
        port = free_port()
        upstream = procs.start("ws-upstream", [sys.executable, "-m", "bench.ws", "upstream"], {"PORT": str(port)},
                               port) if http is None else start_upstream(procs, Peers(None))
        counts: dict[str, float] = {}
        for index, (name, root, uvloop) in enumerate(targets):
            label = f"{index}:{name}"
            totals = [_counted(procs, label.replace(":", "-"), root, upstream, message, turns, http, uvloop,
                               args.threads) for turns in (low, high)]
            main_thread, others = ((high_count - low_count) / (high - low)
                                   for low_count, high_count in zip(*totals))
            counts[label] = main_thread + others
            unit = "text call" if http is not None else f"{args.ws} turn"
            split = f" (main thread {main_thread:,.0f}, other threads {others:,.0f})" if args.threads else ""
            print(f"{label}: {counts[label]:,.0f} instructions per {unit}{split}", flush=True)
        first = next(iter(counts.values()))
        for label, count in counts.items():
            print(f"{label} / {next(iter(counts))}: {count / first:.3f}")
    finally:
        procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
