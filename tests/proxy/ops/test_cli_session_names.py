"""The verbs that take a session find it by the name its client gave it. With client tokens the log
holds each client's sessions under its tenant (``key-…~name``): a name one tenant has is that
session (said on stderr), a name several tenants have is ``SESSION_AMBIGUOUS`` listing their ids,
and an id as the log holds it still works. ``recover`` of a session that does not exist is
``SESSION_NOT_FOUND`` like ``timeline``; ``replay`` takes its session as an argument, and still as
``--session``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from tests.commands import cli, served
from tests.imaging import make_image, ref_id


def tenant(token: str) -> str:
    return "key-" + hashlib.sha256(token.encode()).hexdigest()[:12]


ONE, TWO = tenant("tok-1"), tenant("tok-2")
IMAGE = make_image(7, 5, color=33)
MISSING = ref_id(IMAGE)


async def chat(http: aiohttp.ClientSession, base: str, token: str, session: str, *content: dict[str, Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *content]}]}
    async with http.post(f"{base}/v1/chat/completions", json=body,
                         headers={"Authorization": f"Bearer {token}", "X-Session-Id": session}) as resp:
        assert resp.status == 200, await resp.text()


@pytest.fixture
async def data(tmp_path: Path) -> Path:
    """A data dir written by a real ``serve`` with two client tokens (and the fake upstream), in
    ``full`` record mode: tok-1's ``agent`` with a missing image quarantined, and a ``shared``
    session of each token; the image then admitted, so that it can be recovered."""
    config = tmp_path / "full.toml"
    config.write_text('[record]\nmode = "full"\n')
    env = {**os.environ, "PROJECTIONIST_CLIENT_TOKENS": "tok-1,tok-2"}
    async with served("--fake-upstream", "--config", str(config), "--data-dir", str(tmp_path / "data"), lines=3,
                      env=env) as serve, aiohttp.ClientSession() as http:
        await chat(http, serve.url, "tok-1", "agent",
                   {"type": "image_url", "image_url": {"url": f"attachment:{MISSING}?name=shot.png"}})
        await chat(http, serve.url, "tok-1", "shared")
        await chat(http, serve.url, "tok-2", "shared")
        async with http.post(f"{serve.url}/v1/attachments", data=IMAGE,
                             headers={"Content-Type": "image/png", "Authorization": "Bearer tok-1"}) as resp:
            assert (await resp.json())["id"] == MISSING
    return tmp_path / "data"


async def test_a_session_is_found_by_its_clients_name_when_one_tenant_has_it(data: Path) -> None:
    rc, out, _ = await cli("sessions", "--json", "--data-dir", str(data))
    assert {s["session"] for s in msgspec.json.decode(out)["sessions"]} == {f"{ONE}~agent", f"{ONE}~shared",
                                                                             f"{TWO}~shared"}
    for verb in (["timeline", "agent"], ["events", "agent"], ["quarantine", "agent"]):
        rc, out, err = await cli(*verb, "--data-dir", str(data))
        assert rc == 0, (verb, err)
        assert f"session 'agent' is '{ONE}~agent' in the log" in err
        assert out  # the session's own output
    rc, out, _ = await cli("quarantine", "agent", "--data-dir", str(data))
    view = msgspec.json.decode(out)
    assert view["session"] == f"{ONE}~agent" and [q["attachment_id"] for q in view["quarantined"]] == [MISSING]

    rc, out, err = await cli("recover", "agent", MISSING, "--data-dir", str(data))
    assert rc == 0 and msgspec.json.decode(out)["recovered"] is True, err

    rc, out, err = await cli("fork", "agent", "agent-2", "--data-dir", str(data))
    forked = msgspec.json.decode(out)
    assert rc == 0 and (forked["session"], forked["parent"]) == (f"{ONE}~agent-2", f"{ONE}~agent")  # the tenant's too
    rc, _, _ = await cli("events", f"{ONE}~agent-2", "--data-dir", str(data))
    assert rc == 0


async def test_a_name_several_tenants_have_is_ambiguous_and_an_exact_id_still_works(data: Path) -> None:
    for verb in (["timeline", "shared"], ["events", "shared"], ["recover", "shared", MISSING], ["replay", "shared"],
                 ["fork", "shared", "copy"]):
        rc, out, err = await cli(*verb, "--data-dir", str(data))
        assert (rc, out) == (1, ""), verb
        line = err.strip()
        assert line == f"projectionist: SESSION_AMBIGUOUS: 2 tenants have a session 'shared'; name one as the log " \
                       f"holds it: {min(ONE, TWO)}~shared, {max(ONE, TWO)}~shared", verb
    rc, out, err = await cli("events", f"{TWO}~shared", "--data-dir", str(data))
    assert rc == 0 and msgspec.json.decode(out)["session"] == f"{TWO}~shared" and err == ""


async def test_recover_of_a_session_that_does_not_exist_is_session_not_found(data: Path) -> None:
    for session in ("nobody", f"{ONE}~nobody"):
        rc, out, err = await cli("recover", session, MISSING, "--data-dir", str(data))
        assert (rc, out) == (1, "") and err.startswith("projectionist: SESSION_NOT_FOUND: "), err
    rc, out, _ = await cli("events", "nobody", "--data-dir", str(data))
    assert (rc, out) == (1, "")  # nothing was written for it


async def test_replay_takes_its_session_as_an_argument_and_still_as_a_flag(data: Path) -> None:
    reports = []
    for how in (["agent"], ["--session", "agent"], [f"{ONE}~agent"], ["agent", "--session", "agent"]):
        rc, out, err = await cli("replay", *how, "--json", "--data-dir", str(data))
        assert rc == 0, (how, err)
        reports.append(msgspec.json.decode(out))
    assert all(r["session"] == f"{ONE}~agent" and r["matches"] is True for r in reports)
    assert len({r["request_id"] for r in reports}) == 1
    rc, _, err = await cli("replay", "agent", "--session", "shared", "--data-dir", str(data))
    assert rc == 1 and "two sessions named" in err
    rc, _, err = await cli("replay", "--data-dir", str(data))
    assert rc == 1 and "replay needs a session" in err
