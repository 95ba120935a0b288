"""One chat call through a proxy harness, recorded in a session, and the same on a raw socket
(shared by the replay and response-integrity tests); any request on a raw socket, for bytes no
client library would send (the trust-lane and session-path tests)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from tests.conftest import Harness


def chat_body(*ids: str) -> bytes:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": f"attachment:{i}"}} for i in ids]
    return msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": parts}]})


async def call(harness: Harness, body: bytes, session: str = "r", path: str = "/v1/chat/completions") -> bytes:
    resp = await harness.client.post(path, data=body, headers={"X-Session-Id": session,
                                                                "Content-Type": "application/json"})
    assert resp.status == 200
    await resp.read()
    return harness.upstream.last.body


async def raw_bytes(harness: Harness, data: bytes) -> bytes:
    """Send ``data`` on a raw socket to the harness's server (its console's, for a path under
    ``/admin``); every byte it sent back until it closed (no client library can hide a spliced
    or cut response)."""
    client = harness.client
    target = data.split(b" ", 2)[1:2]
    console = bool(target) and target[0].startswith(b"/admin")
    server = client.admin.server if console and hasattr(client, "admin") else client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 15)
    writer.close()
    return answer


async def raw_exchange(harness: Harness, body: bytes, *, session: str, method: str = "POST") -> bytes:
    """Send ``body`` to chat completions with a session on a raw socket; the raw answer."""
    return await raw_bytes(harness, method.encode() + b" /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-Id: "
                           + session.encode() + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
                           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def raw_request(harness: Harness, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """``head`` (request line and headers, each ending in CRLF) and ``body`` as they are, framed by
    a Content-Length; the answer's status, headers (lowercase names) and body."""
    answer = await raw_bytes(harness, head + b"Content-Length: " + str(len(body)).encode()
                             + b"\r\nConnection: close\r\n\r\n" + body)
    head_bytes, _, payload = answer.partition(b"\r\n\r\n")
    status_line, *lines = head_bytes.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, payload


Json = dict[str, Any]


def recorded_calls(events: list[Json]) -> list[tuple[Json, Json | None]]:
    """Each recorded call among ``events`` (the log as JSON), in log order: its request record and
    its outcome, wherever the writer put it: in the request record (the call had ended when its
    record was written: one row) or in a ``response/recorded`` event of its own."""
    later: dict[int | str, Json] = {}
    for event in events:
        if event["type"] == "response/recorded":
            later[event["data"]["request_seq"] or event["data"]["request_id"]] = event["data"]
    return [(e, e["data"].get("response") or later.get(e["seq"]) or later.get(e["data"]["request_id"]))
            for e in events if e["type"] == "request/recorded"]


def state_kinds(events: list[Json]) -> list[str]:
    """The types of ``events`` but the response records (which may or may not be rows of their own)."""
    return [e["type"] for e in events if e["type"] != "response/recorded"]
