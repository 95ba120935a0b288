"""Retention through the proxy (issue 37, item 4): a session whose old records were pruned goes on
exactly as before. The next call, a restarted proxy's call and the replay of a kept call rebuild
the same upstream bytes; a pruned call's replay says it was pruned; ``projectionist prune`` does
it from the command line. Reports the log's bytes per call before and after."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from projectionist.policy.errors import ProjectionistError
from projectionist.proxy.call.replay import rebuild
from projectionist.proxy.config import Config
from projectionist.proxy.inbound.services import SERVICES
from tests.commands import cli
from tests.conftest import Harness
from tests.imaging import make_image

MakeHarness = Callable[..., Awaitable[Harness]]
FUTURE = "9999-01-01T00:00:00.000Z"


def body(*refs: str, turns: int = 1) -> dict[str, Any]:
    """A chat as an agent sends it: the history again every turn, images by reference."""
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        parts: list[dict[str, Any]] = [{"type": "text", "text": f"turn {turn}: look"}]
        parts += [{"type": "image_url", "image_url": {"url": f"attachment:{r}"}} for r in refs]
        messages += [{"role": "user", "content": parts}, {"role": "assistant", "content": f"saw {turn}"}]
    return {"model": "m", "messages": messages[:-1]}


async def call(harness: Harness, payload: dict[str, Any]) -> bytes:
    resp = await harness.client.post("/v1/chat/completions", data=msgspec.json.encode(payload),
                                     headers={"X-Session-Id": "kept", "Content-Type": "application/json"})
    assert resp.status == 200, await resp.text()
    return harness.upstream.last.body


def stored_bytes(config: Config) -> int:
    import sqlite3

    with sqlite3.connect(config.log_path) as conn:
        return int(conn.execute("SELECT sum(length(body)) FROM events").fetchone()[0])


RECORDING = {"record.mode": "metadata", "record.hold": 0, "record.batch_wait": 0}


async def recorded(harness: Harness, requests: int) -> list[Any]:
    """The session's events once its records are written (they are written off the calls' path)."""
    for _ in range(2000):  # a busy machine's record writer may take a while
        events = await harness.app[SERVICES].log.read("kept")
        answered = sum(type(e).__name__ == "ResponseEvent" or type(e).__name__ == "RequestEvent"
                       and e.data.response is not None for e in events)  # an outcome of its own, or in its record
        if answered >= requests:
            return events
        await asyncio.sleep(0.01)
    raise AssertionError(f"the records were not written: {[type(e).__name__ for e in events]}")


async def test_a_pruned_session_goes_on_byte_for_byte(make_harness: MakeHarness, make_config: Any) -> None:
    config = make_config(**RECORDING)
    harness = await make_harness(config)
    good, gone = await harness.admit(make_image(color=1)), await harness.admit(make_image(color=2))
    await harness.remove(gone)  # quarantined at the first call: a state event every later call needs
    sent = []
    for n in range(1, 6):  # the log stamps a record (to the millisecond) as it writes it, and writes in
        sent.append(await call(harness, body(good, gone, turns=n)))  # batches: each call's records are
        await recorded(harness, n)  # written, and a clock tick apart, before the next call
        await asyncio.sleep(0.003)
    log = harness.app[SERVICES].log
    events = await recorded(harness, 5)
    requests = [e for e in events if type(e).__name__ == "RequestEvent"]
    assert len(requests) == 5 and any(type(e).__name__ == "QuarantineEvent" for e in events)
    kept = requests[-1]
    payload = msgspec.json.encode(body(good, gone, turns=5))
    replayed = await rebuild(log, harness.store, "kept", kept.seq, payload)
    assert replayed.matches
    before = stored_bytes(config)

    older = [e for e in events if type(e).__name__ in ("RequestEvent", "ResponseEvent") and e.time < kept.time]
    assert {r.seq for r in requests[:4]} <= {e.seq for e in older}  # the first four calls' records
    done = await log.prune(kept.time)  # every record older than the last call
    assert done.records == len(older) and done.sessions == 1
    after = stored_bytes(config)
    print(f"\nlog bytes for 5 calls (metadata mode): {before} before, {after} after pruning {len(older)} records "
          f"({(before - after) / len(older):.0f} bytes saved per record)")
    # the next call, the same as the last: the same upstream bytes, without reading the gone image
    reads = harness.store.reads[gone]
    assert await call(harness, body(good, gone, turns=5)) == sent[-1]
    assert harness.store.reads[gone] == reads
    # the kept call replays as before; a pruned one says so
    again = await rebuild(log, harness.store, "kept", kept.seq, payload)
    assert again.matches and again.projected_digest == replayed.projected_digest
    with pytest.raises(ProjectionistError) as info:
        await rebuild(log, harness.store, "kept", requests[0].seq, msgspec.json.encode(body(good, gone, turns=1)))
    assert info.value.code == "NOT_RECORDED" and "pruned" in info.value.message
    # a restarted proxy on the same data: the same bytes again
    restarted = await make_harness(config)
    assert await call(restarted, body(good, gone, turns=5)) == sent[-1]
    # and a fork of the pruned session decides the same
    forked = await restarted.client.post("/admin/sessions/kept/fork", json={"new_session_id": "branch"},
                                         headers={"Authorization": "Bearer admintok"})
    assert forked.status in (200, 201), await forked.text()
    resp = await restarted.client.post("/v1/chat/completions", data=payload,
                                       headers={"X-Session-Id": "branch", "Content-Type": "application/json"})
    assert resp.status == 200 and restarted.upstream.last.body == sent[-1]


async def test_the_prune_command(make_harness: MakeHarness, make_config: Any, data_dir: Path) -> None:
    config = make_config(**RECORDING)
    harness = await make_harness(config)
    image = await harness.admit(make_image(color=3))
    await call(harness, body(image))
    await call(harness, body(image, turns=2))
    # with no hold, a call is one row or two (its answer apart), as the writer's batches fall
    records = sum(type(e).__name__ in ("RequestEvent", "ResponseEvent") for e in await recorded(harness, 2))
    assert records >= 2
    await harness.app[SERVICES].log.close()  # the command opens the file itself
    code, out, err = await cli("prune", "--data-dir", str(data_dir), "--older-than", "1")
    assert code == 0, err
    assert out.startswith("pruned 0 records in 0 sessions older than 1 days")  # nothing is a day old
    code, out, err = await cli("prune", "--data-dir", str(data_dir), "--older-than", "0", "--json")
    assert code == 0, err
    report = msgspec.json.decode(out)
    assert report["records"] == records and report["sessions"] == 1 and report["bytes_after"] < report["bytes_before"]
    code, out, err = await cli("timeline", "kept", "--data-dir", str(data_dir), "--json")
    assert code == 0, err
    kinds = [e["type"] for e in msgspec.json.decode(out)["events"]]
    assert kinds.count("record/pruned") == records and "request/recorded" not in kinds
    for bad in ("-1", "nan", "inf"):
        code, _, err = await cli("prune", "--data-dir", str(data_dir), "--older-than", bad)
        assert code == 2 and "INVALID_CONFIG" in err, (bad, err)
