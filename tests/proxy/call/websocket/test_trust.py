"""A relayed WebSocket keeps HTTP's trust rules: the client token is checked at the upgrade and
never travels upstream, a configured key replaces the client's (in a header or in Realtime's
subprotocol), the upstream leg goes only to the configured base, and tenants see only their own
sessions and attachments; Realtime's frames go both ways unchanged."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable

import msgspec
import pytest
from aiohttp import WSMsgType

from tests.conftest import Harness
from tests.imaging import make_image
from tests.proxy.call.websocket.fake import FakeSocket
from tests.proxy.call.websocket.test_relay import create, events, reference

MakeWs = Callable[..., Awaitable[Harness]]
HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
             "Sec-WebSocket-Key": base64.b64encode(b"k" * 16).decode()}


async def turn(harness: Harness, headers: dict[str, str], *parts: dict[str, object]) -> None:
    async with harness.client.ws_connect("/v1/responses", headers=headers) as ws:
        await ws.send_str(msgspec.json.encode(create(*parts)).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"


async def test_a_configured_key_replaces_the_clients_own(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(openai={"api_key": "sk-server-held"})
    await turn(harness, {"Authorization": "Bearer sk-client-own-key"})
    [handshake] = fake.handshakes
    assert handshake.headers["Authorization"] == "Bearer sk-server-held"
    assert "sk-client-own-key" not in str(handshake.headers)


async def test_without_a_configured_key_the_clients_own_goes(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    await turn(harness, {"Authorization": "Bearer sk-client-own-key", "OpenAI-Beta": "responses_websockets=1"})
    [handshake] = fake.handshakes
    assert handshake.headers["Authorization"] == "Bearer sk-client-own-key"
    assert handshake.headers["OpenAI-Beta"] == "responses_websockets=1"
    assert handshake.headers["Sec-WebSocket-Key"] != HANDSHAKE["Sec-WebSocket-Key"]  # the leg's own handshake


async def test_the_client_token_is_checked_at_the_upgrade_and_never_forwarded(
        make_ws: MakeWs, fake: FakeSocket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "ct-alpha")
    harness = await make_ws(openai={"api_key": "sk-server-held"})
    for headers in ({}, {"Authorization": "Bearer ct-wrong"}, {"Authorization": "Bearer sk-server-held"}):
        resp = await harness.client.get("/v1/responses", headers={**HANDSHAKE, **headers})
        assert resp.status == 401 and (await resp.json())["error"]["code"] == "CLIENT_UNAUTHORIZED"
    assert fake.handshakes == []
    await turn(harness, {"Authorization": "Bearer ct-alpha"})
    await turn(harness, {"X-Projectionist-Token": "ct-alpha", "Authorization": "Bearer sk-own"})
    assert [h.headers["Authorization"] for h in fake.handshakes] == ["Bearer sk-server-held"] * 2
    for handshake in fake.handshakes:
        assert "ct-alpha" not in str(handshake.headers) + handshake.path_qs
        assert "x-projectionist-token" not in str(handshake.headers).lower()


async def test_a_token_in_the_query_never_reaches_the_upstream(make_ws: MakeWs, fake: FakeSocket,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "ct-alpha")
    harness = await make_ws()
    async with harness.client.ws_connect("/v1/responses?beta=1&note=ct-alpha", headers={
            "Authorization": "Bearer ct-alpha"}) as ws:
        await ws.send_str(msgspec.json.encode(create()).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    assert fake.handshakes[0].path_qs == "/v1/responses?beta=1"
    assert "ct-alpha" not in str(fake.handshakes[0].headers)


async def test_realtime_frames_go_both_ways_unchanged_and_its_key_subprotocol_is_replaced(
        make_ws: MakeWs, fake: FakeSocket) -> None:
    fake.protocol = "realtime"
    harness = await make_ws(openai={"api_key": "sk-server-held"})
    offered = ("realtime", "openai-insecure-api-key.sk-client-own", "openai-beta.realtime-v1")
    text = '{"type":"conversation.item.create","item":{"content":[{"type":"input_image","image_url":"x"}]}}'
    async with harness.client.ws_connect("/v1/realtime?model=gpt-realtime", protocols=offered) as ws:
        assert ws.protocol == "realtime"
        await ws.send_str(text)
        echoed = await ws.receive(timeout=10)
        await ws.send_bytes(b"\x00\x01binary")
        binary = await ws.receive(timeout=10)
    assert (echoed.type, echoed.data) == (WSMsgType.TEXT, text)
    assert (binary.type, binary.data) == (WSMsgType.BINARY, b"\x00\x01binary")
    [handshake] = fake.handshakes
    assert handshake.protocols == ["realtime", "openai-beta.realtime-v1"]
    assert handshake.path_qs == "/v1/realtime?model=gpt-realtime"
    assert handshake.headers["Authorization"] == "Bearer sk-server-held"
    assert "sk-client-own" not in str(handshake.headers)


async def test_a_tenant_references_only_its_own_attachments_in_its_own_sessions(
        make_ws: MakeWs, fake: FakeSocket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_TENANT_TOKENS", "alice:tok-alice bob:tok-bob")
    harness = await make_ws()
    alice, bob = {"Authorization": "Bearer tok-alice"}, {"Authorization": "Bearer tok-bob"}
    resp = await harness.client.post("/v1/attachments", data=make_image(color=21),
                                     headers={**alice, "Content-Type": "image/png"})
    secret = (await resp.json())["id"]
    await turn(harness, {**alice, "X-Session-Id": "shared"}, reference(secret))
    await turn(harness, {**bob, "X-Session-Id": "shared"}, reference(secret))
    alices, bobs = [b["input"][0]["content"][1] for b in fake.bodies()]
    assert alices["image_url"].startswith("data:image/png;base64,")
    assert bobs["type"] == "input_text" and "not_found" in bobs["text"]  # as if it were not there
    for tenant, failures in (("alice", []), ("bob", ["not_found"])):
        logged = await harness.events(f"{tenant}~shared")
        assert [e["data"]["failure"] for e in logged if e["type"] == "attachment/quarantine"] == failures
