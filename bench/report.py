"""Results, the table of medians, and the ratios against the project's performance targets.

A ``Cell`` is one (scenario, target, concurrency) with one ``Run`` per repetition; the table
quotes the median of each figure over the runs. A ratio of two rows of one group is the median
of their runs' ratios, taken side by side (``paired``); other ratios compare medians of the run.
"""

from __future__ import annotations

import math
from functools import partial
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Run:
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_req: float | None
    rss_mb: float | None
    hwm_mb: float | None


@dataclass
class Cell:
    scenario: str
    target: str
    concurrency: int
    runs: list[Run] = field(default_factory=list)
    overhead_ms: float | None = None  # projectionist's own x-projectionist-overhead-ms, probe median

    def median(self, name: str) -> float | None:
        values = [v for run in self.runs if (v := getattr(run, name)) is not None and not math.isnan(v)]
        return statistics.median(values) if values else None

    def most(self, name: str) -> float | None:
        """The largest figure over the runs (for ``hwm_mb``: the process's peak over all of them)."""
        values = [v for run in self.runs if (v := getattr(run, name)) is not None and not math.isnan(v)]
        return max(values) if values else None


@dataclass
class Ratio:
    label: str
    value: float | None
    target: str
    verdict: str  # PASS | MISS | n/a | info
    note: str = ""


@dataclass
class Results:
    cells: list[Cell] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def cell(self, scenario: str, target: str, concurrency: int) -> Cell | None:
        for cell in self.cells:
            if (cell.scenario, cell.target, cell.concurrency) == (scenario, target, concurrency):
                return cell
        return None

    def figure(self, scenario: str, target: str, concurrency: int, name: str) -> float | None:
        cell = self.cell(scenario, target, concurrency)
        return cell.median(name) if cell else None


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.{digits}f}"


def table(results: Results) -> str:
    head = ("scenario", "target", "c", "req/s", "p50 ms", "p99 ms", "CPU ms/req", "RSS MB", "peak MB", "errors",
            "ovh ms")
    rows = [head]
    for cell in (c for c in results.cells if c.runs):
        errors = sum(run.errors for run in cell.runs)
        rows.append((cell.scenario, cell.target, str(cell.concurrency), _fmt(cell.median("rps"), 0),
                     _fmt(cell.median("p50_ms")), _fmt(cell.median("p99_ms")), _fmt(cell.median("cpu_ms_per_req"), 3),
                     _fmt(cell.median("rss_mb"), 1), _fmt(cell.median("hwm_mb"), 1), str(errors),
                     _fmt(cell.overhead_ms, 3) if cell.target.startswith("projectionist") else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def paired(a: Cell | None, b: Cell | None, name: str) -> float | None:
    """``a``'s figure over ``b``'s: the median of the ratios of their runs taken side by side (the
    i-th of each, measured seconds apart in one set: P1's rows, ``--procs``), when both have as
    many runs; else the ratio of their medians. A shared machine's speed drifts by a factor of two
    within minutes; a set's runs drift together."""
    if a is None or b is None:
        return None
    if len(a.runs) != len(b.runs) or not a.runs:
        return _ratio(a.median(name), b.median(name))
    ratios = [x / y for run_a, run_b in zip(a.runs, b.runs, strict=True)
              if (x := getattr(run_a, name)) is not None and (y := getattr(run_b, name))]
    return statistics.median(ratios) if ratios else None


def _check(label: str, value: float | None, op: str, limit: float, note: str = "", unit: str = "") -> Ratio:
    if value is None:
        return Ratio(label, None, f"{op} {limit:g}{unit}", "n/a", note)
    ok = value >= limit if op == "≥" else value <= limit
    return Ratio(label, value, f"{op} {limit:g}{unit}", "PASS" if ok else "MISS", note)


def _previous(results: Results) -> str:
    """Which revision the previous-release row ran, and its CPU per request against this one's."""
    revision = results.extras.get("previous_release")
    if not revision or not results.cell("text1k", "projectionist-previous", 16):
        return "previous release not measured (--previous)"
    cpu = paired(results.cell("text1k", "projectionist", 16), results.cell("text1k", "projectionist-previous", 16),
                 "cpu_ms_per_req")
    return f"{revision}; CPU/request {cpu:.3f}x its" if cpu is not None else str(revision)


def ratios(results: Results) -> list[Ratio]:
    """Issue 13's targets P1-P6, each a ratio of medians measured in this run (projectionist on
    its defaults, the session header set), and the comparison rows as ``info``."""
    fig, extras = results.figure, results.extras
    rps = partial(_rps, fig)
    cpu = partial(_cpu, fig)
    peer = {name: "" if results.cell("text1k", name, 16) else f"{name} not measured" for name in ("litellm", "portkey")}

    def side(scenario: str, a: str, b: str, name: str = "rps") -> float | None:
        """Two rows of one group at c=16, run by run (``paired``)."""
        return paired(results.cell(scenario, a, 16), results.cell(scenario, b, 16), name)

    p1 = partial(side, "text1k")
    out = [
        _check("P1 text1k c=16 throughput projectionist/bare", p1("projectionist", "bare"), "≥", 0.95),
        _check("P1 text1k c=16 CPU/request projectionist/bare", p1("projectionist", "bare", "cpu_ms_per_req"), "≤",
               1.10),
        _check("P1 text1k c=16 throughput projectionist(record off)/bare", p1("projectionist-recoff", "bare"), "≥",
               1.05),
        _check("P1 recording's cost: text1k c=16 throughput projectionist/projectionist(record off)",
               p1("projectionist", "projectionist-recoff"), "≥", 0.95),
        _check("P1 text1k c=16 throughput projectionist/previous release", p1("projectionist", "projectionist-previous"),
               "≥", 0.97, _previous(results)),
        _check("P1 text1k c=16 throughput projectionist/portkey", _ratio(rps("projectionist"), rps("portkey")), "≥", 2.5,
               peer["portkey"]),
        _check("P1 text1k c=16 throughput projectionist/litellm", _ratio(rps("projectionist"), rps("litellm")), "≥", 50,
               peer["litellm"]),
    ]
    direct, proj, bare = (fig("text1k", t, 1, "p50_ms") for t in ("direct", "projectionist", "bare"))
    added = proj - direct if proj is not None and direct is not None else None
    added_bare = bare - direct if bare is not None and direct is not None else None
    out.append(_check("P2 text1k c=1 added p50 over direct: projectionist/bare", _ratio(added, added_bare), "≤", 1.3,
                      f"projectionist adds {added:.3f} ms, bare {added_bare:.3f} ms"
                      if added is not None and added_bare is not None else ""))
    out.append(_check("P3 sse c=16 throughput projectionist/bare",
                      side("sse", "projectionist", "bare"), "≥", 0.90))
    for name, why in extras.get("sse_broken", {}).items():
        out.append(Ratio(f"P3 sse c=16 throughput projectionist/{name}", None, "(reported)", "n/a", why))
    for target, figures in extras.get("first_chunk", {}).items():
        if "error" in figures:
            out.append(Ratio(f"sse first chunk early via {target}: TTFB/total", None, "≤ 0.25", "n/a",
                             figures["error"]))
            continue
        out.append(_check(f"sse first chunk early via {target}: TTFB/total",
                          _ratio(figures["ttfb_ms"], figures["total_ms"]), "≤", 0.25,
                          f"TTFB {figures['ttfb_ms']:.1f} ms of {figures['total_ms']:.1f} ms"))
    out.append(_check("P4 images CPU/request projectionist(refs, cache cold)/bare(inlined)",
                      side("images", "projectionist-cold", "bare", "cpu_ms_per_req"), "≤", 1.5,
                      extras.get("images_cold", "")))
    out.append(_image_memory(results))
    warm = side("images", "projectionist", "bare", "cpu_ms_per_req")
    out.append(Ratio("images CPU/request projectionist(refs, cache warm)/bare(inlined)", warm, "(reported)",
                     "info" if warm is not None else "n/a"))
    out.append(_check("P7 images inlined by the client, c=16 throughput projectionist/bare",
                      side("images", "projectionist-inline", "bare"), "≥", 0.90))
    out.append(_check("P7 images inlined by the client, CPU/request projectionist/bare",
                      side("images", "projectionist-inline", "bare", "cpu_ms_per_req"), "≤", 1.25))
    direct, proj, bare = (fig("ws", t, 1, "p50_ms") for t in ("direct", "projectionist", "bare"))
    added = proj - direct if proj is not None and direct is not None else None
    added_bare = bare - direct if bare is not None and direct is not None else None
    out.append(_check("P8 ws c=1 added p50 per turn over direct: projectionist/bare relay",
                      _ratio(added, added_bare), "≤", 1.1,
                      f"projectionist adds {added:.3f} ms, bare {added_bare:.3f} ms"
                      if added is not None and added_bare is not None else ""))
    for scenario, what in (("ws", "1 KB text"), ("ws-image", "one inlined image")):
        out.append(_check(f"P8 ws c=16 turns/s ({what}): projectionist/bare relay",
                          side(scenario, "projectionist", "bare"), "≥", 1 / 1.1))
    long = extras.get("long_session", {})
    out.append(_check("P5 first request of a 100,000-event session, cold process / fresh-session p50",
                      long.get("ratio"), "≤", 2.0, long.get("note", "")))
    warm = long.get("after_warm_up", {}).get("median", {}).get("ratio")
    out.append(Ratio("P5 the same after 5 requests in another session / fresh-session p50", warm, "(reported)",
                     "info" if warm is not None else "n/a"))
    dropped = extras.get("records_dropped", {}).get("count")
    out.append(Ratio("records dropped by projectionist during the text1k cells (recording keeps up)", dropped,
                     "= 0", "n/a" if dropped is None else "PASS" if dropped == 0 else "MISS",
                     extras.get("records_dropped", {}).get("note", "")))
    reads = extras.get("quarantined_store_reads", {})
    delta = reads.get("delta")
    out.append(Ratio("quarantined: store reads during the measured phase", delta, "= 0",
                     "n/a" if delta is None else "PASS" if delta == 0 else "MISS", reads.get("note", "")))
    rss = extras.get("rss", {})
    out.append(_check("P6 rss: projectionist idle RSS", rss.get("idle_mb"), "≤", 80, "", " MB"))
    measured = "settled_mb" in rss
    out.append(_check(f"P6 rss: after {rss.get('requests', 10_000):,} mixed session requests, idle again / idle",
                      _ratio(rss.get("settled_mb"), rss.get("idle_mb")), "≤", 1.5,
                      f"{_fmt(rss.get('settled_mb'), 1)} MB {rss.get('settle_s', 0):.0f} s after the load; "
                      f"{_fmt(rss.get('after_mb'), 1)} MB right after it, peak {_fmt(rss.get('peak_mb'), 1)} MB"
                      if measured else ""))
    for figures in extras.get("ops", []):
        pair = figures["pair"]
        out.append(_check(f"ops {pair}: store operations per history image per request",
                          figures["store_ops_per_image_per_request"], "≤", 0.1,
                          f"{figures['store_ops_per_request']} per request, counted by the store"))
        cross = figures.get("pg_transactions_per_request") or figures.get("seaweedfs_s3_requests_per_request")
        trips = figures["log_round_trips_per_request"]
        if pair == "replicated":
            out.append(_check("ops replicated: PostgreSQL round trips per request, records included", trips, "≤", 1.0,
                              f"pg_stat_database: {figures.get('pg_transactions_per_request')} transactions/request"))
        else:
            out.append(Ratio(f"ops {pair}: SQLite round trips per request, records included", trips, "(reported)",
                             "info", f"cross-check {cross}" if cross else ""))
    for row, label in (("projectionist-nosession", "no session header"), ("projectionist-quiet", "logging at warning"),
                       ("projectionist-2w", "2 workers")):
        out.append(Ratio(f"text1k c=16 throughput projectionist({label})/bare", _ratio(rps(row), rps("bare")),
                         "(reported)", "info" if rps(row) is not None else "n/a",
                         f"CPU/request {_fmt(_ratio(cpu(row), cpu('bare')), 3)}x bare's"))
    same_loop = _ratio(rps("projectionist"), rps("bare-uvloop"))
    out.append(Ratio("text1k c=16 throughput projectionist/bare on uvloop (same loop)", same_loop, "(reported)",
                     "info" if same_loop is not None else "n/a",
                     f"CPU/request {_fmt(_ratio(cpu('projectionist'), cpu('bare-uvloop')), 3)}x"))
    return out


def _image_memory(results: Results) -> Ratio:
    """Cold-image memory: the peak RSS (VmHWM after the last run) of projectionist-cold, which
    reads, verifies and inlines the ten images on every request, against the bare proxy's under
    the same load with the same images inlined by the client (both at c=16, in the same run)."""
    label = "images peak RSS projectionist(refs, cache cold)/bare(inlined)"
    cold, bare = results.cell("images", "projectionist-cold", 16), results.cell("images", "bare", 16)
    if cold is None or bare is None:
        return Ratio(label, None, "≤ 2", "n/a", "projectionist-cold or bare not measured")
    peaks = cold.most("hwm_mb"), bare.most("hwm_mb")
    note = (f"peak {_fmt(peaks[0], 1)} MB vs {_fmt(peaks[1], 1)} MB; RSS after the runs {_fmt(cold.median('rss_mb'), 1)} "
            f"vs {_fmt(bare.median('rss_mb'), 1)} MB")
    return _check(label, _ratio(*peaks), "≤", 2.0, note)


def _rps(fig: Any, target: str) -> float | None:
    value: float | None = fig("text1k", target, 16, "rps")
    return value


def _cpu(fig: Any, target: str) -> float | None:
    value: float | None = fig("text1k", target, 16, "cpu_ms_per_req")
    return value


def ratio_lines(items: list[Ratio]) -> str:
    width = max(len(r.label) for r in items)
    lines = []
    for r in items:
        line = f"{r.verdict:>4}  {r.label.ljust(width)}  {_fmt(r.value, 3):>9}  (target {r.target})"
        lines.append(line + (f"  — {r.note}" if r.note else ""))
    return "\n".join(lines)
