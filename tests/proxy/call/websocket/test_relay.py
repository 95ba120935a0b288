"""The Responses WebSocket through the proxy, on the wire (aiohttp's client): each response.create
projected like the body of POST /v1/responses, a refused image re-sent within the socket, and
every bad input a clean close or an error event."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import WSMsgType, web
from aiohttp.client_ws import ClientWebSocketResponse

from tests.conftest import Harness
from tests.imaging import make_image, ref_id
from tests.proxy.call.websocket.fake import FakeSocket

MakeWs = Callable[..., Awaitable[Harness]]
SESSION = {"X-Session-Id": "ws-1"}


def create(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    content = [{"type": "input_text", "text": "look"}, *parts]
    return {"type": "response.create", "model": "gpt-test", "input": [{"role": "user", "content": content}], **fields}


def inline(data: bytes) -> dict[str, Any]:
    return {"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(data).decode()}


def reference(attachment_id: str) -> dict[str, Any]:
    return {"type": "input_image", "image_url": f"attachment:{attachment_id}"}


async def events(ws: ClientWebSocketResponse, until: str = "response.completed") -> list[dict[str, Any]]:
    """The events the client gets up to and including the first ``until`` or error."""
    got: list[dict[str, Any]] = []
    while True:
        msg = await ws.receive(timeout=10)
        assert msg.type is WSMsgType.TEXT, msg
        got.append(msgspec.json.decode(msg.data))
        if got[-1]["type"] in (until, "error"):
            return got


async def test_a_response_create_goes_through_and_its_events_come_back(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    message = msgspec.json.encode(create())
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(message.decode())
        got = await events(ws)
    assert [e["type"] for e in got][0] == "response.created" and got[-1]["type"] == "response.completed"
    assert len(got) == 8 + fake.chunks
    assert fake.messages == [message]  # nothing to project: the message as it came
    assert fake.handshakes[0].path_qs == "/v1/responses"


async def test_a_call_s_first_and_last_events_leave_at_once(make_ws: MakeWs, fake: FakeSocket,
                                                            monkeypatch: Any) -> None:
    """The events a client waits for leave at once; the ones between them may be gathered."""
    from projectionist.proxy.call import websocket

    flushed: list[int] = []
    sent: list[int] = []
    original_flush, original_hold = websocket.Gather.flush, websocket.Gather.hold
    monkeypatch.setattr(websocket.Gather, "flush", lambda self: (flushed.append(len(sent)), original_flush(self))[1])
    monkeypatch.setattr(websocket.Gather, "hold", lambda self: (sent.append(1), original_hold(self))[1])
    harness = await make_ws()
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create()).decode())
        got = await events(ws)
    assert len(sent) == len(got) == 8 + fake.chunks
    assert flushed[:2] == [1, len(got)], "the first and the last event must each go out when sent"


async def test_a_reference_is_projected_into_the_message(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    attachment = await harness.admit(color=3)
    async with harness.client.ws_connect("/v1/responses", headers=SESSION) as ws:
        await ws.send_str(msgspec.json.encode(create(reference(attachment))).decode())
        got = await events(ws)
    assert got[-1]["type"] == "response.completed"
    [sent] = fake.bodies()
    url = sent["input"][0]["content"][1]["image_url"]
    assert url == "data:image/png;base64," + base64.b64encode(make_image(color=3)).decode()
    assert sent["type"] == "response.create"


async def test_a_refused_inline_image_is_sent_again_with_its_placeholder(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    image = make_image(color=5)
    fake.refused.add(ref_id(image))
    async with harness.client.ws_connect("/v1/responses", headers=SESSION) as ws:
        await ws.send_str(msgspec.json.encode(create(inline(image))).decode())
        got = await events(ws)
        assert [e["type"] for e in got if e["type"] == "error"] == []  # the client never saw the refusal
        assert got[-1]["type"] == "response.completed"
        assert fake.refusals == 1 and len(fake.messages) == 2
        placeholder = fake.bodies()[1]["input"][0]["content"][1]
        assert placeholder["type"] == "input_text" and "rejected" in placeholder["text"]
        # the next turn on the same socket: the placeholder before the upstream is asked
        await ws.send_str(msgspec.json.encode(create(inline(image), instructions="again")).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    assert fake.refusals == 1 and len(fake.messages) == 3
    assert fake.bodies()[2]["input"][0]["content"][1] == placeholder
    # and on a new socket
    async with harness.client.ws_connect("/v1/responses", headers=SESSION) as ws:
        await ws.send_str(msgspec.json.encode(create(inline(image))).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    assert fake.refusals == 1 and fake.bodies()[3]["input"][0]["content"][1] == placeholder
    kinds = [e["type"] for e in await harness.events("ws-1")]
    assert kinds.count("attachment/rejected") == 1


async def test_each_lane_is_a_call_of_its_own(make_ws: MakeWs, fake: FakeSocket) -> None:
    import json

    harness = await make_ws()
    image = make_image(color=9)
    fake.refused.add(ref_id(image))
    async with harness.client.ws_connect("/v1/responses", headers=SESSION) as ws:
        await ws.send_str(msgspec.json.encode(create(inline(image), stream_id="a")).decode())  # compact: SDK style
        await ws.send_str(json.dumps(create(stream_id="b")))  # spaced: parsed to find its type
        got = [*await events(ws), *await events(ws)]
    assert sorted(e.get("stream_id") for e in got if e["type"] == "response.completed") == ["a", "b"]
    assert all(e["type"] != "error" for e in got) and fake.refusals == 1
    on_a = [b["input"][0]["content"][1]["type"] for b in fake.bodies() if b["stream_id"] == "a"]
    assert on_a == ["input_image", "input_text"]  # refused, then re-sent with its placeholder
    assert [b["stream_id"] for b in fake.bodies()].count("b") == 1


async def test_an_unreadable_reference_is_quarantined_and_the_model_called_once(make_ws: MakeWs,
                                                                                 fake: FakeSocket) -> None:
    harness = await make_ws()
    attachment = await harness.admit(color=7, name="gone.png")
    await harness.remove(attachment)
    async with harness.client.ws_connect("/v1/responses", headers=SESSION) as ws:
        await ws.send_str(msgspec.json.encode(create(reference(attachment))).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    [sent] = fake.bodies()
    assert sent["input"][0]["content"][1] == {
        "type": "input_text", "text": f"[image unavailable: not_found ({attachment[:15]})]"}
    quarantines = [e for e in await harness.events("ws-1") if e["type"] == "attachment/quarantine"]
    assert [q["data"]["failure"] for q in quarantines] == ["not_found"]


async def test_a_socket_under_a_session_path_keeps_that_session_on_every_turn(make_ws: MakeWs,
                                                                               fake: FakeSocket) -> None:
    """Each message is a call of its own, with a context of its own: the session the upgrade's
    ``/s/{session}/`` path named is every turn's, and its quarantine lands there."""
    harness = await make_ws()
    attachment = await harness.admit(color=9, name="gone.png")
    await harness.remove(attachment)
    async with harness.client.ws_connect("/s/ws-path/v1/responses") as ws:
        for _ in range(2):
            await ws.send_str(msgspec.json.encode(create(reference(attachment))).decode())
            assert (await events(ws))[-1]["type"] == "response.completed"
    assert [body["input"][0]["content"][1]["type"] for body in fake.bodies()] == ["input_text", "input_text"]
    quarantines = [e for e in await harness.events("ws-path") if e["type"] == "attachment/quarantine"]
    assert [q["data"]["failure"] for q in quarantines] == ["not_found"]  # once: the second turn read the log


async def test_without_a_session_an_unreadable_reference_is_an_error_event(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**{"server.client_sessions": False})
    attachment = await harness.admit(color=8)
    await harness.remove(attachment)
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create(reference(attachment))).decode())
        [error] = await events(ws)
        assert error["type"] == "error" and error["status"] == 422
        assert error["error"]["code"] == "ATTACHMENT_NOT_FOUND" and error["error"]["type"] == "invalid_request_error"
        # the socket goes on
        await ws.send_str(msgspec.json.encode(create()).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    assert len(fake.messages) == 1


async def test_a_binary_frame_and_a_text_that_is_no_json_are_error_events(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_bytes(msgspec.json.encode(create()))
        [binary] = await events(ws)
        await ws.send_str("{not json")
        [text] = await events(ws)
        await ws.send_str("[1, 2]")
        [array] = await events(ws)
        await ws.send_str(msgspec.json.encode(create()).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"
    assert (binary["error"]["code"], text["error"]["code"], array["error"]["code"]) == (
        "INVALID_MESSAGE", "INVALID_JSON", "INVALID_MESSAGE")
    assert {binary["status"], text["status"], array["status"]} == {400}
    assert len(fake.messages) == 1


async def test_other_client_events_go_as_they_came(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()

    async def ack(ws: web.WebSocketResponse, data: bytes) -> bool:
        if b'"response.create"' in data:
            return False
        await ws.send_str('{"type":"response.steer.accepted"}')
        return True

    fake.script = ack
    steer = b'{"type": "response.steer", "previous_response_id": "resp_1", "input": "stop"}'
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(steer.decode())
        assert (await events(ws, until="response.steer.accepted"))[-1]["type"] == "response.steer.accepted"
    assert fake.messages == [steer]


async def test_the_upgrade_answers_are_http_errors_in_the_routes_format(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    handshake = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                 "Sec-WebSocket-Key": base64.b64encode(b"k" * 16).decode()}
    resp = await harness.client.get("/v1/chat/completions", headers=handshake)
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "UPGRADE_NOT_SUPPORTED"
    resp = await harness.client.get("/v1/responses", headers={**handshake, "Sec-WebSocket-Key": "short"})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "INVALID_REQUEST"
    assert fake.handshakes == []  # neither reached the upstream


async def test_the_upstream_never_answering_the_upgrade_is_a_504(make_ws: MakeWs) -> None:
    import asyncio

    accepted = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # reads the handshake, answers nothing, until the proxy gives up
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        harness = await make_ws(openai={"url": f"http://127.0.0.1:{port}", "connect_timeout": 0.3})
        resp = await harness.client.get("/v1/responses", headers={
            "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(b"k" * 16).decode()})
        assert accepted.is_set()
        assert resp.status == 504 and (await resp.json())["error"]["code"] == "UPSTREAM_TIMEOUT"
    finally:
        server.close()
        await server.wait_closed()


async def test_an_upstream_refusing_the_upgrade_is_upgrade_refused(make_ws: MakeWs, aiohttp_server: Any) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "bad key"}}, status=int(request.query["status"]))

    app = web.Application()
    app.router.add_get("/v1/responses", refuse)
    server = await aiohttp_server(app)
    harness = await make_ws(openai={"url": str(server.make_url("")).rstrip("/")})
    handshake = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                 "Sec-WebSocket-Key": base64.b64encode(b"k" * 16).decode()}
    for upstream_status, status in ((401, 401), (426, 426), (500, 502), (400, 502)):
        resp = await harness.client.get(f"/v1/responses?status={upstream_status}", headers=handshake)
        assert resp.status == status
        assert (await resp.json())["error"]["code"] == "UPGRADE_REFUSED"


async def test_an_upstream_closing_mid_response_is_an_error_event_then_a_close(make_ws: MakeWs,
                                                                              fake: FakeSocket) -> None:
    harness = await make_ws()

    async def break_off(ws: web.WebSocketResponse, data: bytes) -> bool:
        await ws.send_str('{"type":"response.created","response":{"id":"resp_1"}}')
        transport = ws._req.transport if ws._req is not None else None  # type: ignore[attr-defined]
        assert transport is not None
        transport.write(b"\x81\x7e\x01\x00" + b"{" * 10)  # a text frame announcing 256 bytes, 10 of them sent
        transport.close()
        return True

    fake.script = break_off
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create()).decode())
        got = await events(ws)
        closing = await ws.receive(timeout=10)
    assert [e["type"] for e in got] == ["response.created", "error"]
    assert got[-1]["status"] == 502 and got[-1]["error"]["code"] == "UPSTREAM_UNAVAILABLE"
    assert closing.type is WSMsgType.CLOSE and closing.data == 1014


async def test_a_message_over_the_limit_closes_the_socket_with_1009(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**{"server.websocket_max_message": 64 * 1024})
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create(instructions="x" * 65 * 1024)).decode())
        closing = await ws.receive(timeout=10)
    assert closing.type is WSMsgType.CLOSE and closing.data == 1009
    await fake.closed.wait()  # the upstream leg is closed with it
    assert fake.messages == []


async def test_an_upstream_event_over_the_limit_is_an_error_event_then_a_close(make_ws: MakeWs,
                                                                              fake: FakeSocket) -> None:
    harness = await make_ws(**{"server.websocket_max_message": 64 * 1024})

    async def huge(ws: web.WebSocketResponse, data: bytes) -> bool:
        await ws.send_str('{"type":"response.created"}')
        await ws.send_str('{"type":"response.output_text.delta","delta":"' + "x" * 65 * 1024 + '"}')
        return True

    fake.script = huge
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create()).decode())
        got = await events(ws)
        closing = await ws.receive(timeout=10)
    assert [e["type"] for e in got] == ["response.created", "error"]
    assert closing.type is WSMsgType.CLOSE and closing.data == 1014


async def test_an_idle_socket_is_closed(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**{"server.websocket_idle_timeout": 0.2})
    async with harness.client.ws_connect("/v1/responses") as ws:
        closing = await ws.receive(timeout=10)
    assert closing.type is WSMsgType.CLOSE and closing.data == 1000 and closing.extra == "idle timeout"
    await fake.closed.wait()


async def silent(ws: web.WebSocketResponse, data: bytes) -> bool:
    """An upstream that takes the message and never answers it."""
    await ws.send_str('{"type":"response.created"}')
    return True


async def test_an_upstream_silent_during_a_response_ends_it_after_read_timeout(make_ws: MakeWs,
                                                                              fake: FakeSocket) -> None:
    harness = await make_ws(openai={"read_timeout": 0.3})
    fake.script = silent
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create()).decode())
        got = await events(ws)
        closing = await ws.receive(timeout=10)
    assert [e["type"] for e in got] == ["response.created", "error"]
    assert got[-1]["status"] == 504 and got[-1]["error"]["code"] == "UPSTREAM_TIMEOUT"
    assert closing.type is WSMsgType.CLOSE and closing.data == 1014
    await fake.closed.wait()


async def test_a_socket_ends_at_its_time_limit(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**{"server.websocket_timeout": 0.5})
    fake.script = silent
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create()).decode())
        got = await events(ws)
        closing = await ws.receive(timeout=10)
    assert got[-1]["error"]["code"] == "UPSTREAM_TIMEOUT"
    assert closing.type is WSMsgType.CLOSE and closing.data == 1000 and closing.extra == "socket time limit"


def test_the_defaults_bound_a_socket() -> None:
    from projectionist.proxy.config import ServerConfig

    server = ServerConfig()
    assert (server.websocket_max_message, server.websocket_idle_timeout, server.websocket_timeout,
            server.websocket_heartbeat) == (64 * 1024 * 1024, 600.0, 3600.0, 30.0)
