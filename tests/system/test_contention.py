"""Contention on one session's log: record and quarantine appends from concurrent requests never
race into a 500 (every kind of append goes through one conditional path, serialised per
session), records never make a decision conflict, and SESSION_CONTENDED stays rare. Prints the
measured rate."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from projectionist.proxy.inbound.services import SERVICES
from tests.backends import backend_on_both  # noqa: F401  (every test here on both backends)
from tests.conftest import Harness
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]
ROUNDS, SESSIONS, CONCURRENT = 7, 4, 4


async def test_same_session_load_with_recording_never_fails_and_rarely_contends(
        make_harness: MakeHarness, backend: str) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    statuses: list[tuple[int, str | None]] = []
    color = 0
    for _ in range(ROUNDS):
        calls = []
        for s in range(SESSIONS):
            for _ in range(CONCURRENT):
                color += 1  # each request meets a missing image of its own: a quarantine to record
                calls.append(harness.chat(f"busy-{s}", ref_id(make_image(color=color % 250, width=2 + color // 250))))
        for resp in await asyncio.gather(*calls):
            statuses.append((resp.status, resp.headers.get("x-projectionist-error-code")))
    total = len(statuses)
    contended = sum(1 for status in statuses if status == (503, "SESSION_CONTENDED"))
    assert {s for s in statuses if s[0] != 200} <= {(503, "SESSION_CONTENDED")}, statuses  # never a 500
    assert contended <= total // 20
    metrics = harness.app[SERVICES].metrics
    assert metrics.errors_after_start == 0 and metrics.records_dropped["request"] == 0
    quarantines = 0
    for s in range(SESSIONS):
        events = await harness.events(f"busy-{s}")
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        quarantined = [e["data"]["attachment_id"] for e in events if e["type"] == "attachment/quarantine"]
        assert len(quarantined) == len(set(quarantined))  # one transition per failure
        quarantines += len(quarantined)
    assert quarantines == total - contended
    print(f"\ncontention ({backend}): {total} requests, {contended} SESSION_CONTENDED "
          f"({contended / total:.2%}), {metrics.records_dropped['response']} response records dropped")


async def test_a_damaged_log_row_is_503_log_corrupt_for_its_session_only(harness: Harness, backend: str) -> None:
    from projectionist.proxy.sessionlog.sqlite import SqliteLog

    gone = ref_id(make_image(color=251))
    for session in ("damaged", "healthy"):
        assert (await harness.chat(session, gone)).status == 200  # seq 1: a quarantine
    log = harness.app[SERVICES].log.inner
    garbage = b'{"type":"attachment/quarantine","seq":2,"time":"t","data":{"garbled": true}}'
    if isinstance(log, SqliteLog):
        await log._run(lambda conn: conn.execute(
            "INSERT INTO events (session, seq, type, time, body) VALUES ('damaged', 2, 'attachment/quarantine', 't', ?)",
            (garbage,)))
    else:
        table = f'"{log._schema}".projectionist_events'  # type: ignore[attr-defined]
        await log._run(lambda conn: conn.execute(  # type: ignore[attr-defined]
            f"INSERT INTO {table} (session, seq, type, time, body) VALUES ('damaged', 2, 'attachment/quarantine', 't', $1)",
            garbage))
    other = ref_id(make_image(color=252))
    resp = await harness.chat("damaged", other)
    body = await resp.json()
    assert resp.status == 503 and body["error"]["code"] == "LOG_CORRUPT" and "garbled" not in str(body)
    assert (await harness.chat("healthy", other)).status == 200  # other sessions go on


async def test_a_call_whose_record_was_dropped_is_named_as_not_recorded_by_replay(
        make_harness: MakeHarness, monkeypatch: Any) -> None:
    from projectionist.policy.errors import Unavailable
    from tests.conftest import ADMIN

    harness = await make_harness(**{"record.mode": "full"})
    services = harness.app[SERVICES]
    kept = await harness.chat("rec", ref_id(make_image(color=253)))
    await services.recording.drain()  # its records are written before the log goes down
    real = services.log.append

    async def down(session_id: str, expected: Any, data: Any, *, durable: bool = True) -> Any:
        if expected is None:
            raise Unavailable("session log unavailable", code="LOG_UNAVAILABLE")
        return await real(session_id, expected, data, durable=durable)

    monkeypatch.setattr(services.log, "append", down)
    dropped = await harness.chat("rec", ref_id(make_image(color=253)))
    await services.recording.drain()
    assert dropped.status == 200 and services.metrics.records_dropped["request"] == 1
    for resp, found in ((kept, 200), (dropped, 404)):
        answer = await harness.client.get("/admin/sessions/rec/replay", headers=ADMIN,
                                          params={"request_id": resp.headers["x-projectionist-request-id"]})
        assert answer.status == found
        if found == 404:
            body = await answer.json()
            assert body["error"]["code"] == "NOT_RECORDED" and "was not recorded" in body["error"]["message"]
