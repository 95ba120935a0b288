"""Red team: one hand-edited / corrupt record row stops retention for the whole log, for good.

``pruned_row`` decodes every record it prunes (``_stamp.decode``) and nothing catches the error:
the transaction rolls back (the up to 255 good rows of its batch with it) and ``prune`` raises a
bare ``msgspec.DecodeError``, not ``LogCorrupt``. The server's ``keep_pruning`` logs
``log_prune_failed`` and tries again an hour later, meeting the same row first: no session after
it in key order (nor before it in its batch) is ever pruned again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from projectionist.proxy.sessionlog.sqlite import SqliteLog
from tests.proxy.sessionlog.test_log_contract import record

OLD, CUT = "2020-01-01T00:00:00.000Z", "2021-01-01T00:00:00.000Z"


async def test_one_corrupt_record_does_not_stop_the_prune_of_every_other_session(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    log = SqliteLog(path, clock=lambda: OLD)
    await log.start()
    for session in ("a-broken", "b-fine", "c-fine"):
        await log.append(session, None, [record()])
    await log.close()
    with sqlite3.connect(path) as conn:  # someone edits one record by hand
        conn.execute("UPDATE events SET body = ? WHERE session = 'a-broken'", (b'{"type":"response/recorded"',))
    log = SqliteLog(path)
    await log.start()
    error: Exception | None = None
    try:
        await log.prune(CUT)
    except Exception as exc:  # noqa: BLE001
        error = exc
    kinds = [type(e).__name__ for e in await log.read("c-fine")]
    await log.close()
    assert kinds == ["UnknownEvent"], f"c-fine not pruned; prune raised {type(error).__name__}: {error}"
