"""A call made on the Responses WebSocket is recorded like an HTTP call (route ``websocket``):
replay rebuilds its upstream message byte for byte, the refused attempt and its re-send alike, and
``replay --send`` sends it on a WebSocket again, where the upstream gets the very same message."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from projectionist.proxy.call.replay import rebuild, send
from projectionist.proxy.inbound.services import SERVICES
from tests.calls import recorded_calls
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image, ref_id
from tests.proxy.call.websocket.fake import FakeSocket
from tests.proxy.call.websocket.test_relay import create, events, inline, reference

MakeWs = Callable[..., Awaitable[Harness]]
SESSION = {"X-Session-Id": "ws-r", "Authorization": "Bearer sk-client-own-key", "User-Agent": "test-agent/1"}


async def test_each_call_of_a_socket_is_recorded_and_rebuilt_byte_for_byte(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**{"record.mode": "full"})
    refused = make_image(color=41)
    fake.refused.add(ref_id(refused))
    attachment = await harness.admit(color=42)
    async with harness.client.ws_connect("/v1/responses", headers=SESSION) as ws:
        await ws.send_str(msgspec.json.encode(create(inline(refused), reference(attachment))).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
        await ws.send_str(msgspec.json.encode(create(reference(attachment))).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    assert len(fake.messages) == 3  # refused, re-sent with the placeholder, the second turn
    services = harness.app[SERVICES]
    await services.recording.drain()
    calls = recorded_calls(await harness.events("ws-r"))
    assert [(r["data"]["route"], r["data"]["method"], r["data"]["path"]) for r, _ in calls] == \
        [("websocket", "GET", "/v1/responses")] * 3
    assert [answer["status"] if answer else None for _, answer in calls] == [400, 200, 200]
    assert calls[2][1] is not None and calls[2][1]["usage"]["input_tokens"] == 10
    for (record, _), message in zip(calls, fake.messages):
        rebuilt = await rebuild(services.log, services.store, "ws-r", record["seq"])
        assert rebuilt.matches and rebuilt.body == message
    assert all("sk-client-own-key" not in str(r["data"].get("headers")) for r, _ in calls)


async def test_replay_send_puts_the_message_on_a_websocket_again(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(openai={"api_key": "sk-configured"}, **{"record.mode": "full"})
    attachment = await harness.admit(color=43)
    async with harness.client.ws_connect("/v1/responses", headers=SESSION) as ws:
        await ws.send_str(msgspec.json.encode(create(reference(attachment))).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    await harness.app[SERVICES].recording.drain()
    replayed = await harness.client.post("/admin/sessions/ws-r/replay", json={"send": True, "diff": True},
                                         headers=ADMIN)
    report = await replayed.json()
    assert replayed.status == 200, report
    assert report["matches"] is True and report["sent"]["status"] == 200
    assert report["sent"]["content_type"] == "text/event-stream"
    assert report["diff"] == {**report["diff"], "compared": True, "identical": True}
    services = harness.app[SERVICES]
    await send(await rebuild(services.log, services.store, "ws-r"), services.config)  # the CLI's way
    live, *again = fake.messages
    assert again == [live, live]
    first, *replays = fake.handshakes
    for handshake in replays:
        assert handshake.path_qs == first.path_qs == "/v1/responses"
        assert handshake.headers["Authorization"] == "Bearer sk-configured"  # the configured key, again
        assert handshake.headers["User-Agent"] == "test-agent/1"  # the live call's own headers
        assert "X-Session-Id" not in handshake.headers
