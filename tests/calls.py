"""One chat call through a proxy harness, recorded in a session (shared by the replay tests)."""

from __future__ import annotations

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
