"""The bench's guard of the text path (issue 42): P1 is also measured against the previous
release, checked out from this repository beside the tree, and the report turns each row into
its verdict. The bench itself runs outside the suite (its figures are no test's); what is tested
here is that its comparison rows can be built and read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(code: str) -> str:
    """Run ``code`` with the repository's ``bench`` package importable (it is no installed one)."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_previous_release_is_a_commit_of_this_repository(tmp_path: Path) -> None:
    revision = bench("from bench.targets import previous_release; print(previous_release())").strip()
    assert len(revision) == 40 and int(revision, 16) >= 0
    kind = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-t", revision], capture_output=True, text=True)
    assert kind.stdout.strip() == "commit", kind.stderr


def test_a_revision_is_checked_out_beside_the_tree_and_an_unknown_one_is_a_clear_failure(tmp_path: Path) -> None:
    out = bench(f"""
from pathlib import Path
from bench.targets import TargetFailed, checkout
tree = checkout("HEAD", Path({str(tmp_path / 'head')!r}))
print((tree / "projectionist" / "proxy" / "ops" / "cli.py").is_file())
try:
    checkout("0" * 40, Path({str(tmp_path / 'none')!r}))
except TargetFailed as error:
    print("failed:", error)
""")
    lines = out.splitlines()
    assert lines[0] == "True"
    assert lines[1].startswith("failed: cannot check out " + "0" * 40)


def test_the_report_reads_the_text_rows_against_bare_record_off_and_the_previous_release() -> None:
    """Throughputs (req/s) and CPU (ms/request) chosen so each verdict is known: 0.96x bare (PASS
    at 0.95), 1.2x its CPU (MISS at 1.10), record off 1.10x bare (PASS), recording's cost 0.873
    (MISS at 0.95), 0.96x the previous release (MISS at 0.97)."""
    rows = {"bare": (1000.0, 0.200), "projectionist": (960.0, 0.240), "projectionist-recoff": (1100.0, 0.190),
            "projectionist-previous": (1000.0, 0.230)}
    out = bench(f"""
import json
from bench.report import Cell, Results, Run, ratios
results = Results()
for name, (rps, cpu) in {rows!r}.items():
    results.cells.append(Cell("text1k", name, 16, [Run(1000, 0, rps, 1.0, 2.0, cpu, None, None)]))
results.extras["previous_release"] = "abc123"
print(json.dumps({{r.label: [r.verdict, r.value, r.note] for r in ratios(results)}}))
""")
    found = json.loads(out)
    assert found["P1 text1k c=16 throughput projectionist/bare"][:2] == ["PASS", 0.96]
    assert found["P1 text1k c=16 CPU/request projectionist/bare"][0] == "MISS"
    assert found["P1 text1k c=16 throughput projectionist(record off)/bare"][0] == "PASS"
    verdict, value, _ = found["P1 recording's cost: text1k c=16 throughput projectionist/projectionist(record off)"]
    assert verdict == "MISS" and abs(value - 960 / 1100) < 1e-9
    verdict, value, note = found["P1 text1k c=16 throughput projectionist/previous release"]
    assert verdict == "MISS" and value == 0.96 and note.startswith("abc123; CPU/request 1.043x")


def test_a_row_served_by_several_processes_is_one_cell_with_every_process_measured_each_run(tmp_path: Path) -> None:
    """``--procs``: P1's rows are each served by several processes; their runs pool into the row's
    one cell (its median is over processes and runs), interleaved with the other rows."""
    out = bench(f"""
import asyncio, json
from pathlib import Path
from types import SimpleNamespace
import bench.__main__ as main
from bench.report import Run
from bench.targets import Proc, Processes, Peers

order = []
async def probe(url, body, headers, count=20):
    return SimpleNamespace(overhead_ms=float(url.split(":")[2].split("/")[0]))
main.scenarios.probe = probe
main.load.run = lambda *args, **kwargs: None
def once(self, target, concurrency, duration):
    order.append(target.proc.port)
    return Run(100, 0, float(target.proc.port), 1.0, 2.0, 0.1, None, None)
main.Bench.measure_once = once
args = SimpleNamespace(quick=False, runs=2, duration=1.0, rss_requests=None, loadgen="python")
work = Path({str(tmp_path)!r})
b = main.Bench(args, Processes(work), Peers(None))
body = b.body("text1k", b"{{}}")
proc = lambda port: Proc("p", None, port, f"http://127.0.0.1:{{port}}")
b.measure_group("text1k", 16, [main.Target("a", proc(1), body), main.Target("b", proc(10), body),
                               main.Target("a", proc(3), body)])
print(json.dumps([[c.target, [r.rps for r in c.runs], c.median("rps"), c.overhead_ms] for c in b.results.cells]))
print(json.dumps(order))
""")
    cells, order = (json.loads(line) for line in out.splitlines()[-2:])  # after the progress lines
    assert cells == [["a", [1.0, 3.0, 1.0, 3.0], 2.0, 1.0], ["b", [10.0, 10.0], 10.0, 10.0]]
    assert order == [1, 10, 3, 1, 10, 3]


def test_p1_rows_measured_in_sets_are_compared_run_by_run() -> None:
    """Rows whose runs were taken in sets (the i-th of each seconds apart) are compared by the
    median of their runs' ratios: a machine that slowed down between sets moves both alike. Rows
    with unequal runs fall back to the ratio of their medians."""
    out = bench("""
import json
from bench.report import Cell, Run, paired
def cell(name, rates):
    return Cell("text1k", name, 16, [Run(1000, 0, r, 1.0, 2.0, 100 / r, None, None) for r in rates])
bare, proj = cell("bare", [1000.0, 500.0, 510.0]), cell("projectionist", [970.0, 480.0, 400.0])
print(json.dumps([paired(proj, bare, "rps"), paired(proj, bare, "cpu_ms_per_req"),
                  paired(proj, cell("bare", [1000.0, 510.0]), "rps"), paired(proj, None, "rps")]))
""")
    by_runs, cpu, by_medians, missing = json.loads(out)
    assert abs(by_runs - 0.96) < 1e-9  # ratios 0.97, 0.96, 0.784; the ratio of medians would be 480/510
    assert abs(cpu - 1 / 0.96) < 1e-9
    assert abs(by_medians - 480 / 755) < 1e-9 and missing is None


def test_websocket_rows_served_by_several_processes_share_a_cell_run_in_sets(tmp_path: Path) -> None:
    """``--procs`` for P8: the bare relay and projectionist each serve from several processes,
    measured in sets; each row's runs pool into one cell, in the order the sets ran."""
    out = bench(f"""
import json
from pathlib import Path
from types import SimpleNamespace
import bench.__main__ as main
from bench.targets import Proc, Processes, Peers

order = []
def run(url, message, headers, concurrency, seconds):
    port = int(url.split(":")[2].split("/")[0])
    if seconds == main.WARMUP_S or seconds == 0.5:
        return SimpleNamespace(requests=1, errors=0)
    order.append(port)
    return SimpleNamespace(requests=100, errors=0, rps=float(port), p50_ms=1.0, p99_ms=2.0)
main.ws.run = run
main.cpu_ticks = lambda pids: 0
main.memory_mb = lambda pid: {{}}
args = SimpleNamespace(quick=False, runs=2, duration=2.0, rss_requests=None, loadgen="python", procs=2)
b = main.Bench(args, Processes(Path({str(tmp_path)!r})), Peers(None))
proc = lambda port: Proc("p", SimpleNamespace(pid=port), port, Path("log"))
b.measure_ws("ws-image", "{{}}", [("direct", proc(1)), ("bare", proc(2)), ("projectionist", proc(3)),
                                   ("bare", proc(4)), ("projectionist", proc(5))], 16)
print(json.dumps([[c.target, [r.rps for r in c.runs]] for c in b.results.cells]))
print(json.dumps(order))
""")
    cells, order = (json.loads(line) for line in out.splitlines()[-2:])
    assert cells == [["direct", [1.0, 1.0]], ["bare", [2.0, 4.0, 2.0, 4.0]], ["projectionist", [3.0, 5.0, 3.0, 5.0]]]
    assert order == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]


def test_instructions_counted_per_thread_give_the_main_threads_apart(tmp_path: Path) -> None:
    """``bench.instructions --threads``: callgrind's file of thread 01 is the main thread's (the
    event loop's), every other file is summed as the others' (file 10 sorts after file 09)."""
    for thread, count in (("01", 700), ("02", 20), ("09", 3), ("10", 4)):
        (tmp_path / f"callgrind.out-{thread}").write_text(f"events: Ir\nfn=main\n0 {count}\ntotals: {count}\n")
    (tmp_path / "callgrind.out.log").write_text("not a count")
    code = ("from pathlib import Path; from bench.instructions import thread_totals\n"
            f"print(thread_totals(Path({str(tmp_path / 'callgrind.out')!r})))")
    assert bench(code).strip() == "(700, 27)"
    (tmp_path / "callgrind.out-01").unlink()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode != 0 and "no per-thread counts" in done.stderr


def test_ab_together_loads_each_old_process_with_its_new_one_and_gives_the_pairs_median(tmp_path: Path) -> None:
    """``bench.ab --together``: both trees serve (here the same one) and each round loads an old and a
    new process at the same time; every round gives a pair, whose ratios' median is the figure."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "projectionist").symlink_to(ROOT)
    done = subprocess.run([sys.executable, "-m", "bench.ab", str(tree), str(tree), "--together", "--rounds", "3",
                           "--seconds", "1", "--loadgen", "python"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    rounds = {line.split(":")[0]: json.loads(line.split("rounds ")[1].split("]")[0] + "]")
              for line in lines if line.startswith(("old:", "new:"))}
    assert [len(rounds["old"]), len(rounds["new"])] == [3, 3] and min(rounds["old"] + rounds["new"]) > 0
    figure = next(line for line in lines if line.startswith("new/old CPU per request, median of 3 pairs:"))
    ratio = float(figure.split("pairs: ")[1].split()[0])
    assert 0.5 < ratio < 2.0  # the same tree: about 1, whatever the machine is doing
