"""A session exists once its log holds an event: ``GET /admin/sessions/{sid}/events`` and
``.../quarantine`` of one that holds none answer 404 ``SESSION_NOT_FOUND``, as its summary does,
while a known session with nothing past ``?after=`` is still 200 with no events. Telling them apart
costs the read itself, and one look at the log's index only for an empty read past ``after``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from projectionist.proxy.inbound.services import SERVICES
from tests.backends import BACKENDS
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image

MakeHarness = Callable[..., Awaitable[Harness]]


async def get(harness: Harness, path: str, **params: str) -> tuple[int, Any]:
    resp = await harness.client.get(path, headers=ADMIN, params=params)
    return resp.status, await resp.json()


def count_index_looks(harness: Harness) -> list[str]:
    """The sessions the log's index is asked about (``session_stats``), as they are asked."""
    inner = harness.app[SERVICES].log.inner
    asked: list[str] = []
    stats = inner.session_stats

    async def counted(session: str | None = None, limit: int | None = None) -> Any:
        asked.append(session or "")
        return await stats(session, limit)
    inner.session_stats = counted  # type: ignore[method-assign]
    return asked


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_events_and_quarantine_of_an_unknown_session_are_its_404(make_harness: MakeHarness) -> None:
    harness = await make_harness()
    aid = await harness.admit(make_image(color=4))
    await harness.remove(aid)
    assert (await harness.chat("known", aid)).status == 200  # one quarantine: the session exists
    asked = count_index_looks(harness)
    for path, params in [("/admin/sessions/nobody", {}), ("/admin/sessions/nobody/events", {}),
                         ("/admin/sessions/nobody/events", {"after": "0"}),
                         ("/admin/sessions/nobody/events", {"after": "5"}),
                         ("/admin/sessions/nobody/quarantine", {})]:
        status, body = await get(harness, path, **params)
        assert (status, body["error"]["code"]) == (404, "SESSION_NOT_FOUND"), (path, params)
    assert asked == ["nobody", "nobody"]  # the summary's one query, and the read past after=5; no more

    del asked[:]
    status, body = await get(harness, "/admin/sessions/known/events")
    assert status == 200 and [e["type"] for e in body["events"]] == ["attachment/quarantine"]
    last = body["events"][-1]["seq"]
    assert asked == []  # events found: the read was the only query
    for after in (str(last), str(last + 1), str(2**40)):
        assert await get(harness, "/admin/sessions/known/events", after=after) == (
            200, {"session": "known", "events": []}), after  # a known session with nothing past N
    assert asked == ["known"] * 3
    status, body = await get(harness, "/admin/sessions/known/quarantine")
    assert status == 200 and [q["attachment_id"] for q in body["quarantined"]] == [aid]
    assert body["last_seq"] == last


async def test_a_forked_session_exists_from_its_fork(harness: Harness) -> None:
    aid = await harness.admit(make_image(color=5))
    await harness.remove(aid)
    assert (await harness.chat("parent", aid)).status == 200
    resp = await harness.client.post("/admin/sessions/parent/fork", json={"new_session_id": "child"}, headers=ADMIN)
    assert resp.status == 201
    status, body = await get(harness, "/admin/sessions/child/events")
    assert status == 200 and body["events"]
    assert (await get(harness, "/admin/sessions/child/quarantine"))[0] == 200


async def test_the_answers_stay_behind_the_admin_token(harness: Harness) -> None:
    for path in ("/admin/sessions/nobody/events", "/admin/sessions/nobody/quarantine"):
        resp = await harness.client.get(path)
        assert resp.status == 401 and (await resp.json())["error"]["code"] == "ADMIN_UNAUTHORIZED"
        resp = await harness.client.get(path, headers=ADMIN, params={"after": "-1"} if "events" in path else {})
        assert resp.status == (400 if "events" in path else 404)


async def test_recovering_in_a_session_that_does_not_exist_is_its_404_and_writes_nothing(harness: Harness) -> None:
    """The console's Recover button and the admin API, as the CLI: no session, no recovery."""
    aid = await harness.admit(make_image(color=5))
    resp = await harness.client.post(f"/admin/sessions/nobody/attachments/{aid}/recover", headers=ADMIN)
    assert resp.status == 404 and (await resp.json())["error"]["code"] == "SESSION_NOT_FOUND"
    assert await harness.events("nobody") == []
