"""``inbound.answers.Whole``: an answer read whole goes out byte for byte as ``web.Response`` would
send it (but for its ``Date``), on every method, status, HTTP version and connection a client can
ask for; its own path is the ordinary case's, and a header can never split it."""

from __future__ import annotations

import asyncio
import re
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import TestServer, make_mocked_request

from projectionist.proxy.inbound.answers import Whole

BODY = b'{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'
_DATE = re.compile(rb"\r\nDate: [^\r]*\r\n")


def _answer(kind: str, status: int, body: bytes, headers: list[tuple[str, str]]) -> web.Response:
    response = Whole(status, None, body) if kind == "whole" else web.Response(status=status, body=body)
    for name, value in headers:
        response.headers.add(name, value)
    return response


def _app() -> web.Application:
    """``/{kind}/{status}/{shape}``: the same answer made by ``Whole`` or by ``web.Response``."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        kind, status, shape = request.match_info["kind"], int(request.match_info["status"]), request.match_info["shape"]
        headers = [("Content-Type", "application/json"), ("X-Upstream", "a"), ("x-upstream", "b")]
        body = BODY
        if shape == "empty":
            body = b""
        elif shape == "untyped":
            headers = headers[1:]
        elif shape == "sized":  # the relay copies the upstream's Content-Length
            headers.append(("Content-Length", str(len(BODY))))
        elif shape == "dated":  # the upstream's own Date and Server pass through
            headers += [("Date", "Mon, 07 Dec 2026 03:50:00 GMT"), ("Server", "upstream/1")]
        elif shape == "closing":
            headers.append(("Connection", "close"))
        elif shape == "missized":  # a length that is not the body's: framed by it, as aiohttp frames
            headers.append(("Content-Length", str(len(BODY) - 5)))
        return _answer(kind, status, body, headers)

    async def prepared(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["X-Prepared"] = "1"  # what a receiver sets goes out with the head

    app = web.Application()
    app.router.add_route("*", "/{kind}/{status}/{shape}", handle)
    app.on_response_prepare.append(prepared)
    return app


async def _exchange(server: TestServer, request: bytes) -> bytes:
    """``request`` on a raw socket; every byte of the answer, up to the connection's close (the
    request asks for it, or a second request after it that does)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


SHAPES = ["plain", "empty", "untyped", "sized", "dated", "closing", "missized"]


@pytest.mark.parametrize("version", ["1.1", "1.0"])
@pytest.mark.parametrize("method", ["POST", "GET", "HEAD"])
@pytest.mark.parametrize("status", [200, 201, 204, 304, 404, 503])
async def test_whole_answers_as_web_response_does(version: str, method: str, status: int) -> None:
    server = TestServer(_app())
    await server.start_server()
    try:
        for shape in SHAPES:
            seen = {}
            for kind in ("whole", "response"):
                # two requests on one connection, the second closing it: whatever the first
                # answer's framing, the second must be read where it begins
                first = f"{method} /{kind}/{status}/{shape} HTTP/{version}\r\nHost: x\r\nContent-Length: 2\r\n"
                keep = "Connection: keep-alive\r\n" if version == "1.0" else ""
                second = f"GET /{kind}/200/plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                raw = await _exchange(server, (first + keep + "\r\n{}" + second).encode())
                seen[kind] = _DATE.sub(b"\r\nDate: *\r\n", raw)
            assert seen["whole"] == seen["response"], shape
            assert b"\r\nX-Prepared: 1\r\n" in seen["whole"]
    finally:
        await server.close()


async def test_whole_keeps_the_connection_only_as_the_request_allows() -> None:
    server = TestServer(_app())
    await server.start_server()
    try:
        raw = await _exchange(server, b"POST /whole/200/plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                      b"Content-Length: 2\r\n\r\n{}")
    finally:
        await server.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"\r\nConnection: close" in head and body == BODY


def _request(method: str = "POST") -> web.Request:
    """A request whose transport keeps what is written to it (``request.writes``)."""
    writes: list[bytes] = []
    transport = mock.Mock(spec=asyncio.Transport)
    transport.write.side_effect = writes.append
    transport.writelines.side_effect = lambda chunks: writes.extend(chunks)
    transport.is_closing.return_value = False
    protocol = mock.Mock(transport=transport, _paused=False)
    writer = StreamWriter(protocol, asyncio.get_running_loop())
    request = make_mocked_request(method, "/v1/chat/completions", transport=transport, protocol=protocol,
                                  writer=writer)
    request.writes = writes  # type: ignore[attr-defined]
    return request


async def test_the_ordinary_answer_is_one_write_of_head_and_body(monkeypatch: pytest.MonkeyPatch) -> None:
    headed: list[int] = []
    general = web.StreamResponse._prepare_headers

    async def counting(self: web.StreamResponse) -> None:
        headed.append(1)
        await general(self)

    monkeypatch.setattr(web.StreamResponse, "_prepare_headers", counting)
    request = _request()
    response = Whole(200, "OK", BODY)
    response.headers["Content-Type"] = "application/json"
    await response.prepare(request)
    await response.write_eof()
    (written,) = request.writes  # type: ignore[attr-defined]
    head, _, body = written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == BODY
    assert f"Content-Length: {len(BODY)}".encode() in head
    assert headed == [] and response.prepared and response.body_length == len(written)
    head_request = _request("HEAD")
    await Whole(200, "OK", BODY).prepare(head_request)
    assert headed == [1]  # a HEAD is aiohttp's own path


async def test_a_large_body_is_not_copied_into_the_head() -> None:
    request = _request()
    big = b"x" * (256 * 1024)
    response = Whole(200, "OK", big)
    await response.prepare(request)
    await response.write_eof()
    head, body = request.writes  # type: ignore[attr-defined]
    assert body is big and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("value", ["a\r\nSet-Cookie: x=1", "a\nb", "a\rb"])
async def test_a_header_that_would_split_the_answer_is_refused(value: str) -> None:
    request = _request()
    response = Whole(200, "OK", BODY)
    response.headers["X-Upstream"] = value
    with pytest.raises(ValueError):
        await response.prepare(request)
    assert request.writes == []  # type: ignore[attr-defined]


async def test_a_closed_connection_is_the_error_aiohttp_raises() -> None:
    from aiohttp.client_exceptions import ClientConnectionResetError

    request = _request()
    response = Whole(200, "OK", BODY)
    await response.prepare(request)
    request.transport.is_closing.return_value = True  # type: ignore[union-attr]
    with pytest.raises(ClientConnectionResetError):
        await response.write_eof()
