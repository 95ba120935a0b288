"""``GET /admin/sessions`` and ``GET /admin/sessions/{sid}``: the summaries the log and the fold
give, the most recently active first, behind the admin token, with ``?limit=`` checked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.sessionlog.summary import summaries
from tests.backends import BACKENDS
from tests.calls import recorded_calls
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image

MakeHarness = Callable[..., Awaitable[Harness]]


async def get(harness: Harness, path: str, **kwargs: Any) -> tuple[int, Any]:
    resp = await harness.client.get(path, headers=kwargs.pop("headers", ADMIN), **kwargs)
    return resp.status, await resp.json()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_sessions_are_listed_with_their_counts_and_quarantines(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    healthy = await harness.admit(make_image(color=1))
    gone = [await harness.admit(make_image(color=c)) for c in (2, 3)]
    for aid in gone:
        await harness.remove(aid)
    assert (await harness.chat("quiet", healthy)).status == 200               # 1 call recorded
    assert (await harness.chat("broken", healthy, *gone)).status == 200       # 2 quarantines + 1 call
    assert (await harness.chat("broken", healthy, *gone)).status == 200       # 1 more call
    status, body = await get(harness, "/admin/sessions")
    assert status == 200
    listed = {s["session"]: s for s in body["sessions"]}
    assert [s["session"] for s in body["sessions"]] == ["broken", "quiet"]  # the most recent first
    quiet, events = await harness.events("quiet"), await harness.events("broken")
    # a call is one row or two (its outcome in a record of its own, when it ended after the writer
    # took its request): the counts are the log's
    assert len(recorded_calls(quiet)) == 1 and len(recorded_calls(events)) == 2
    assert listed["quiet"] | {"last_activity": ""} == {"session": "quiet", "events": len(quiet), "quarantined": 0,
                                                        "last_seq": quiet[-1]["seq"], "last_activity": ""}
    assert listed["broken"] | {"last_activity": ""} == {"session": "broken", "events": len(events),
                                                         "quarantined": 2, "last_seq": events[-1]["seq"],
                                                         "last_activity": ""}
    assert listed["broken"]["last_activity"] == events[-1]["time"]  # as the log stored it
    # the same summaries the CLI and the admin page get from sessionlog.summary
    direct = await summaries(harness.app[SERVICES].log)
    assert [s.session for s in direct] == ["broken", "quiet"] and direct[0].quarantined == 2

    assert await get(harness, "/admin/sessions/broken") == (200, listed["broken"])
    status, one = await get(harness, "/admin/sessions", params={"limit": "1"})
    assert (status, [s["session"] for s in one["sessions"]]) == (200, ["broken"])


async def test_the_summary_follows_a_recovery(harness: Harness) -> None:
    image = make_image(color=9)
    aid = await harness.admit(image)
    await harness.remove(aid)
    assert (await harness.chat("s", aid)).status == 200
    assert (await get(harness, "/admin/sessions/s"))[1]["quarantined"] == 1
    assert await harness.admit(image) == aid
    resp = await harness.client.post(f"/admin/sessions/s/attachments/{aid}/recover", headers=ADMIN)
    assert resp.status == 200 and (await resp.json())["recovered"] is True
    summary = (await get(harness, "/admin/sessions/s"))[1]
    events = await harness.events("s")
    assert [e["type"] for e in events] == ["attachment/quarantine", "attachment/recovered"]
    assert (summary["quarantined"], summary["events"], summary["last_seq"]) == (0, 2, 2)


async def test_unknown_sessions_bad_queries_and_missing_tokens_are_refused(harness: Harness) -> None:
    assert (await get(harness, "/admin/sessions"))[1] == {"sessions": []}
    status, body = await get(harness, "/admin/sessions/nobody")
    assert (status, body["error"]["code"]) == (404, "SESSION_NOT_FOUND")
    for bad in ("0", "-1", "x", "1.5", "100001", "９", ""):
        status, body = await get(harness, "/admin/sessions", params={"limit": bad})
        assert (status, body["error"]["code"]) == (400, "INVALID_QUERY"), bad
    for path in ("/admin/sessions", "/admin/sessions/s"):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            status, body = await get(harness, path, headers=headers)
            assert (status, body["error"]["code"]) == (401, "ADMIN_UNAUTHORIZED"), (path, headers)
    status, body = await get(harness, "/admin/sessions/" + "x" * 330)
    assert (status, body["error"]["code"]) == (400, "INVALID_SESSION_ID")
    assert harness.upstream.received == []
