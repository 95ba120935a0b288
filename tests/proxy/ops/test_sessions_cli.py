"""``projectionist sessions`` and ``timeline``: readable tables (and ``--json``) from the data dir,
one line per event with a short summary per type and never a body; ``--version``; and help for
every verb and every flag."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import re
import sys
from pathlib import Path

import msgspec
import pytest

from projectionist.policy.events import (
    Checkpoint,
    Held,
    Quarantine,
    Recovered,
    RefRecord,
    Rejected,
    RequestRecorded,
    ResponseRecorded,
    Variant,
    encode_event,
    envelope,
)
from projectionist.proxy.ops import cli
from projectionist.proxy.ops.tables import describe
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.stores.filesystem import FilesystemStore

A = "sha256:" + "a1" * 32
B = "sha256:" + "b2" * 32
V = "sha256:" + "c3" * 32
BLOB = "sha256:" + "d4" * 32


def ticking() -> object:
    times = iter(f"2025-03-01T10:00:{n:02d}.000Z" for n in range(60))
    return lambda: next(times)


async def fill(data: Path) -> None:
    """A session with one event of every type, a quiet one, and a fork, in the embedded data dir."""
    FilesystemStore(data / "attachments")
    log = SqliteLog(data / "sessions.sqlite3", clock=ticking())  # type: ignore[arg-type]
    request = RequestRecorded(
        request_id="b2ed8e0000000003", route="openai_chat", adapter="openai_chat", upstream="openai",
        method="POST", path="/v1/chat/completions", log_seq=0, inbound_digest=BLOB, projected_digest=BLOB,
        refs=(RefRecord("/messages/0/content/1", A, "inlined"), RefRecord("/messages/0/content/2", B, "placeholder",
                                                                          failure="not_found")),
        inbound_blob=BLOB)
    response = ResponseRecorded(request_id="b2ed8e0000000003", request_seq=1, status=200, latency_ms=412.4,
                                usage={"prompt_tokens": 5, "completion_tokens": 12, "details": {"cached": 1}},
                                response_blob=BLOB)
    quarantine = Quarantine(B, "not_found", False, name="shot\n.png")
    try:
        await log.append("agent", 0, [request])
        await log.append("agent", 1, [response])
        await log.append("agent", 2, [quarantine, Quarantine(A, "read_failed", True)])
        rejected = Rejected(V, "anthropic", 2, BLOB, name="big.png")
        variant = Variant(B, "anthropic@2000", V, "image/jpeg", 5120, 2000, 1250, "fit")
        await log.append("agent", 4, [rejected, Recovered(A, 80345, "image/png", 1280, 800, automatic=True), variant])
        await log.append("agent", None, [Checkpoint(7, (Held(quarantine, "t"),), (variant,), (rejected,))],
                         durable=False)
        await log.append("quiet", 0, [ResponseRecorded("r", 0, 502, 3.0, error_code="UPSTREAM_UNAVAILABLE")])
        await log.fork("agent", "agent-2", at_seq=3)
    finally:
        await log.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    asyncio.run(fill(tmp_path / "data"))
    return tmp_path / "data"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    assert err == ""
    return rc, out


def test_timeline_is_one_readable_line_per_event(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run(capsys, "timeline", "agent", "--data-dir", str(data))
    assert rc == 0
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["SEQ", "TIME", "TYPE", "SUMMARY"]
    assert [line.split()[0] for line in lines[1:]] == [str(n) for n in range(1, 9)]
    start = lines[0].index("SUMMARY")  # every summary starts in its column
    summaries = [line[start:] for line in lines[1:]]
    assert [line.split()[2] for line in lines[1:]] == [
        "request/recorded", "response/recorded", "attachment/quarantine", "attachment/quarantine",
        "attachment/rejected", "attachment/recovered", "attachment/variant", "session/checkpoint"]
    assert summaries == [
        "POST /v1/chat/completions -> openai (openai_chat); refs: 1 inlined, 1 placeholder; request b2ed8e0000000003",
        "HTTP 200; 412 ms; usage prompt_tokens=5 completion_tokens=12; body recorded; request b2ed8e0000000003",
        'sha256:b2b2b2b2 not_found "shot\\n.png"',
        "sha256:a1a1a1a1 read_failed (retryable)",
        'sha256:c3c3c3c3 refused by anthropic upstreams "big.png"; 2 suspects',
        "sha256:a1a1a1a1 verified: image/png 1280x800, 80345 bytes (automatic)",
        "sha256:b2b2b2b2 -> sha256:c3c3c3c3 for anthropic@2000: image/jpeg 2000x1250, 5120 bytes",
        "state at seq 7: 1 quarantined, 1 rejected, 1 variants",
    ]
    assert lines[1].split()[1] == "2025-03-01T10:00:00.000Z"  # the time as stored
    for whole in (A, B, V, BLOB):
        assert whole not in out  # ids shortened; blobs and bodies never printed

    rc, out = run(capsys, "timeline", "agent", "--after", "6", "--data-dir", str(data))
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["7", "8"]
    rc, out = run(capsys, "timeline", "agent-2", "--data-dir", str(data))
    assert out.splitlines()[-1].split(None, 3)[2:] == ["session/forked", "from agent at seq 3"]


def test_timeline_json_is_what_events_prints(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, as_json = run(capsys, "timeline", "agent", "--json", "--data-dir", str(data))
    rc2, events = run(capsys, "events", "agent", "--data-dir", str(data))
    assert rc == rc2 == 0 and as_json == events
    document = msgspec.json.decode(as_json)
    assert document["session"] == "agent" and len(document["events"]) == 8


def test_sessions_lists_counts_quarantines_and_last_activity(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run(capsys, "sessions", "--data-dir", str(data))
    assert rc == 0
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()]
    assert rows == [
        ["SESSION", "EVENTS", "QUARANTINED", "LAST ACTIVITY"],
        ["agent-2", "4", "1", "2025-03-01T10:00:06.000Z"],   # the fork at seq 3: B; its marker is the latest event
        ["quiet", "1", "0", "2025-03-01T10:00:05.000Z"],
        ["agent", "8", "2", "2025-03-01T10:00:04.000Z"],     # B quarantined, V rejected; A recovered
    ]
    header = out.splitlines()[0]
    assert all(line.index(line.split()[-1]) == header.index("LAST ACTIVITY") for line in out.splitlines()[1:])

    rc, out = run(capsys, "sessions", "--json", "--limit", "1", "--data-dir", str(data))
    assert msgspec.json.decode(out) == {"sessions": [{"session": "agent-2", "events": 4, "quarantined": 1,
                                                      "last_seq": 4, "last_activity": "2025-03-01T10:00:06.000Z"}]}
    rows_before = asyncio.run(SqliteLog(data / "sessions.sqlite3").session_stats())
    assert sum(s.events for s in rows_before) == 13  # listing wrote nothing (no checkpoint)


def test_sessions_of_an_empty_or_missing_data_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sessions", "--data-dir", str(tmp_path / "nothing")]) == 2
    assert "EMPTY_DATA_DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        cli.main(["sessions", "--limit", "0"])
    assert usage.value.code == 2 and "--limit" in capsys.readouterr().err


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"projectionist {importlib.metadata.version('projectionist')}"


def _parsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(parser.prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += _parsers(child)
    return found


def test_every_verb_and_every_flag_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    [verbs] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [f"{prog}: {action.dest}" for prog, p in _parsers(parser) for action in p._actions
               if not action.help or action.help == argparse.SUPPRESS]
    missing += [f"projectionist {choice.dest}" for choice in verbs._choices_actions if not choice.help]
    assert missing == []
    assert {"serve", "demo", "sessions", "timeline", "events", "quarantine", "recover", "replay", "fork"} \
        <= set(verbs.choices)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for choice in verbs._choices_actions:
        assert f"{choice.dest} {' '.join(str(choice.help).split())}" in text  # each verb with its one line
    for prog, sub in _parsers(parser)[1:]:
        assert sub.description, prog


def test_a_call_recorded_in_one_row_shows_its_outcome_on_its_own_line() -> None:
    outcome = ResponseRecorded("r1", 0, 200, 41.6, usage={"prompt_tokens": 5})
    request = RequestRecorded(request_id="r1", route="openai_chat", adapter="openai_chat", upstream="openai",
                              method="POST", path="/v1/chat/completions", log_seq=0, inbound_digest=BLOB,
                              projected_digest=BLOB, refs=(RefRecord("/messages/0/content/1", A, "inlined"),),
                              response=outcome)
    assert describe(envelope(1, "t", request)) == (
        "POST /v1/chat/completions -> openai (openai_chat); refs: 1 inlined => HTTP 200; 42 ms; usage prompt_tokens=5;"
        " request r1")


def test_timeline_of_no_such_session_is_its_404(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["timeline", "no-such-session", "--data-dir", str(data)])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and "SESSION_NOT_FOUND" in err  # as GET /admin/sessions/{sid} answers 404
    rc, out = run(capsys, "timeline", "agent", "--after", "99", "--data-dir", str(data))
    assert rc == 0 and out.splitlines()[1:] == []  # a session with nothing after N is still a session


async def test_a_reader_that_leaves_early_is_no_traceback(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "data" / "sessions.sqlite3")
    try:  # far more output than a pipe holds
        await log.append("big", 0, [Quarantine("sha256:" + f"{n:064x}", "not_found", False) for n in range(3000)])
    finally:
        await log.close()
    for verb in ("events big", "timeline big"):
        process = await asyncio.create_subprocess_shell(
            f"{sys.executable} -m projectionist.proxy.ops.cli {verb} --data-dir {tmp_path / 'data'} | head -1",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert out and b"Traceback" not in err and b"BrokenPipe" not in err, err


async def test_the_admin_token_comes_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("file-held-token\n")
    config = cli.config_from_args(cli.build_parser().parse_args(
        ["serve", "--admin-token-file", str(secret), "--data-dir", str(tmp_path / "d")]))
    assert config.server.admin_token == "file-held-token"
    with pytest.raises(Exception) as refused:
        cli.config_from_args(cli.build_parser().parse_args(["serve", "--admin-token-file", str(tmp_path / "none")]))
    assert getattr(refused.value, "code", "") == "INVALID_CONFIG" and "--admin-token-file" in str(refused.value)
