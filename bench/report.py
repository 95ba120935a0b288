"""Results, the table of medians, and the ratios against the project's performance targets.

A ``Cell`` is one (scenario, target, concurrency) with one ``Run`` per repetition; the table
quotes the median of each figure over the runs. Ratios compare medians measured in the same run.
"""

from __future__ import annotations

import math
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


def _check(label: str, value: float | None, op: str, limit: float, note: str = "", unit: str = "") -> Ratio:
    if value is None:
        return Ratio(label, None, f"{op} {limit:g}{unit}", "n/a", note)
    ok = value >= limit if op == "≥" else value <= limit
    return Ratio(label, value, f"{op} {limit:g}{unit}", "PASS" if ok else "MISS", note)


def ratios(results: Results) -> list[Ratio]:
    fig, extras = results.figure, results.extras
    out = [
        _check("text1k c=16 throughput projectionist/bare", _ratio(fig("text1k", "projectionist", 16, "rps"),
                                                                    fig("text1k", "bare", 16, "rps")), "≥", 0.85),
        _check("text1k c=16 CPU/request projectionist/bare",
               _ratio(fig("text1k", "projectionist", 16, "cpu_ms_per_req"),
                      fig("text1k", "bare", 16, "cpu_ms_per_req")),
               "≤", 1.25),
        _check("text1k c=16 throughput projectionist/litellm",
               _ratio(fig("text1k", "projectionist", 16, "rps"), fig("text1k", "litellm", 16, "rps")), "≥", 50,
               "" if results.cell("text1k", "litellm", 16) else "litellm not measured"),
    ]
    direct, proj, bare = (fig("text1k", t, 1, "p50_ms") for t in ("direct", "projectionist", "bare"))
    added_bare = f"bare adds {bare - direct:.3f} ms" if bare is not None and direct is not None else ""
    out.append(_check("text1k c=1 p50 added over direct: projectionist − direct",
                      proj - direct if proj is not None and direct is not None else None, "≤", 0.8, added_bare, " ms"))
    out.append(_check("sse c=16 throughput projectionist/bare",
                      _ratio(fig("sse", "projectionist", 16, "rps"), fig("sse", "bare", 16, "rps")), "≥", 0.85))
    for target, figures in extras.get("first_chunk", {}).items():
        if "error" in figures:
            out.append(Ratio(f"sse first chunk early via {target}: TTFB/total", None, "≤ 0.25", "n/a",
                             figures["error"]))
            continue
        out.append(_check(f"sse first chunk early via {target}: TTFB/total",
                          _ratio(figures["ttfb_ms"], figures["total_ms"]), "≤", 0.25,
                          f"TTFB {figures['ttfb_ms']:.1f} ms of {figures['total_ms']:.1f} ms"))
    bare_cpu = fig("images", "bare", 16, "cpu_ms_per_req")
    out.append(_check("images CPU/request projectionist(refs, warm)/bare(inlined)",
                      _ratio(fig("images", "projectionist", 16, "cpu_ms_per_req"), bare_cpu), "≤", 1.1))
    cold = _ratio(fig("images", "projectionist-cold", 16, "cpu_ms_per_req"), bare_cpu)
    out.append(Ratio("images CPU/request projectionist(refs, cache off)/bare(inlined)", cold, "(reported)",
                     "info" if cold is not None else "n/a", extras.get("images_cold", "")))
    reads = extras.get("quarantined_store_reads", {})
    delta = reads.get("delta")
    out.append(Ratio("quarantined: store reads during the measured phase", delta, "= 0",
                     "n/a" if delta is None else "PASS" if delta == 0 else "MISS", reads.get("note", "")))
    rss = extras.get("rss", {})
    out.append(_check("rss: projectionist idle RSS", rss.get("idle_mb"), "≤", 80, "", " MB"))
    measured = "settled_mb" in rss
    out.append(_check(f"rss: after {rss.get('requests', 10_000):,} mixed requests, idle again / idle",
                      _ratio(rss.get("settled_mb"), rss.get("idle_mb")), "≤", 1.5,
                      f"{_fmt(rss.get('settled_mb'), 1)} MB {rss.get('settle_s', 0):.0f} s after the load; "
                      f"{_fmt(rss.get('after_mb'), 1)} MB right after it, peak {_fmt(rss.get('peak_mb'), 1)} MB"
                      if measured else ""))
    logged = _ratio(fig("text1k", "projectionist+log", 16, "rps"), fig("text1k", "projectionist", 16, "rps"))
    out.append(Ratio("text1k c=16 throughput projectionist+log(info)/projectionist", logged, "(reported)",
                     "info" if logged is not None else "n/a"))
    return out


def ratio_lines(items: list[Ratio]) -> str:
    width = max(len(r.label) for r in items)
    lines = []
    for r in items:
        line = f"{r.verdict:>4}  {r.label.ljust(width)}  {_fmt(r.value, 3):>9}  (target {r.target})"
        lines.append(line + (f"  — {r.note}" if r.note else ""))
    return "\n".join(lines)
