"""``projectionist timeline|events|quarantine|recover|fork|replay`` of a session whose log holds no
event exit 1 with ``SESSION_NOT_FOUND``, print nothing and write nothing (``recover`` once exited
0), as the admin API answers 404; a known session with nothing past ``--after`` is still a
session (exit 0, no events)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from projectionist.policy.events import Quarantine
from projectionist.proxy.ops import cli
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.stores.filesystem import FilesystemStore

GONE = "sha256:" + "e5" * 32


async def fill(data: Path) -> None:
    FilesystemStore(data / "attachments")
    log = SqliteLog(data / "sessions.sqlite3")
    try:
        await log.append("known", 0, [Quarantine(GONE, "not_found", False)])
    finally:
        await log.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    asyncio.run(fill(tmp_path / "data"))
    return tmp_path / "data"


@pytest.mark.parametrize("verb", [["timeline"], ["timeline", "--json"], ["events"], ["events", "--after", "3"],
                                  ["quarantine"], ["recover", GONE], ["fork", "copy"], ["replay"]])
def test_a_session_verb_of_an_unknown_session_is_session_not_found(
        data: Path, capsys: pytest.CaptureFixture[str], verb: list[str]) -> None:
    rc = cli.main([verb[0], "nobody", *verb[1:], "--data-dir", str(data)])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and "SESSION_NOT_FOUND" in err
    assert cli.main(["sessions", "--json", "--data-dir", str(data)]) == 0  # and nothing was written
    assert [s["session"] for s in json.loads(capsys.readouterr().out)["sessions"]] == ["known"]


def test_a_known_session_answers_even_with_nothing_past_after(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["events", "known", "--data-dir", str(data)]) == 0
    [event] = json.loads(capsys.readouterr().out)["events"]
    assert event["type"] == "attachment/quarantine"
    assert cli.main(["events", "known", "--after", "1", "--data-dir", str(data)]) == 0
    assert json.loads(capsys.readouterr().out) == {"session": "known", "events": []}
    assert cli.main(["quarantine", "known", "--data-dir", str(data)]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["last_seq"] == 1 and [q["attachment_id"] for q in view["quarantined"]] == [GONE]
    assert cli.main(["timeline", "known", "--after", "9", "--json", "--data-dir", str(data)]) == 0
    assert json.loads(capsys.readouterr().out) == {"session": "known", "events": []}
