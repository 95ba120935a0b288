"""Nothing a client sends is a 500: each input the red team found answering 500
``UNCLASSIFIED_ERROR`` is a clear 4xx in the client's wire format now, or is served."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import ADMIN, Harness

DIGITS = "9" * 5000


async def code_of(resp: Any) -> str | None:
    return resp.headers.get("x-projectionist-error-code")


async def raw_request(harness: Harness, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send ``head`` (request line and headers, as bytes) and ``body`` on a fresh connection;
    the status and the whole answer."""
    url = harness.client.make_url("/")
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(head + b"\r\n" + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]), answer


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/v1/messages"])
async def test_a_header_that_is_not_utf8_is_never_a_500(harness: Harness, path: str) -> None:
    body = b'{"model": "m", "messages": []}'
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Odd: ").encode() + b"caf\xe9\xff\r\n"
    status, answer = await raw_request(harness, head, body)
    assert status < 500, answer[:500]


async def test_a_cookie_of_thousands_of_digits_is_no_session(harness: Harness) -> None:
    resp = await harness.client.get("/admin/ui", headers={"Cookie": f"projectionist_ui={DIGITS}.x"},
                                    allow_redirects=False)
    assert resp.status in (302, 303, 401), await resp.text()


async def test_a_multipart_login_with_no_parts_is_refused_plainly(harness: Harness) -> None:
    resp = await harness.client.post("/admin/ui/login", data=b"--b--\r\n",
                                     headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert 400 <= resp.status < 500, await resp.text()


@pytest.mark.parametrize("path", ["/v1/files?limit=" + DIGITS, "/admin/sessions/s/events?after=" + DIGITS,
                                  "/admin/sessions/s/replay?seq=" + DIGITS])
async def test_thousands_of_digits_in_a_query_are_invalid_query(harness: Harness, path: str) -> None:
    resp = await harness.client.get(path, headers=ADMIN)
    assert resp.status == 400 and await code_of(resp) == "INVALID_QUERY", await resp.text()


async def test_a_gemini_upload_declaring_thousands_of_digits_is_not_admitted_here(harness: Harness) -> None:
    resp = await harness.client.post("/upload/v1beta/files", json={"file": {"display_name": "x"}}, headers={
        "X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
        "X-Goog-Upload-Header-Content-Type": "image/png", "X-Goog-Upload-Header-Content-Length": DIGITS})
    # not an upload this proxy takes: it goes to Google's own Files API (none in this test: 502)
    assert await code_of(resp) in (None, "UPSTREAM_UNAVAILABLE"), await resp.text()


NESTED = b"[" * 5000 + b"]" * 5000


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses",
                                  "/v1beta/models/g:generateContent"])
async def test_json_nested_thousands_deep_that_the_proxy_reads_is_invalid_json(harness: Harness, path: str) -> None:
    image = b'{"type": "image_url", "image_url": {"url": "data:image/png;base64,' + b"A" * 64 + b'"}}'
    for body in (b'{"messages": [{"content": [' + image + b']}], "x": ' + NESTED + b"}",
                 b'{"messages": [{"content": [{"type": "image_url", "image_url": {"url": "attachment:sha256:'
                 + b"a" * 64 + b'"}}]}], "x": ' + NESTED + b"}"):
        resp = await harness.client.post(path, data=body, headers={"Content-Type": "application/json",
                                                                  "X-Session-Id": "deep"})
        assert resp.status == 400 and await code_of(resp) == "INVALID_JSON", (path, await resp.text())


@pytest.mark.parametrize("path", ["/admin/sessions/s/fork", "/admin/sessions/s/replay"])
async def test_json_nested_thousands_deep_to_the_admin_api_is_refused_plainly(harness: Harness, path: str) -> None:
    resp = await harness.client.post(path, data=b'{"x": ' + NESTED + b"}",
                                     headers={**ADMIN, "Content-Type": "application/json"})
    assert 400 <= resp.status < 500, await resp.text()


async def test_a_websocket_upgrade_on_a_route_without_one_is_refused_plainly(harness: Harness) -> None:
    # (the routes with a WebSocket are relayed: tests/proxy/call/websocket)
    head = (b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    status, answer = await raw_request(harness, head)
    assert 400 <= status < 500, answer[:500]


@pytest.mark.parametrize("session", [None, "bad-ref"])
async def test_a_malformed_reference_is_a_400_naming_the_value_and_its_place(harness: Harness,
                                                                              session: str | None) -> None:
    bad = "attachment:" + "ab" * 32  # no sha256: prefix
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": bad}}]}]}
    resp = await harness.client.post("/v1/chat/completions", json=body,
                                     headers={"X-Session-Id": session} if session else {})
    assert resp.status == 400 and await code_of(resp) == "INVALID_ATTACHMENT_REF"
    message = (await resp.json())["error"]["message"]
    assert bad in message and "/messages/0/content/1/image_url/url" in message, message
    assert harness.upstream.received == []  # refused before anything went upstream


@pytest.mark.parametrize("content_type, body", [
    ("multipart/form-data", b"--b--\r\n"),  # no boundary
    ("multipart/form-data", b""),
    ("multipart/form-data; boundary=b", b""),
    ("multipart/form-data; boundary=b", b"garbage"),
    ("multipart/form-data; boundary=\"\"", b"--\r\n"),
])
async def test_a_malformed_multipart_form_is_a_400_on_every_route_that_reads_one(
        harness: Harness, content_type: str, body: bytes) -> None:
    for path in ("/admin/ui/login", "/v1/files", "/v1/attachments"):
        resp = await harness.client.post(path, data=body, headers={"Content-Type": content_type,
                                                                   "Content-Length": str(len(body))})
        assert 400 <= resp.status < 500, (path, resp.status, await resp.text())


def _chunked(body: bytes, size: int = 1000) -> bytes:
    """``body`` in chunks of ``size`` bytes, with the final empty chunk."""
    parts = [b"%x\r\n%s\r\n" % (len(body[at:at + size]), body[at:at + size]) for at in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_a_chunked_body_over_client_max_size_is_413_even_when_it_came_whole(
        make_harness: Any, path: str) -> None:
    """A chunked body has no Content-Length to refuse it by; one the proxy reads whole that came
    in the same write as its head is taken from the buffer at once (``bodies._buffered``), and is
    measured there."""
    harness = await make_harness(**{"server.client_max_size": 4096})
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n").encode()
    text = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 6000 + b'"}]}'
    status, answer = await raw_request(harness, head, _chunked(text))
    assert status == 413 and b"\r\nx-projectionist-error-code: PAYLOAD_TOO_LARGE\r\n" in answer.lower().replace(
        b"payload_too_large", b"PAYLOAD_TOO_LARGE")
    assert harness.upstream.received == []  # nothing went upstream
    fits = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"y" * 3000 + b'"}]}'
    status, answer = await raw_request(harness, head, _chunked(fits))
    assert status == 200, answer[:300]
    assert harness.upstream.last.body == fits  # as it came, every chunk of it
