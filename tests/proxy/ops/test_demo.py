"""``projectionist demo`` keeps telling the pinned story: the snapshot is compared byte for byte;
``--keep`` leaves its data and the commands to look at it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import aiohttp
import msgspec

from projectionist.proxy.ops.demo import KEEP_HINT, run_demo, write_snapshot
from tests.commands import cli, served
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


def test_without_keep_the_data_is_gone_and_the_last_line_says_how_to_keep_it(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "projectionist.proxy.ops.cli", "demo"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    first, *_, last = run.stdout.splitlines()
    data = first.rpartition(", data in ")[2]
    assert data.startswith(str(tmp_path)) and not Path(data).exists()
    assert re.search(r"console on http://127\.0\.0\.1:\d+/admin/ui", first)
    assert last == KEEP_HINT


async def test_keep_leaves_data_that_the_printed_commands_serve_and_inspect(tmp_path: Path) -> None:
    """``demo --keep``: the data dir stays, and the commands it prints work on it: ``timeline`` of
    the story's session, and ``serve`` (here on free ports) whose console signs in with the token
    file it names and shows the session."""
    rc, out, err = await cli("demo", "--keep", env={**os.environ, "TMPDIR": str(tmp_path)})
    assert rc == 0, err
    lines = out.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("The data is kept in ")))
    data = lines[at].removeprefix("The data is kept in ").removesuffix(". To look at it:")
    timeline, serve = (shlex.split(line) for line in lines[at + 1:at + 3])
    assert data.startswith(str(tmp_path)) and (Path(data) / "sessions.sqlite3").is_file()
    assert timeline == ["projectionist", "timeline", "demo", "--data-dir", data]
    token_file = Path(data) / "admin-token"
    assert serve == ["projectionist", "serve", "--data-dir", data, "--admin-token-file", str(token_file),
                     "--fake-upstream"]
    assert lines[at + 3].endswith(f"sign in with the token in {token_file}.") and lines[at + 3] == lines[-1]
    assert token_file.stat().st_mode & 0o077 == 0  # the token is its owner's alone

    rc, out, _ = await cli(*timeline[1:])
    assert rc == 0 and "attachment/quarantine" in out and "attachment/rejected" in out

    jar = aiohttp.CookieJar(unsafe=True)  # the console's sign-in cookie, on an IP address
    async with served(*serve[2:], lines=3) as proxy, aiohttp.ClientSession(cookie_jar=jar) as http:
        assert proxy.banner[1].endswith("(sign in with the admin token)")
        token = token_file.read_text().strip()
        sign_in = {"token": token, "next": "/admin/ui/sessions/demo"}
        async with http.post(f"{proxy.admin_url}/admin/ui/login", data=sign_in) as resp:
            page = await resp.text()
            assert resp.status == 200 and "<h1>Session <code>demo</code></h1>" in page
            assert "chart.png" in page  # the image the upstream refused, still quarantined
