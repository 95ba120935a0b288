"""What a ``metadata`` record of a plain text call costs the log (proxy layer, call sublayer):
the bytes the docs state next to the retention policy (``docs/guide/replay.md``), held here so
that a field added to every record shows."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from projectionist.proxy.inbound.services import SERVICES
from projectionist.policy.events import REQUEST
from projectionist.proxy.sessionlog.base import split_records

#: The bound the docs promise for a text call's record beside the headers it went upstream with
#: ("about 600 bytes and its headers"); a record that grows past it must say why in the docs.
TEXT_RECORD_MAX = 620
#: What such a call costs the SQLite log's rows (``events.encode_calls``: request id, digest,
#: status, latency, usage), beside what the calls of a row share and it holds once (route, path,
#: headers): the bytes per call the docs state.
STORED_CALL_MAX = 200


def body(turn: int) -> bytes:
    words = " ".join(["the proxy forwards this request unchanged"] * 20)
    return json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": f"{words} {turn}"}]}).encode()


async def test_a_text_calls_metadata_record_is_under_its_stated_bytes(make_harness: Any, tmp_path: Path) -> None:
    """Ten 1 KB text calls of one session, as the bench's P1 sends them: each is one record (the
    call's outcome in its request record) in the log's rows,
    holding what replay and the console read (route, digests, status, latency, usage, the
    headers it went with) and no credential: at most ``TEXT_RECORD_MAX`` bytes beside its headers.
    The SQLite log stores them in a third of that: ``STORED_CALL_MAX`` a call, beside what the
    calls of a row share."""
    harness = await make_harness(**{"record.mode": "metadata"})
    headers = {"Content-Type": "application/json", "X-Session-Id": "sized", "Authorization": "Bearer sk-secret"}
    for turn in range(10):
        resp = await harness.client.post("/v1/chat/completions", data=body(turn), headers=headers)
        assert resp.status == 200, await resp.text()
    await harness.app[SERVICES].recording.drain()
    config = harness.app[SERVICES].config
    path = Path(config.server.data_dir) / "sessions.sqlite3"
    with sqlite3.connect(path) as conn:
        rows = [bytes(b) for (b,) in conn.execute("SELECT body FROM events WHERE session = 'sized' ORDER BY seq")]
    records = [raw for row in rows for raw in split_records(row)]
    assert len(records) == 10
    for raw in records:
        event = json.loads(raw)
        assert event["type"] == REQUEST and event["data"]["response"]["status"] == 200
        assert event["data"]["response"]["usage"]  # what the console sums
        assert b"sk-secret" not in raw
        sent = json.dumps(event["data"]["headers"], separators=(",", ":")).encode()
        assert len(raw) - len(sent) <= TEXT_RECORD_MAX, (len(raw) - len(sent), raw)
    # stored: rows of whole calls (``events.encode_calls``), what the calls share once a row
    stored = [json.loads(row) for row in rows]
    assert all(row[0] == "calls" for row in stored) and sum(len(row[4]) for row in stored) == 10
    shared = sum(len(json.dumps(row[3], separators=(",", ":"))) for row in stored)
    assert sum(map(len, rows)) - shared <= STORED_CALL_MAX * len(records), (sum(map(len, rows)), shared)
    assert sum(map(len, rows)) * 3 < sum(map(len, records))
