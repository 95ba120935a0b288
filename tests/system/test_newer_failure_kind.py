"""A rolling deploy: a newer replica records a quarantine whose ``failure`` this version has no row
for in its failure table (``policy/failures.py``). This replica reads that log as it is: no
``LOG_CORRUPT``, the image gets the generic placeholder (``unavailable``) without a read or a
probe, the session takes new events, and an operator's verified recovery lifts it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]
FUTURE = "some_future_kind"


async def _written_by_a_newer_replica(harness: Harness, session: str, attachment_id: str) -> None:
    """Seq 1 of ``session``: a quarantine of a kind this version does not know, as the newer
    replica's JSON has it (retryable, long ago: a probe would be due if this kind were probed)."""
    body = (b'{"type":"attachment/quarantine","seq":1,"time":"2020-01-01T00:00:00.000Z","data":{"attachment_id":"'
            + attachment_id.encode() + b'","failure":"' + FUTURE.encode() + b'","retryable":true,"name":"shot.png"}}')
    log = harness.app[SERVICES].log.inner
    assert isinstance(log, SqliteLog)
    await log._run(lambda conn: conn.execute(
        "INSERT INTO events (session, seq, type, time, body) VALUES (?, 1, 'attachment/quarantine', ?, ?)",
        (session, "2020-01-01T00:00:00.000Z", body)))


async def test_an_older_replica_reads_a_newer_failure_kind_as_the_generic_placeholder(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "metadata", "policy.retryable_probe_after": 0.01})
    shot = await harness.admit(make_image(color=61))
    await _written_by_a_newer_replica(harness, "rolling", shot)

    resp = await harness.chat("rolling", shot)
    assert resp.status == 200, await resp.text()
    part = harness.upstream.last.json()["messages"][0]["content"][1]
    assert part == {"type": "text", "text": f'[image unavailable: unavailable; "shot.png" ({shot[:15]})]'}
    assert harness.store.reads[shot] == 0  # neither read nor probed

    # the session goes on: a new failure is recorded after the newer event, which stays as written
    gone = ref_id(make_image(color=62))
    assert (await harness.chat("rolling", gone)).status == 200
    events = await harness.events("rolling")
    quarantines = [(e["seq"], e["data"]["failure"]) for e in events if e["type"] == "attachment/quarantine"]
    assert quarantines[0] == (1, FUTURE) and quarantines[1][1] == "not_found"

    # only an operator's verified recovery lifts it; then the image goes again
    recovered = await harness.client.post(f"/admin/sessions/rolling/attachments/{shot}/recover", headers=ADMIN)
    assert recovered.status == 200 and (await recovered.json())["recovered"] is True
    assert (await harness.chat("rolling", shot)).status == 200
    assert harness.upstream.last.json()["messages"][0]["content"][1]["type"] == "image_url"
