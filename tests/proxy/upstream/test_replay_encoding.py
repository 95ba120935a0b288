"""Found by a red team, and held since: replay sends the live call's recorded headers, ``Accept-Encoding`` included (the SDKs
offer ``gzip, deflate, br, zstd``; the proxy narrows it to ``gzip, deflate``), and the transport
decompresses nothing. A real upstream (OpenAI, Anthropic behind Cloudflare) then answers the
replay gzipped: ``sent.body`` of the report is compressed bytes decoded as UTF-8, and ``diff``
compares two gzip streams as text, so a replay of an unchanged call never reads "identical"."""

from __future__ import annotations

import gzip
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from tests.calls import chat_body
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image
from tests.proxy.upstream.test_client import Conn, MakeServer, RawServer, serve  # noqa: F401 (a fixture)

MakeHarness = Callable[..., Awaitable[Harness]]
ANSWER = msgspec.json.encode({"id": "c", "object": "chat.completion", "created": 1, "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]})


async def gzips_when_asked(conn: Conn) -> None:
    while request := await conn.request():
        head = request.split(b"\r\n\r\n", 1)[0].lower()
        if b"accept-encoding: gzip" in head:
            body = gzip.compress(ANSWER)
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        else:
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                            + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)


async def test_a_replay_of_an_unchanged_call_against_a_gzipping_upstream_reads_identical(
        make_harness: MakeHarness, make_config: Callable[..., Any], serve: MakeServer) -> None:  # noqa: F811
    raw: RawServer = await serve(gzips_when_asked)
    harness = await make_harness(make_config(**{"record.mode": "full", "upstreams.openai": {
        "format": "openai", "url": str(raw.url), "api_key": "sk-conf"}}))
    image = await harness.admit(make_image(color=96))
    resp = await harness.client.post("/v1/chat/completions", data=chat_body(image), headers={
        "Content-Type": "application/json", "X-Session-Id": "r", "Accept-Encoding": "gzip, deflate, br, zstd"})
    assert resp.status == 200 and await resp.json() == msgspec.json.decode(ANSWER)
    replayed = await harness.client.post("/admin/sessions/r/replay", json={"send": True, "diff": True}, headers=ADMIN)
    report = await replayed.json()
    assert replayed.status == 200, report
    assert report["sent"]["body"] == ANSWER.decode(), f"sent.body is not the answer: {report['sent']['body'][:40]!r}"
    assert report["diff"]["identical"] is True, report["diff"]
