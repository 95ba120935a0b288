"""One chat call through a proxy harness, recorded in a session, and the same on a raw socket
(shared by the replay and response-integrity tests)."""

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


async def raw_exchange(harness: Harness, body: bytes, *, session: str, method: str = "POST") -> bytes:
    """Send ``body`` to chat completions with a session on a raw socket; every byte the proxy sent
    back (no client library can hide a spliced or cut response)."""
    server = harness.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(method.encode() + b" /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-Id: " + session.encode()
                 + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 15)
    writer.close()
    return answer
