"""Red team of the WebSocket relay: a hostile upstream, a hostile or buggy client, and what must
never leave the proxy (credentials to a host that is not the configured upstream)."""

from __future__ import annotations

import asyncio
import contextlib
import base64
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from aiohttp import WSMsgType, web
from structlog.testing import capture_logs

from projectionist.policy.linked import url_id
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import Harness
from tests.fake_responses import stream_events
from tests.imaging import make_image, ref_id
from tests.proxy.call.websocket.fake import FakeSocket
from tests.proxy.call.websocket.test_relay import create, events, inline, reference

MakeWs = Callable[..., Awaitable[Harness]]
HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
             "Sec-WebSocket-Key": base64.b64encode(b"k" * 16).decode()}


async def test_an_upstream_redirecting_the_upgrade_elsewhere_is_refused_not_followed(
        make_ws: MakeWs, fake: FakeSocket, aiohttp_server: Any) -> None:
    """The upstream leg follows no redirect (as the HTTP transports): a 307 to another host would
    hand that host the client's headers (its organization, its session, Codex's account id) and
    make the proxy open a socket to a base nobody configured."""
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(fake.url + "/v1/responses")

    app = web.Application()
    app.router.add_get("/v1/responses", redirect)
    hostile = await aiohttp_server(app)
    harness = await make_ws(openai={"url": str(hostile.make_url("")).rstrip("/"), "api_key": "sk-server-held"})
    resp = await harness.client.get("/v1/responses", headers={
        **HANDSHAKE, "OpenAI-Organization": "org-secret", "ChatGPT-Account-Id": "acct-secret"})
    assert resp.status == 502 and (await resp.json())["error"]["code"] == "UPGRADE_REFUSED"
    assert fake.handshakes == []  # the host it pointed at never heard from the proxy


SIGNATURE = "f00dfacecafe1234"
GONE = f"https://bucket.s3.amazonaws.com/u/7/cat.png?X-Amz-Expires=300&X-Amz-Signature={SIGNATURE}"


def url_image(url: str) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, "detail": "auto"}


async def test_a_url_the_provider_cannot_fetch_is_rescued_on_the_socket(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**{"record.mode": "metadata"})

    async def download_fails(ws: web.WebSocketResponse, data: bytes) -> bool:
        if GONE.encode() not in data:
            return False
        await ws.send_str(msgspec.json.encode({"type": "error", "status": 400, "error": {
            "type": "invalid_request_error", "code": "invalid_image_url", "param": None,
            "message": f"Error while downloading {GONE}."}}).decode())
        return True

    fake.script = download_fails
    with capture_logs() as lines:
        async with harness.client.ws_connect("/v1/responses", headers={"X-Session-Id": "ws-url"}) as ws:
            for _ in range(2):
                await ws.send_str(msgspec.json.encode(create(url_image(GONE))).decode())
                got = await events(ws)
                assert [e["type"] for e in got if e["type"] == "error"] == []
    assert len(fake.messages) == 3  # refused, re-sent; the second turn's placeholder from the start
    assert GONE.encode() not in fake.messages[1] and GONE.encode() not in fake.messages[2]
    await harness.app[SERVICES].recording.drain()
    logged = msgspec.json.encode(await harness.events("ws-url")).decode()
    assert url_id(GONE) in logged
    for text in (logged, repr(lines)):
        assert SIGNATURE not in text and "bucket.s3" not in text


async def test_the_records_and_log_lines_of_a_socket_hold_no_credential(
        make_ws: MakeWs, fake: FakeSocket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "ct-alpha-secret")
    harness = await make_ws(openai={"api_key": "sk-server-held"}, **{"record.mode": "full"})
    offered = ("openai-insecure-api-key.sk-client-in-protocol",)
    resp = await harness.client.post("/v1/attachments", data=make_image(color=77), headers={
        "Authorization": "Bearer ct-alpha-secret", "Content-Type": "image/png"})
    attachment = (await resp.json())["id"]
    with capture_logs() as lines:
        async with harness.client.ws_connect("/v1/responses?k=ct-alpha-secret", protocols=offered, headers={
                "X-Projectionist-Token": "ct-alpha-secret", "Authorization": "Bearer sk-client-own",
                "X-Session-Id": "creds"}) as ws:
            await ws.send_str(msgspec.json.encode(create(reference(attachment))).decode())
            assert (await events(ws))[-1]["type"] == "response.completed"
    await harness.app[SERVICES].recording.drain()
    [session] = {line["session"] for line in lines if line.get("method") == "WS"}
    logged = msgspec.json.encode(await harness.events(session)).decode()
    assert "request/recorded" in logged
    for text in (logged, repr(lines), repr(fake.handshakes)):
        for secret in ("ct-alpha-secret", "sk-client-own", "sk-client-in-protocol"):
            assert secret not in text, (secret, text[:2000])
    assert "sk-server-held" not in logged + repr(lines)


async def test_a_ping_flood_from_a_client_that_reads_no_pong_stays_bounded(make_ws: MakeWs, fake: FakeSocket) -> None:
    """aiohttp answers each ping: a client that sends pings and reads nothing must not make the
    proxy keep a growing heap of pongs (or tasks) for it."""
    harness = await make_ws(**{"server.write_timeout": 1.0})
    async with harness.client.ws_connect("/v1/responses", autoping=False) as ws:
        before = len(asyncio.all_tasks())
        for _ in range(20000):
            await ws.ping(b"p" * 125)
        await asyncio.sleep(0.5)
        assert len(asyncio.all_tasks()) - before < 50


async def test_a_deeply_nested_message_is_an_error_event_not_an_internal_error(make_ws: MakeWs,
                                                                              fake: FakeSocket) -> None:
    harness = await make_ws()
    nested = "[" * 5000 + "]" * 5000
    async with harness.client.ws_connect("/v1/responses", headers={"X-Session-Id": "deep"}) as ws:
        for text in ('{"type":"response.create","input":' + nested + ',"x":"sha256:"}',
                     '{"input":' + nested + ',"type":"response.create"}',
                     '{"type":"response.create","model":"m","input":[{"role":"user","content":['
                     '{"type":"input_image","image_url":"https://x/a.png"},' + nested + ']}]}'):
            await ws.send_str(text)
            msg = await ws.receive(timeout=10)
            assert msg.type is WSMsgType.TEXT, msg
            event = msgspec.json.decode(msg.data)
            assert event["type"] == "error" and event["error"]["code"] != "INTERNAL_ERROR", event
        # the socket goes on
        await ws.send_str(msgspec.json.encode(create()).decode())
        assert (await events(ws))[-1]["type"] == "response.completed"


async def test_an_upstream_non_json_and_binary_frames_reach_the_client_unchanged(make_ws: MakeWs,
                                                                                 fake: FakeSocket) -> None:
    harness = await make_ws()

    async def odd(ws: web.WebSocketResponse, data: bytes) -> bool:
        await ws.send_str("not json {")
        await ws.send_bytes(b"\x00\xff")
        await ws.send_str('{"type":"response.completed"}')
        return True

    fake.script = odd
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str(msgspec.json.encode(create()).decode())
        got = [await ws.receive(timeout=10) for _ in range(3)]
    assert [(m.type, m.data) for m in got] == [(WSMsgType.TEXT, "not json {"), (WSMsgType.BINARY, b"\x00\xff"),
                                               (WSMsgType.TEXT, '{"type":"response.completed"}')]


@pytest.mark.parametrize("code", [1000, 1001, 1011, 3000, 4999])
async def test_an_upstream_close_code_reaches_the_client(make_ws: MakeWs, fake: FakeSocket, code: int) -> None:
    harness = await make_ws()

    async def close(ws: web.WebSocketResponse, data: bytes) -> bool:
        await ws.close(code=code, message="é" * 61)  # 122 bytes of UTF-8
        return True

    fake.script = close
    async with harness.client.ws_connect("/v1/responses") as ws:
        await ws.send_str('{"type":"session.update"}')  # no call open: the close as it came
        msg = await ws.receive(timeout=10)
    assert msg.type is WSMsgType.CLOSE and msg.data == code and msg.extra == "é" * 61


async def test_many_refused_upgrades_leave_no_client_session_open(make_ws: MakeWs, aiohttp_server: Any) -> None:
    import gc
    import warnings

    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=401)

    app = web.Application()
    app.router.add_get("/v1/responses", refuse)
    server = await aiohttp_server(app)
    harness = await make_ws(openai={"url": str(server.make_url("")).rstrip("/")})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(50):
            resp = await harness.client.get("/v1/responses", headers=HANDSHAKE)
            assert resp.status == 401
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message)]


async def test_a_socket_ends_even_when_its_client_reads_none_of_its_last_error_events(
        make_ws: MakeWs, fake: FakeSocket) -> None:
    """Many lanes open, an upstream that answers none of them and a client that reads nothing: when
    the upstream's silence ends the socket, each open call's error event may not wait for ever on
    a client that takes nothing (the socket, its upstream leg and its session would never close)."""
    harness = await make_ws(openai={"read_timeout": 0.5}, **{"server.write_timeout": 0.5})

    async def silent(ws: web.WebSocketResponse, data: bytes) -> bool:
        return True

    fake.script = silent
    lane = "l" * 10_000
    async with harness.client.ws_connect("/v1/responses") as ws:
        with contextlib.suppress(ConnectionError):  # past 32 open calls each one is an error event it never
            for n in range(2000):                   # reads: the relay cuts off a client that takes nothing
                await ws.send_str(msgspec.json.encode(create(stream_id=f"{lane}{n}")).decode())
        await asyncio.wait_for(fake.closed.wait(), 30)  # the relay gave up and closed the upstream leg


async def _reading_nothing(harness: Harness) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw client with a 4 KiB receive buffer that upgrades to the Responses WebSocket, then
    only writes (so the relay's sends to it stall as soon as its buffers are full)."""
    server = harness.client.server
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (server.host, server.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    writer.write(b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + base64.b64encode(b"k" * 16) + b"\r\n\r\n")
    assert b" 101 " in await reader.readuntil(b"\r\n\r\n")
    return reader, writer


def _client_frame(payload: bytes) -> bytes:
    """A masked text frame, as a client sends one (RFC 6455 §5.2)."""
    mask = os.urandom(4)
    size = len(payload)
    head = b"\x81" + (bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + struct.pack("!H", size)
                      if size < 65536 else bytes([0x80 | 127]) + struct.pack("!Q", size))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_a_call_whose_last_event_never_reaches_a_stalled_client_still_ends_with_its_line(
        make_ws: MakeWs, fake: FakeSocket) -> None:
    """The call is off its lane once its last event is being sent; a client that takes none of a
    32 MiB last event is cut off there, and the call still ends (as its client left), with its
    log line, rather than with nothing at all."""
    harness = await make_ws(**{"server.write_timeout": 0.5})

    async def huge_last(ws: web.WebSocketResponse, data: bytes) -> bool:
        sequence = stream_events(1)
        for event in sequence[:-1]:
            await ws.send_str(msgspec.json.encode(event).decode())
        last = sequence[-1]
        last["response"]["output"][0]["content"][0]["text"] = "x" * (32 * 1024 * 1024)
        await ws.send_str(msgspec.json.encode(last).decode())
        return True

    fake.script = huge_last
    with capture_logs() as lines:
        _, writer = await _reading_nothing(harness)
        writer.write(_client_frame(msgspec.json.encode(create())))
        await asyncio.wait_for(fake.closed.wait(), 30)  # cut off: it read nothing
        writer.close()
        await asyncio.sleep(0.2)
    assert [line["closed"] for line in lines if line.get("closed")] == ["client stalled"]
    assert [line["status"] for line in lines if line.get("method") == "WS"] == ["cancelled"]


@pytest.mark.parametrize("how", ["tenants", "keys"])
async def test_a_refusal_on_one_tenants_socket_never_changes_anothers_session(
        make_ws: MakeWs, fake: FakeSocket, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The session a message names itself (Codex's prompt_cache_key) is scoped as a header's is:
    a stranger naming the same key changes nothing of the first one's session."""
    if how == "tenants":
        monkeypatch.setenv("PROJECTIONIST_TENANT_TOKENS", "alice:tok-alice bob:tok-bob")
        first, second = {"Authorization": "Bearer tok-alice"}, {"Authorization": "Bearer tok-bob"}
    else:
        first, second = {"Authorization": "Bearer sk-alice-own"}, {"Authorization": "Bearer sk-bob-own"}
    harness = await make_ws()
    image = make_image(color=61)
    fake.refused.add(ref_id(image))
    for headers in (first, second):
        async with harness.client.ws_connect("/v1/responses", headers=headers) as ws:
            await ws.send_str(msgspec.json.encode(create(inline(image), prompt_cache_key="shared-key")).decode())
            assert (await events(ws))[-1]["type"] == "response.completed"
    # each was refused once, then re-sent with its placeholder: the second was never given the first's
    assert fake.refusals == 2
    kinds = [msgspec.json.decode(m)["input"][0]["content"][1]["type"] for m in fake.messages]
    assert kinds == ["input_image", "input_text", "input_image", "input_text"]
