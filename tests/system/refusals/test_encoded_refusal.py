"""A refusal the upstream sent compressed (``Content-Encoding: gzip``, as providers do for clients
that send ``Accept-Encoding: gzip`` like the official SDKs; the proxy forwards that header and
passes answers through as they come) is inflated, bounded, before it is read."""

from __future__ import annotations

import gzip
from typing import Any

import msgspec
from aiohttp import web

from tests.system.refusals.hostile import chat_body
from tests.refusing import OPENAI_MESSAGE, inlined

RECORDING = {"record.mode": "metadata"}


async def test_a_gzip_refusal_is_still_a_refusal(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    bad = await harness.admit(color=9)

    async def refuse_bad(request: web.Request, doc: Any) -> web.StreamResponse | None:
        if not any(found == bad for _, found in inlined(doc)):
            return None
        body = msgspec.json.encode({"error": {"message": OPENAI_MESSAGE, "type": "invalid_request_error",
                                              "param": None, "code": "invalid_image_format"}})
        compressed = "gzip" in request.headers.get("Accept-Encoding", "")
        return web.Response(body=gzip.compress(body) if compressed else body, status=400,
                            headers={"Content-Type": "application/json",
                                     **({"Content-Encoding": "gzip"} if compressed else {})})

    harness.upstream.script = refuse_bad
    headers = {"X-Session-Id": "gz", "Accept-Encoding": "gzip, deflate"}
    resp = await harness.client.post("/v1/chat/completions", json=chat_body(bad), headers=headers)
    # without Accept-Encoding the same refusal is handled (quarantine, re-send, 200)
    assert resp.status == 200, await resp.text()
