"""Replay puts on the wire what the live call put there: the same method, path, headers and body,
byte for byte, through the same transport (the running app's, on the admin route; one opened as
the upstream's configuration says, from the CLI's ``send``), on both transports. Only credentials
differ: the record never keeps one, and replay sends the configured key again, so with a
configured key even ``Authorization`` matches. The upstream is a raw loopback server that keeps
every request as it came."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.call.replay import rebuild, send
from tests.calls import chat_body, recorded_calls
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image
from tests.proxy.upstream.test_client import Conn, MakeServer, RawServer, serve  # noqa: F401 (a fixture)

MakeHarness = Callable[..., Awaitable[Harness]]
ANSWER = msgspec.json.encode({"id": "c", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]})
CLIENT_HEADERS = {  # what the OpenAI Python SDK sends, and a session header the proxy keeps to itself
    "Authorization": "Bearer sk-client-own-key", "User-Agent": "OpenAI/Python 1.99.0", "X-Stainless-Lang": "python",
    "X-Stainless-Retry-Count": "0", "OpenAI-Beta": "assistants=v2", "Accept": "application/json",
    "Accept-Encoding": "gzip, deflate, br, zstd", "Content-Type": "application/json", "X-Session-Id": "r",
}


async def chat_answers(conn: Conn) -> None:
    while await conn.request():
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                        + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)


def split(request: bytes) -> tuple[bytes, list[bytes], bytes]:
    head, _, body = request.partition(b"\r\n\r\n")
    line, *fields = head.split(b"\r\n")
    return line, fields, body


@pytest.mark.parametrize("transport", ["builtin", "aiohttp"])
@pytest.mark.parametrize("key", ["", "sk-configured"], ids=["client-key", "configured-key"])
async def test_a_replayed_call_is_the_live_call_on_the_wire(
    make_harness: MakeHarness, make_config: Callable[..., Any], serve: MakeServer, transport: str, key: str,  # noqa: F811
) -> None:
    raw: RawServer = await serve(chat_answers)
    config = make_config(**{"record.mode": "full", "upstreams.openai": {
        "format": "openai", "url": str(raw.url), "transport": transport, "api_key": key}})
    harness = await make_harness(config)
    image = await harness.admit(make_image(color=90))
    resp = await harness.client.post("/v1/chat/completions", data=chat_body(image), headers=CLIENT_HEADERS)
    assert resp.status == 200
    await resp.read()

    replayed = await harness.client.post("/admin/sessions/r/replay", json={"send": True}, headers=ADMIN)
    report = await replayed.json()
    assert replayed.status == 200 and report["matches"] is True and report["sent"]["status"] == 200
    services = harness.client.proxy.app[SERVICES]
    rebuilt = await rebuild(services.log, services.store, "r")
    await send(rebuilt, config)  # the CLI's way: a transport of its own, as the upstream's config says

    (live_line, live_fields, live_body), *replays = [split(request) for _, request in raw.requests]
    assert len(replays) == 2
    credentials = {b"authorization"}
    for line, fields, body in replays:
        assert line == live_line and body == live_body  # method, path, body
        if key:  # the configured key goes again: every byte of the head is the live call's
            assert fields == live_fields
        else:  # the client's own key was never recorded: everything else is the live call's
            assert [f for f in fields if f.split(b":")[0].lower() not in credentials] == \
                   [f for f in live_fields if f.split(b":")[0].lower() not in credentials]
            assert not any(f.lower().startswith(b"authorization:") for f in fields)
    assert b"User-Agent: OpenAI/Python 1.99.0" in live_fields and b"X-Session-Id: r" not in live_fields
    assert b"Accept-Encoding: gzip, deflate" in live_fields  # narrowed to what the proxy can read back


async def test_the_record_keeps_no_credential(make_harness: MakeHarness, make_config: Callable[..., Any],
                                              serve: MakeServer) -> None:  # noqa: F811
    raw: RawServer = await serve(chat_answers)
    config = make_config(**{"record.mode": "metadata", "upstreams.openai": {
        "format": "openai", "url": str(raw.url), "api_key": "sk-conf"}})
    harness = await make_harness(config)
    image = await harness.admit(make_image(color=91))
    secret_headers = {**CLIENT_HEADERS, "X-Api-Key": "sk-x", "Cookie": "s=1", "X-Custom-Token": "t0k",
                      "Anthropic-Auth": "a", "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    resp = await harness.client.post("/v1/chat/completions", data=chat_body(image), headers=secret_headers)
    assert resp.status == 200
    await resp.read()
    events = await harness.events("r")
    [(request, _)] = recorded_calls(events)
    names = [name.lower() for name, _ in request["data"]["headers"]]
    assert "user-agent" in names and "x-stainless-lang" in names
    for credential in ("authorization", "x-api-key", "cookie", "x-custom-token", "anthropic-auth", "traceparent"):
        assert credential not in names
    encoded = msgspec.json.encode(request)
    for secret in (b"sk-client-own-key", b"sk-x", b"sk-conf", b"t0k"):
        assert secret not in encoded
