"""``projectionist demo`` keeps telling the pinned story: the snapshot is compared byte for byte."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec

from projectionist.proxy.ops.demo import run_demo, write_snapshot
from tests.paths import SNAPSHOTS

SNAPSHOT = SNAPSHOTS / "demo.json"


async def test_demo_snapshot_matches_the_pinned_one(tmp_path: Path) -> None:
    lines: list[str] = []
    snapshot = await run_demo(lines.append)
    out = tmp_path / "demo.json"
    write_snapshot(snapshot, str(out))
    assert out.read_text() == SNAPSHOT.read_text(), "demo story changed: inspect, then regenerate with " \
        "`projectionist demo --json tests/snapshots/demo.json`"
    assert any("HTTP 409 ATTACHMENT_CORRUPT" in line for line in lines)


def test_pinned_snapshot_tells_the_whole_story() -> None:
    snapshot = msgspec.json.decode(SNAPSHOT.read_bytes())
    steps = {s["step"]: s for s in snapshot["steps"]}
    quarantines = [e for e in steps["second request"]["events"] if e["type"] == "attachment/quarantine"]
    assert [q["data"]["failure"] for q in quarantines] == ["not_found", "corrupt"]
    assert steps["restart"]["identical"] is True and steps["fork"]["identical"] is True
    assert steps["repair and recover"]["recovered"] is True
    assert steps["refused recovery"] == {"step": "refused recovery", "status": 409, "code": "ATTACHMENT_CORRUPT",
                                         "events_appended": 0}
    assert [e["type"] for e in snapshot["events"]["demo"]] == [
        "attachment/quarantine", "attachment/quarantine", "attachment/recovered", "attachment/rejected"]
    refused = steps["upstream refuses an image"]
    assert refused["statuses"] == [200, 200] and refused["upstream_calls"] == [2, 1]
    [rejected] = refused["events"]
    assert (rejected["type"], rejected["data"]["format"], rejected["data"]["suspects"]) == ("attachment/rejected", "openai", 1)
    assert rejected["data"]["name"] == "chart.png"
    assert "base64,<sha256:" in SNAPSHOT.read_text() and all(len(line) < 200 for line in SNAPSHOT.read_text().splitlines())


def test_demo_command_line_writes_the_same_snapshot(tmp_path: Path) -> None:
    out = tmp_path / "snap.json"
    run = subprocess.run([sys.executable, "-m", "projectionist.proxy.ops.cli", "demo", "--json", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "The session survived" in run.stdout
    assert out.read_bytes() == SNAPSHOT.read_bytes()
