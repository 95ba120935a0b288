"""``python -m bench``: run the whole benchmark matrix side by side and print table and ratios.

Starts every target as its own process on a free port, measures each (scenario, target,
concurrency) cell ``--runs`` times (runs interleaved across targets so drift hits all alike),
and always stops what it started. See ``bench/README.md`` for what each scenario measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from bench import image_costs, load, long_session, opcount, report, scenarios, ws
from bench.report import Cell, Results, Run
from bench.scenarios import CHAT, ScenarioBroken
from bench.targets import (
    CLK_TCK,
    DEFAULT_PEERS,
    ROOT,
    Peers,
    Proc,
    Processes,
    TargetFailed,
    checkout,
    cpu_ticks,
    find_litellm,
    find_portkey,
    free_port,
    memory_mb,
    process_tree,
    start_bare,
    portkey_headers,
    previous_release,
    start_litellm,
    start_portkey,
    start_projectionist,
    start_upstream,
)

WARMUP_S = 1.0


@dataclass
class Target:
    """One row of a group: the server whose CPU and RSS are read, and what is POSTed to whom."""

    name: str
    proc: Proc
    body: Path
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.proc.base + CHAT


class Bench:
    """One benchmark session: the processes it started, the settings, and the results so far."""

    def __init__(self, args: argparse.Namespace, procs: Processes, peers: Peers) -> None:
        self.args, self.procs, self.peers = args, procs, peers
        self.loadgen = load.pick(args.loadgen)
        self.duration: float = 3.0 if args.quick else args.duration
        self.runs: int = 1 if args.quick else args.runs
        self.rss_requests: int = args.rss_requests or (2_000 if args.quick else 10_000)
        self.ops_requests: int = 200 if args.quick else 1_000
        self.token = secrets.token_hex(16)
        self.results = Results()
        self.bodies = procs.workdir / "bodies"
        self.bodies.mkdir()
        #: Headers a peer needs to reach the upstream (Portkey is told the host per request).
        self.peer_headers: dict[str, dict[str, str]] = {}
        #: The previous release's checkout (``previous``), made on first use.
        self.previous_tree: Path | None = None

    # --- helpers ---------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        print(f"note: {text}", flush=True)
        self.results.notes.append(text)

    def body(self, name: str, data: bytes) -> Path:
        path = self.bodies / f"{name}.json"
        path.write_bytes(data)
        self.results.extras.setdefault("body_bytes", {})[name] = len(data)
        return path

    def row_cell(self, named: dict[str, Cell], scenario: str, name: str, concurrency: int) -> tuple[Cell, bool]:
        """The cell of row ``name`` in a group (``named``: the group's cells so far), made and added
        to the results when it is the row's first process; and whether it was."""
        cell = named.get(name)
        if cell is not None:
            return cell, False
        cell = named[name] = Cell(scenario, name, concurrency)
        self.results.cells.append(cell)
        return cell, True

    @contextmanager
    def started(self, start: Callable[[], Proc]) -> Iterator[Proc]:
        proc = start()
        try:
            yield proc
        finally:
            self.procs.stop(proc)

    def measure_once(self, target: Target, concurrency: int, duration: float) -> Run:
        pids = process_tree(target.proc.pid)  # LiteLLM may run workers; the others are one process
        before = cpu_ticks(pids)
        result = load.run(self.loadgen, target.url, target.body, target.headers, concurrency, duration)
        cpu_ms = (cpu_ticks(pids) - before) * 1000 / CLK_TCK
        memory = memory_mb(target.proc.pid)
        return Run(result.requests, result.errors, result.rps, result.p50_ms, result.p99_ms,
                   cpu_ms / result.requests if result.requests else None, memory.get("VmRSS"), memory.get("VmHWM"))

    def measure_group(self, scenario: str, concurrency: int, targets: list[Target]) -> None:
        """Probe and warm up every target, then run them interleaved ``runs`` times. Targets of
        one name (one row served by several processes) share a cell: each process's runs are
        runs of the row."""
        cells: list[Cell] = []
        named: dict[str, Cell] = {}
        for target in targets:
            probe = asyncio.run(scenarios.probe(target.url, target.body.read_bytes(), target.headers))
            cell, first = self.row_cell(named, scenario, target.name, concurrency)
            if first:
                cell.overhead_ms = probe.overhead_ms
            load.run(self.loadgen, target.url, target.body, target.headers, concurrency, WARMUP_S)
            cells.append(cell)
        for index in range(self.runs):
            for target, cell in zip(targets, cells, strict=True):
                run = self.measure_once(target, concurrency, self.duration)
                cell.runs.append(run)
                cpu = f"{run.cpu_ms_per_req:.3f}" if run.cpu_ms_per_req is not None else "n/a"
                print(f"  {scenario:<11} {target.name:<18} c={concurrency:<3} run {index + 1}/{self.runs}: "
                      f"{run.rps:>9,.0f} req/s  p50 {run.p50_ms:7.2f} ms  p99 {run.p99_ms:7.2f} ms  "
                      f"CPU {cpu} ms/req  errors {run.errors}", flush=True)

    # --- the matrix ------------------------------------------------------------------------------

    def run(self) -> None:
        upstream = start_upstream(self.procs, self.peers)
        servers: dict[str, Proc] = {"direct": upstream}
        if self.peers.dir:
            servers["bare"] = start_bare(self.procs, self.peers, upstream)
        servers["projectionist"] = start_projectionist(self.procs, upstream, "projectionist", self.token)
        venv, why = find_litellm(self.args.litellm_venv, self.peers)
        if venv is None:
            self.note(f"litellm skipped: {why}")
        else:
            try:
                servers["litellm"] = start_litellm(self.procs, venv, upstream)
            except TargetFailed as error:
                self.note(f"litellm skipped: it did not come up: {error}")
        folder, why = find_portkey(self.args.portkey)
        if folder is None:
            self.note(f"portkey skipped: {why}")
        else:
            try:
                servers["portkey"] = start_portkey(self.procs, folder)
                self.peer_headers["portkey"] = portkey_headers(upstream)
            except TargetFailed as error:
                self.note(f"portkey skipped: it did not come up: {error}")
        print(f"targets: {', '.join(f'{n} (pid {p.pid}, port {p.port})' for n, p in servers.items())}", flush=True)

        only = set(self.args.only or SCENARIOS)
        if "text1k" in only:
            self.text1k(servers, upstream)
            dropped, note = asyncio.run(scenarios.store_reads(servers["projectionist"].base, "records_dropped"))
            self.results.extras["records_dropped"] = {"count": dropped, "note": note}
        if "sse" in only:
            self.sse(servers)
            self.first_chunk(venv)
        if "images" in only:
            self.images(servers)
        if "quarantined" in only:
            self.quarantined(servers["projectionist"])
        if "rss" in only:
            self.rss(upstream)
        if "ops" in only:
            self.ops()
        if "long" in only:
            self.long(upstream)
        if "ws" in only:
            self.ws()

    def ws(self) -> None:
        """The Responses WebSocket: turn after turn on one socket each, direct to the fake
        WebSocket upstream, through the bare aiohttp relay and through projectionist on its
        defaults; a 1 KB text turn (c=1 and c=16), and a turn carrying one image the client
        inlined (as Codex sends a screenshot), c=16. Each socket names its conversation in a
        ``session-id`` header on the handshake, as Codex does (``ws.run_turns``)."""
        port = free_port()
        loop_env = {"UVLOOP": "1" if self.procs.loop == "uvloop" else "0"}
        upstream = self.procs.start("ws-upstream", [sys.executable, "-m", "bench.ws", "upstream"],
                                    {"PORT": str(port), **loop_env}, port)
        servers: list[tuple[str, Proc]] = [("direct", upstream)]
        for index in range(self.args.procs):  # sets, as P1's: one bare relay and one projectionist each
            port = free_port()
            servers.append(("bare", self.procs.start(f"ws-bare-{index}", [sys.executable, "-m", "bench.ws", "relay"],
                                                     {"PORT": str(port), "UPSTREAM": upstream.base, **loop_env}, port)))
            servers.append(("projectionist", start_projectionist(self.procs, upstream, f"projectionist-ws-{index}",
                                                                 self.token)))
        text = ws.turn_message(scenarios.responses_body())
        image = ws.turn_message(scenarios.responses_body(images=scenarios.make_images(1)))
        self.results.extras.setdefault("body_bytes", {}).update(ws_text=len(text), ws_image=len(image))
        try:
            for label, message, levels in (("ws", text, (1, 16)), ("ws-image", image, (16,))):
                for concurrency in levels:
                    self.measure_ws(label, message, servers, concurrency)
        finally:
            for _, proc in servers[::-1]:
                self.procs.stop(proc)

    def measure_ws(self, scenario: str, message: str, servers: list[tuple[str, Proc]], concurrency: int) -> None:
        """Every server probed and warmed up, then run in order ``runs`` times; servers of one name
        (a row served by several processes) share a cell, as in ``measure_group``."""
        cells = []
        named: dict[str, Cell] = {}
        for name, proc in servers:
            url = proc.base.replace("http://", "ws://", 1) + ws.PATH
            probe = ws.run(url, message, {}, 1, 0.5)
            if probe.errors or not probe.requests:
                raise ScenarioBroken(f"{scenario}: {name} did not answer a turn over the WebSocket")
            ws.run(url, message, {}, concurrency, WARMUP_S)
            cells.append((name, proc, url, self.row_cell(named, scenario, name, concurrency)[0]))
        for index in range(self.runs):
            for name, proc, url, cell in cells:
                before = cpu_ticks([proc.pid])
                result = ws.run(url, message, {}, concurrency, self.duration)
                cpu_ms = (cpu_ticks([proc.pid]) - before) * 1000 / CLK_TCK
                memory = memory_mb(proc.pid)
                run = Run(result.requests, result.errors, result.rps, result.p50_ms, result.p99_ms,
                          cpu_ms / result.requests if result.requests else None, memory.get("VmRSS"),
                          memory.get("VmHWM"))
                cell.runs.append(run)
                cpu = f"{run.cpu_ms_per_req:.3f}" if run.cpu_ms_per_req is not None else "n/a"
                print(f"  {scenario:<11} {name:<18} c={concurrency:<3} run {index + 1}/{self.runs}: "
                      f"{run.rps:>9,.0f} turn/s p50 {run.p50_ms:7.2f} ms  p99 {run.p99_ms:7.2f} ms  "
                      f"CPU {cpu} ms/turn errors {run.errors}", flush=True)

    def long(self, upstream: Proc) -> None:
        """P5: the first request of a 100,000-event session on a freshly started process, against
        a fresh session's p50 on the same process; a control row shows what any process's first
        request costs."""
        found = long_session.long_session(self.procs, upstream, self.token, rounds=1 if self.args.quick else 3)
        first = found["first_of_process"]["median"]
        warm = found.get("after_warm_up", {}).get("median", {})
        control = found.get("control", {}).get("median", {})
        found["ratio"] = first["ratio"]
        found["note"] = (f"first {first['first_ms']:.1f} ms vs fresh-session p50 {first['fresh_p50_ms']:.2f} ms; "
                         f"any process's first request (control) {control.get('first_ms', float('nan')):.1f} ms; "
                         f"after 5 warm-up requests {warm.get('ratio', float('nan')):.2f}x; "
                         f"RSS {first['rss_before_mb']:.1f} -> {first['rss_after_mb']:.1f} MB")
        self.results.extras["long_session"] = found

    def ops(self) -> None:
        """Store operations and log round trips per request of the image scenario at c=16, as the
        backends counted them, on both pairs (the replicated pair needs a PostgreSQL superuser DSN)."""
        dsn = self.args.pg_dsn or os.environ.get("PROJECTIONIST_TEST_PG_DSN", "")
        pairs = opcount.PAIRS if dsn else ("embedded",)
        if not dsn:
            self.note("ops: replicated pair skipped: no --pg-dsn or $PROJECTIONIST_TEST_PG_DSN")
        found = []
        for pair in pairs:
            try:
                figures = opcount.run((pair,), requests=self.ops_requests, concurrency=16, pg_dsn=dsn or None)[0]
            except (TargetFailed, OSError, RuntimeError) as error:
                self.note(f"ops: {pair} pair failed: {str(error).splitlines()[0]}")
                continue
            found.append(figures)
            print(f"  ops         {pair:<18} store ops/image/request {figures['store_ops_per_image_per_request']}, "
                  f"log round trips/request {figures['log_round_trips_per_request']} "
                  f"({figures['requests']} requests, c=16)", flush=True)
        self.results.extras["ops"] = found

    def targets(self, servers: dict[str, Proc], body: Path, session: dict[str, str]) -> list[Target]:
        """One row per server, each with the session header (the peers ignore it) and what that
        peer needs to reach the upstream."""
        return [Target(name, proc, body, {**session, **self.peer_headers.get(name, {})})
                for name, proc in servers.items()]

    def text1k(self, servers: dict[str, Proc], upstream: Proc) -> None:
        """Every target gets the session header, as agents send it; the comparison rows at c=16
        change one thing each: no session header, recording off, logging at warning, two
        workers, the previous release (``--previous``: a regression shows as a ratio), and the
        bare proxy on uvloop (projectionist's default loop)."""
        text = self.body("text1k", scenarios.text_body())
        session = {"X-Session-Id": scenarios.TEXT_SESSION}
        for concurrency in (1, 16, 64):
            group = self.targets(servers, text, session)
            if concurrency != 16:
                self.measure_group("text1k", concurrency, group)
                continue
            group = self.p1_group(servers, upstream, text, session)
            try:
                self.measure_group("text1k", 16, group)
            finally:
                for target in group:
                    if target.proc not in servers.values():
                        self.procs.stop(target.proc)

    def p1_group(self, servers: dict[str, Proc], upstream: Proc, text: Path, session: dict[str, str]) -> list[Target]:
        """text1k at c=16: P1's rows (bare, projectionist, record off, the previous release) each
        served by ``--procs`` processes, one of each measured back to back (a set: the rows' runs
        pair up by time, ``report.paired``), then the peers and the comparison rows."""
        rows: dict[str, Callable[[str], Proc] | None] = {
            "bare": partial(start_bare, self.procs, self.peers, upstream) if "bare" in servers else None,
            "projectionist": partial(self.projectionist, upstream),
            "projectionist-recoff": partial(self.projectionist, upstream, extra_toml='[record]\nmode = "off"\n'),
            "projectionist-previous": partial(self.previous, upstream) if self.args.previous else None}
        plan: list[tuple[str, Proc | Callable[[str], Proc]]] = [("direct", servers["direct"])]
        for index in range(self.args.procs):
            plan += [(name, servers[name] if index == 0 and name in servers else start)
                     for name, start in rows.items() if start is not None]
        plan += [(name, servers[name]) for name in ("litellm", "portkey") if name in servers]
        plan += [("projectionist-nosession", servers["projectionist"]),  # the same process, no session header
                 ("projectionist-quiet", partial(self.projectionist, upstream, log_level="warning")),
                 ("projectionist-2w", partial(self.projectionist, upstream, workers=2))]
        if self.peers.dir and self.procs.loop != "uvloop":
            plan.append(("bare-uvloop", partial(start_bare, self.procs, self.peers, upstream, loop="uvloop")))
        group: list[Target] = []
        failed: set[str] = set()
        for position, (name, start) in enumerate(plan):
            if name in failed:
                continue
            try:
                proc = start if isinstance(start, Proc) else start(f"{name}-{position}")
            except TargetFailed as error:
                self.note(f"{name} skipped: {str(error).splitlines()[0]}")
                failed.add(name)
                continue
            headers = {} if name == "projectionist-nosession" else {**session, **self.peer_headers.get(name, {})}
            group.append(Target(name, proc, text, headers))
        return group

    def projectionist(self, upstream: Proc, name: str, **settings: Any) -> Proc:
        """One more projectionist process (a comparison row, or one more of P1's processes)."""
        return start_projectionist(self.procs, upstream, name, self.token, **settings)

    def previous(self, upstream: Proc, name: str) -> Proc:
        """The previous release (``--previous``), checked out beside this tree (once), on its defaults."""
        if self.previous_tree is None:
            self.previous_tree = checkout(self.args.previous, self.procs.workdir / "previous-tree")
        self.results.extras["previous_release"] = self.args.previous
        return start_projectionist(self.procs, upstream, name, self.token, tree=self.previous_tree)

    def sse(self, servers: dict[str, Proc]) -> None:
        """SSE through every target that can stream; a peer whose streaming answer breaks is
        reported n/a with what it answered, not left out silently."""
        body = self.body("sse", scenarios.text_body(stream=True))
        group = []
        for target in self.targets(servers, body, {"X-Session-Id": scenarios.TEXT_SESSION}):
            try:
                asyncio.run(scenarios.probe(target.url, body.read_bytes(), target.headers, count=1))
            except ScenarioBroken as error:
                self.results.extras.setdefault("sse_broken", {})[target.name] = str(error)[:300]
                self.note(f"sse: {target.name} n/a: {str(error)[:300]}")
                continue
            group.append(target)
        self.measure_group("sse", 16, group)

    def first_chunk(self, litellm_venv: Path | None) -> None:
        """Each proxy in front of an upstream that pauses 20 ms before each of its 20 chunks."""
        body = scenarios.text_body(stream=True)
        with self.started(partial(start_upstream, self.procs, self.peers, "upstream-slow", 20)) as slow:
            starters = {"projectionist": partial(start_projectionist, self.procs, slow, "projectionist-ttfb",
                                                 self.token)}
            if self.peers.dir:
                starters["bare"] = partial(start_bare, self.procs, self.peers, slow, "bare-ttfb")
            if litellm_venv is not None:
                starters["litellm"] = partial(start_litellm, self.procs, litellm_venv, slow)
            found: dict[str, dict[str, Any]] = {}
            direct = asyncio.run(scenarios.ttfb_check(slow.base + CHAT, body))
            self.results.extras["first_chunk_direct"] = direct
            for name, start in starters.items():
                try:
                    with self.started(start) as proxy:
                        found[name] = asyncio.run(scenarios.ttfb_check(proxy.base + CHAT, body))
                except (TargetFailed, ScenarioBroken) as error:
                    found[name] = {"error": str(error).splitlines()[0]}
                figures = found[name]
                shown = figures.get("error") or f"TTFB {figures['ttfb_ms']:.1f} ms, total {figures['total_ms']:.1f} ms"
                print(f"  sse-ttfb    {name:<18} {shown}", flush=True)
        self.results.extras["first_chunk"] = found

    def images(self, servers: dict[str, Proc]) -> None:
        projectionist = servers["projectionist"]
        pngs = scenarios.make_images()
        ids = asyncio.run(scenarios.admit(projectionist.base, pngs))
        refs = self.body("images_refs", scenarios.refs_body(ids))
        inline = self.body("images_inline", scenarios.inline_body(pngs))
        headers = {"X-Session-Id": scenarios.IMAGES_SESSION}
        group = [Target(name, servers[name], inline, headers) for name in ("direct", "bare") if name in servers]
        group.append(Target("projectionist", projectionist, refs, headers))
        # the agents' own shape: the same ten images inlined by the client, every turn, in a session
        group.append(Target("projectionist-inline", projectionist, inline, headers))
        cold: Proc | None = None
        try:
            cold = start_projectionist(self.procs, servers["direct"], "projectionist-cold", self.token,
                                       cache_max_bytes=0)
            asyncio.run(scenarios.admit(cold.base, pngs))
            group.append(Target("projectionist-cold", cold, refs, headers))
            self.results.extras["images_cold"] = "projectionist started with [cache] max_bytes = 0"
        except TargetFailed as error:
            last = error.args[0].splitlines()[-1] if error.args else ""
            self.results.extras["images_cold"] = f"cold figure unavailable: [cache] max_bytes = 0 refused ({last})"
            self.note(self.results.extras["images_cold"])
        try:
            self.measure_group("images", 16, group)
        finally:
            if cold is not None:
                self.procs.stop(cold)
        costs = image_costs.measure(pngs)
        self.results.extras["image_costs"] = costs
        print("  images      where a cold image's CPU goes (in-process, medians):", flush=True)
        print("\n".join(image_costs.lines(costs)), flush=True)
        inline_costs = image_costs.measure_inline(pngs)
        self.results.extras["inline_image_costs"] = inline_costs
        print("  images      where a client-inlined image's CPU goes (in-process, medians):", flush=True)
        print("\n".join(image_costs.lines(inline_costs)), flush=True)

    def quarantined(self, projectionist: Proc) -> None:
        body = self.body("quarantined", scenarios.refs_body(scenarios.quarantined_ids()))
        headers = {"X-Session-Id": scenarios.QUARANTINED_SESSION}
        url = projectionist.base + CHAT
        asyncio.run(scenarios.probe(url, body.read_bytes(), headers, count=1))  # quarantines all ten
        sid = scenarios.QUARANTINED_SESSION
        events = asyncio.run(scenarios.quarantine_events(projectionist.admin_base, sid, self.token))
        before, note = asyncio.run(scenarios.store_reads(projectionist.base))
        self.measure_group("quarantined", 16, [Target("projectionist", projectionist, body, headers)])
        after, _ = asyncio.run(scenarios.store_reads(projectionist.base))
        events_after = asyncio.run(scenarios.quarantine_events(projectionist.admin_base, sid, self.token))
        delta = after - before if after is not None and before is not None else None
        self.results.extras["quarantined_store_reads"] = {
            "before": before, "after": after, "delta": delta, "note": note if delta is None else f"counters: {note}",
            "quarantine_events": events, "quarantine_events_after": events_after}
        if events != scenarios.N_IMAGES or events_after != events:
            self.note(f"quarantined: expected {scenarios.N_IMAGES} quarantine events, found {events} "
                      f"before and {events_after} after the measured phase")

    def rss(self, upstream: Proc) -> None:
        """A fresh projectionist: idle RSS after 1 s, then RSS after a 40/20/20/20 mix of requests."""
        with self.started(partial(start_projectionist, self.procs, upstream, "projectionist-rss", self.token)) as proc:
            time.sleep(1.0)
            idle = memory_mb(proc.pid)
            ids = asyncio.run(scenarios.admit(proc.base, scenarios.make_images()))
            session = {"X-Session-Id": "bench-rss-text"}  # every request bears a session, as agents send
            text, sse = (scenarios.text_body(), session), (scenarios.text_body(stream=True), session)
            images = (scenarios.refs_body(ids), {"X-Session-Id": "bench-rss-images"})
            quarantined = (scenarios.refs_body(scenarios.quarantined_ids()), {"X-Session-Id": "bench-rss-quarantined"})
            plan = [text, sse, images, quarantined, text, text, sse, images, quarantined, text]
            errors, seconds = asyncio.run(scenarios.mixed_load(proc.base + CHAT, plan, self.rss_requests, 16))
            after = memory_mb(proc.pid)
            time.sleep(SETTLE_S)  # idle again: what the process keeps, not what was in flight
            settled = memory_mb(proc.pid)
        self.results.extras["rss"] = {
            "idle_mb": idle.get("VmRSS"), "after_mb": after.get("VmRSS"), "settled_mb": settled.get("VmRSS"),
            "settle_s": SETTLE_S, "peak_mb": after.get("VmHWM"),
            "requests": self.rss_requests, "errors": errors, "seconds": round(seconds, 2), "mix": "40/20/20/20"}
        print(f"  rss         projectionist      idle {idle.get('VmRSS', 0):.1f} MB, after {self.rss_requests:,} "
              f"mixed requests {after.get('VmRSS', 0):.1f} MB, {SETTLE_S:.0f} s later {settled.get('VmRSS', 0):.1f} MB "
              f"(peak {after.get('VmHWM', 0):.1f} MB, "
              f"{errors} errors, {seconds:.1f} s)", flush=True)


# --- command line --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=Path, default=DEFAULT_PEERS if DEFAULT_PEERS.is_dir() else None,
                        help="reference programs (fake_upstream.py, bare_proxy.py); default ../shared/peers")
    parser.add_argument("--runs", type=int, default=3, help="runs per cell; the table quotes the median")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--procs", type=int, default=3,
                        help="processes serving each of P1's rows at text1k c=16 (bare, projectionist, record off, "
                             "previous release) and P8's (bare relay, projectionist), one of each measured back to "
                             "back each run: two processes of one program differ by several percent on a shared "
                             "machine")
    parser.add_argument("--quick", action="store_true", help="smoke test: 3 s, 1 run, 2,000 rss requests")
    parser.add_argument("--json", type=Path, help="write all raw results to this file")
    parser.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto",
                        help="wrk when installed (auto), else the built-in aiohttp client")
    parser.add_argument("--litellm-venv", help="LiteLLM's virtual environment (or env LITELLM_VENV)")
    parser.add_argument("--portkey", help="folder holding `npm install @portkey-ai/gateway@1.15.2` (or env PORTKEY_DIR)")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, metavar="SCENARIO",
                        help=f"run only these scenarios ({', '.join(SCENARIOS)}); default all")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="event loop of every aiohttp server in the run (the same for all, so ratios stay fair)")
    parser.add_argument("--pg-dsn", help="PostgreSQL superuser DSN for the ops scenario's replicated pair "
                        "(default $PROJECTIONIST_TEST_PG_DSN)")
    parser.add_argument("--rss-requests", type=int, help="requests of the rss mix (default 10,000)")
    parser.add_argument("--previous", default=previous_release(), metavar="REV",
                        help="the revision text1k's P1 is also measured against, side by side (default: the "
                             "previous release, bench/PREVIOUS_RELEASE); '' for none")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.duration < 1 or args.procs < 1 or (args.rss_requests is not None and args.rss_requests < 1):
        parser.error("--runs, --duration, --procs and --rss-requests must be at least 1")
    return args


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


SCENARIOS = ("text1k", "sse", "images", "quarantined", "rss", "ops", "long", "ws")
#: Seconds the rss scenario waits after its load before reading what the process kept.
SETTLE_S = 6.0


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP: unwind through the ``finally`` that stops every process."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    peers = Peers(args.peers if args.peers and args.peers.is_dir() else None)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="projectionist-bench-"))
    procs = Processes(workdir, args.loop)
    bench = Bench(args, procs, peers)
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "python": platform.python_version(),
            "loadgen": bench.loadgen, "duration_s": bench.duration, "runs": bench.runs,
            "peers": str(peers.dir) if peers.dir else None}
    print("projectionist bench: " + ", ".join(f"{k}={v}" for k, v in meta.items()), flush=True)
    if peers.dir is None:
        bench.note(f"no peers directory ({args.peers or DEFAULT_PEERS} not found): measuring direct "
                   "(built-in fake upstream) and projectionist only; ratios to bare are n/a")
    failure, keep_logs = "", False
    try:
        bench.run()
    except (TargetFailed, ScenarioBroken) as error:
        failure, keep_logs = str(error), True
    except Interrupted as signame:
        failure = f"interrupted by {signame}"
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        procs.stop_all()
        if not keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
    results = bench.results
    print("\n" + report.table(results))
    items = report.ratios(results)
    direct = results.extras.get("first_chunk_direct")
    if direct:
        print(f"\nfirst SSE chunk straight from the slow upstream: TTFB {direct['ttfb_ms']:.1f} ms "
              f"of {direct['total_ms']:.1f} ms")
    print("\nratios (medians of the same run):\n" + report.ratio_lines(items))
    for text in results.notes:
        print(f"note: {text}")
    if args.json:
        payload = {"meta": meta, "cells": [asdict(c) for c in results.cells], "extras": results.extras,
                   "ratios": [asdict(r) for r in items], "notes": results.notes, "failure": failure or None}
        args.json.write_text(json.dumps(_clean(payload), indent=2) + "\n")
        print(f"raw results: {args.json}")
    if failure:
        print(f"\nbench: FAILED: {failure}" + (f"\n(server logs kept in {workdir})" if keep_logs else ""),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
