"""Pass-through: every request that is not projected reaches its upstream unchanged (method, raw
path, raw query, body bytes, end-to-end headers), streams both ways, and never touches the store."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness
from tests.imaging import make_image


MakeHarness = Callable[..., Awaitable[Harness]]


def raw(path_qs: str) -> URL:
    """A URL the test client sends byte for byte (no requoting or normalisation by yarl)."""
    return URL(path_qs, encoded=True)


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


async def serve(aiohttp_server: Any, app: web.Application) -> str:
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


# --- method, path, query, body --------------------------------------------------------------------

CASES = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/gpt-4o?include=a&include=b", None),
    ("POST", "/v1/embeddings", b'{"model": "text-embedding-3-small",  "input": ["a", "b"]}'),
    ("POST", "/v1/batches?x=1", b'{"input_file_id":"file-abc","endpoint":"/v1/chat/completions"}'),
    ("PUT", "/v1/batches/batch_1", b"\x00\x01binary\xff\xfe"),
    ("PATCH", "/v1/fine_tuning/jobs/ft-1?dry_run=true", b'{"suffix": "x"}'),
    ("DELETE", "/v1/models/ft%3Agpt-4o-mini%3Aacme%3Aabc123", None),
    ("DELETE", "/v1/batches/batch_1", b'{"reason": "cleanup"}'),
]


@pytest.mark.parametrize(("method", "path_qs", "body"), CASES, ids=[f"{m} {p}" for m, p, _ in CASES])
async def test_method_path_query_and_body_are_forwarded_exactly(
    harness: Harness, method: str, path_qs: str, body: bytes | None
) -> None:
    resp = await harness.client.request(method, raw(path_qs), data=body)
    assert resp.status == 200
    assert resp.headers["x-fake-upstream"] == "echo"
    echoed = await resp.json()
    assert echoed == {"method": method, "path_qs": path_qs, "body_len": len(body or b"")}
    [got] = harness.upstream.received
    assert (got.method, got.path_qs, got.body) == (method, path_qs, body or b"")
    assert harness.store.total == 0


async def test_percent_encoding_and_repeated_query_keys_are_preserved_byte_for_byte(harness: Harness) -> None:
    path_qs = ("/v1/files/file%2Fweird%20id?a=1&a=2&a=1&q=%2F%20x%3D%26&e=%C3%A9&plus=a+b"
               "&tilde=%7E&unreserved=%41&empty=&flag")
    resp = await harness.client.get(raw(path_qs))
    assert resp.status == 200
    # neither decoded (%2F, %20, %C3%A9), nor normalised (%41 -> A, %7E -> ~), nor reordered/merged
    assert harness.upstream.last.path_qs == path_qs
    assert (await resp.json())["path_qs"] == path_qs


async def test_other_anthropic_paths_reach_the_anthropic_upstream_unchanged(
    make_harness: MakeHarness, aiohttp_server: Any
) -> None:
    seen: list[tuple[str, str, bytes]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append((request.method, request.path_qs, await request.read()))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    harness = await make_harness(**{"upstreams.anthropic": {"format": "anthropic", "url": await serve(aiohttp_server, app)}})
    body = b'{"requests":[{"custom_id":"a","params":{"model":"claude","max_tokens":5,"messages":[]}}],  "x": 1.50}'
    cases = [("POST", "/v1/messages/batches?beta=true", body), ("GET", "/v1/messages/batches/msgbatch_1/results", None),
             ("DELETE", "/v1/messages/batches/msgbatch_1", None),
             ("POST", "/v1/messages/count_tokens", b'{"model":"claude","messages":[{"role":"user","content":"hi"}]}')]
    for method, path_qs, data in cases:
        resp = await harness.client.request(method, raw(path_qs), data=data, headers={"Content-Type": "application/json"})
        assert resp.status == 200 and await resp.json() == {"ok": True}
    assert seen == [(m, p, d or b"") for m, p, d in cases]
    assert harness.upstream.received == []  # the default openai fake saw nothing


async def test_body_with_an_attachment_reference_is_not_projected_and_the_store_is_never_read(harness: Harness) -> None:
    aid = await harness.admit(make_image(color=90))  # a healthy, readable object
    ref = b"attachment:" + aid.encode()
    openai_style = (b'{"model":"text-embedding-3-small","input":["' + ref + b'"],'
                    b'"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"' + ref + b'"}}]}]}')
    cases = [("POST", "/v1/embeddings", openai_style), ("PUT", "/v1/batches/b1", openai_style),
             ("PATCH", "/v1/chat/completions", openai_style),  # projection is for POST only
             ("GET", f"/v1/models?ref=attachment:{aid}", None)]
    for method, path, body in cases:
        resp = await harness.client.request(method, path, data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 200, path
        assert harness.upstream.last.body == (body or b"")
        assert harness.upstream.last.path_qs == path
    assert len(harness.upstream.received) == len(cases)
    assert harness.store.total == 0
    assert harness.store.reads == {}


async def test_message_batches_are_projected_request_by_request(harness: Harness) -> None:
    data = make_image(color=91)
    aid = await harness.admit(data)
    gone = "sha256:" + "9" * 64

    def params(ref: str) -> dict[str, object]:
        return {"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": f"attachment:{ref}"}}]}]}

    body = {"requests": [{"custom_id": "r1", "params": params(aid)}, {"custom_id": "r2", "params": params(gone)}]}
    resp = await harness.client.post("/v1/messages/batches", json=body, headers={"X-Session-Id": "batch"})
    assert resp.status == 200
    sent = harness.upstream.last.json()["requests"]
    assert sent[0]["params"]["messages"][0]["content"][0]["source"]["type"] == "base64"
    assert sent[1]["params"]["messages"][0]["content"][0]["text"].startswith("[image unavailable: not_found")
    assert [e["data"]["attachment_id"] for e in await harness.events("batch")] == [gone]


# --- size limits and Content-Length ---------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/uploads/upload_1/parts", "/v1/files"])
async def test_large_body_streams_past_client_max_size(make_harness: MakeHarness, path: str) -> None:
    harness = await make_harness(**{"server.client_max_size": 1024})
    body = os.urandom(5 * 1024 * 1024)
    resp = await harness.client.post(path, data=body, headers={"Content-Type": "application/octet-stream"})
    assert resp.status == 200, await resp.text()
    answer = await resp.json()
    assert answer.get("body_len", answer.get("bytes")) == len(body)  # echo route / fake Files API
    got = harness.upstream.last
    assert got.body == body
    assert lower(got.headers)["content-length"] == str(len(body))
    assert "transfer-encoding" not in lower(got.headers)


async def test_non_image_multipart_file_upload_is_forwarded_despite_a_small_client_max_size(
    make_harness: MakeHarness,
) -> None:
    """The Files rule: a non-image upload is forwarded unchanged to the upstream's Files API.

    It must not depend on ``client_max_size``: the same body sent to any other pass-through path
    streams through (test above)."""
    import aiohttp

    harness = await make_harness(**{"server.client_max_size": 1024})
    pdf = b"%PDF-1.7\n" + os.urandom(5 * 1024 * 1024)
    form = aiohttp.FormData()
    form.add_field("purpose", "assistants")
    form.add_field("file", pdf, filename="report.pdf", content_type="application/pdf")
    resp = await harness.client.post("/v1/files", data=form)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["filename"] == "report.pdf"
    assert pdf in harness.upstream.last.body
    assert harness.store.total == 0


async def test_projecting_route_still_enforces_client_max_size(make_harness: MakeHarness) -> None:
    """The contrast to the test above: only pass-through is exempt from the limit."""
    harness = await make_harness(**{"server.client_max_size": 1024})
    resp = await harness.client.post("/v1/chat/completions", data=b'{"model":"m","pad":"' + b"x" * 4096 + b'"}',
                                     headers={"Content-Type": "application/json"})
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert harness.upstream.received == []


async def test_content_length_is_kept(harness: Harness) -> None:
    body = b"a=1&b=%20two"
    resp = await harness.client.put("/v1/things/1", data=body,
                                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status == 200
    got = lower(harness.upstream.last.headers)
    assert got["content-length"] == str(len(body))
    assert "transfer-encoding" not in got
    assert got["content-type"] == "application/x-www-form-urlencoded"
    assert harness.upstream.last.body == body


async def test_chunked_request_body_is_streamed_through_intact(harness: Harness) -> None:
    pieces = [b"first-", os.urandom(100_000), b"-last"]

    async def gen() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
            await asyncio.sleep(0.01)

    resp = await harness.client.post("/v1/uploads/up_1/parts", data=gen(),
                                     headers={"Content-Type": "application/octet-stream"})
    assert resp.status == 200
    assert harness.upstream.last.body == b"".join(pieces)
    assert (await resp.json())["body_len"] == sum(map(len, pieces))


async def test_request_body_is_streamed_upstream_before_it_is_complete(
    make_harness: MakeHarness, aiohttp_server: Any
) -> None:
    """The client holds back the rest of its body until the upstream has seen the first part:
    a proxy that buffered the body would never deliver it (and the test would time out)."""
    first, rest = b"part-one|", b"part-two"
    upstream_saw_first = asyncio.Event()

    async def parts(request: web.Request) -> web.Response:
        head = await request.content.readexactly(len(first))
        upstream_saw_first.set()
        tail = await request.content.read()
        return web.json_response({"head": head.decode(), "tail": tail.decode()})

    async def body() -> AsyncIterator[bytes]:
        yield first
        await asyncio.wait_for(upstream_saw_first.wait(), 5)
        yield rest

    app = web.Application()
    app.router.add_post("/v1/uploads/up_1/parts", parts)
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": await serve(aiohttp_server, app)}})
    resp = await harness.client.post("/v1/uploads/up_1/parts", data=body())
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"head": first.decode(), "tail": rest.decode()}


async def test_request_without_a_body_sends_none(harness: Harness) -> None:
    resp = await harness.client.get("/v1/models")
    assert resp.status == 200
    got = lower(harness.upstream.last.headers)
    assert harness.upstream.last.body == b""
    assert got.get("content-length", "0") == "0"
    assert "transfer-encoding" not in got


# --- streaming responses --------------------------------------------------------------------------

async def test_streamed_response_reaches_the_client_chunk_by_chunk(make_harness: MakeHarness, aiohttp_server: Any) -> None:
    gates = [asyncio.Event() for _ in range(3)]
    finished = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "X-Stream": "yes"})
        await resp.prepare(request)
        for i, gate in enumerate(gates):
            await resp.write(b'{"chunk": %d}\n' % i)
            await gate.wait()  # the next chunk is written only after the client has seen this one
            await asyncio.sleep(0.01)
        await resp.write(b'{"done": true}\n')
        await resp.write_eof()
        finished.set()
        return resp

    app = web.Application()
    app.router.add_get("/v1/batches/b1/stream", stream)
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": await serve(aiohttp_server, app)}})
    resp = await harness.client.get("/v1/batches/b1/stream")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/x-ndjson" and resp.headers["X-Stream"] == "yes"
    for i, gate in enumerate(gates):
        line = await asyncio.wait_for(resp.content.readline(), 5)  # upstream is still held at the gate
        assert line == b'{"chunk": %d}\n' % i
        assert not finished.is_set()
        gate.set()
    assert await asyncio.wait_for(resp.read(), 5) == b'{"done": true}\n'
    assert finished.is_set()
    assert harness.store.total == 0


async def test_streamed_request_and_response_of_an_anthropic_passthrough_route(
    make_harness: MakeHarness, aiohttp_server: Any
) -> None:
    """A slow upstream on a default-anthropic path: the first chunk arrives before the last is written."""
    gate = asyncio.Event()

    async def batches(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        resp = web.StreamResponse(status=201, headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        await resp.write(b"got %d\n" % len(body))
        await gate.wait()
        await resp.write(b"bye\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/messages/batches", batches)
    harness = await make_harness(**{"upstreams.anthropic": {"format": "anthropic", "url": await serve(aiohttp_server, app)}})
    resp = await harness.client.post("/v1/messages/batches", data=b"x" * 70_000)
    assert resp.status == 201
    assert await asyncio.wait_for(resp.content.readline(), 5) == b"got 70000\n"
    gate.set()
    assert await asyncio.wait_for(resp.read(), 5) == b"bye\n"


# --- headers ---------------------------------------------------------------------------------------

async def test_hop_by_hop_headers_are_dropped_both_ways(make_harness: MakeHarness, aiohttp_server: Any) -> None:
    seen: list[dict[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(lower(dict(request.headers)))
        return web.Response(body=b"ok", headers={
            "Connection": "keep-alive, X-Up-Private", "X-Up-Private": "secret", "Keep-Alive": "timeout=5",
            "Proxy-Authenticate": "Basic realm=up", "Upgrade": "h2c", "Trailer": "X-Checksum",
            "X-End-To-End": "kept", "Cache-Control": "no-store", "ETag": '"v1"',
        })

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": await serve(aiohttp_server, app)}})
    resp = await harness.client.post("/v1/embeddings", data=b"{}", headers={
        "Connection": "keep-alive, X-Client-Private", "X-Client-Private": "1", "Keep-Alive": "timeout=9",
        "TE": "trailers", "Proxy-Authorization": "Basic c2VjcmV0", "Upgrade": "h2c",
        "Authorization": "Bearer sk-client", "X-Custom": "a, b", "Content-Type": "application/json",
        "Accept": "application/json", "OpenAI-Organization": "org-1", "X-Session-Id": "sess-pt",
    })
    assert resp.status == 200 and await resp.read() == b"ok"
    [up] = seen
    for dropped in ("x-client-private", "keep-alive", "te", "proxy-authorization", "upgrade", "x-session-id"):
        assert dropped not in up, dropped
    assert "x-client-private" not in up.get("connection", "").lower()
    for name, value in (("authorization", "Bearer sk-client"), ("x-custom", "a, b"),
                        ("content-type", "application/json"), ("accept", "application/json"),
                        ("openai-organization", "org-1")):
        assert up[name] == value, name
    down = lower(dict(resp.headers))
    for dropped in ("x-up-private", "keep-alive", "proxy-authenticate", "upgrade", "trailer"):
        assert dropped not in down, dropped
    assert "x-up-private" not in down.get("connection", "").lower()
    assert down["x-end-to-end"] == "kept"
    assert down["cache-control"] == "no-store"
    assert down["etag"] == '"v1"'


async def test_repeated_end_to_end_headers_are_all_forwarded_both_ways(
    make_harness: MakeHarness, aiohttp_server: Any
) -> None:
    from multidict import CIMultiDict

    seen: list[list[str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.getall("X-Multi"))
        headers: CIMultiDict[str] = CIMultiDict([("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"), ("Link", "<x>")])
        return web.Response(body=b"{}", headers=headers, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/models", answer)
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": await serve(aiohttp_server, app)}})
    sent: CIMultiDict[str] = CIMultiDict([("X-Multi", "one"), ("X-Multi", "two")])
    resp = await harness.client.get("/v1/models", headers=sent)
    assert resp.status == 200
    assert seen == [["one", "two"]]
    assert resp.headers.getall("Set-Cookie") == ["a=1", "b=2"]
    assert resp.headers["Link"] == "<x>"


# --- upstream errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [400, 401, 404, 409, 429, 500, 502, 503, 529])
async def test_upstream_error_status_and_body_reach_the_client_unchanged(harness: Harness, status: int) -> None:
    path_qs = "/v1/batches/batch_9?x=%2F"
    resp = await harness.client.post(raw(path_qs), data=b"payload", headers={"x-fake-status": str(status)})
    assert resp.status == status
    assert resp.headers["x-fake-upstream"] == "echo"
    assert "x-projectionist-error-code" not in resp.headers
    assert await resp.json() == {"method": "POST", "path_qs": path_qs, "body_len": 7}
    assert lower(harness.upstream.last.headers)["x-fake-status"] == str(status)


async def test_upstream_error_body_is_relayed_byte_for_byte(make_harness: MakeHarness, aiohttp_server: Any) -> None:
    payload = b'{"type":"error","error":{"type":"not_found_error","message":"no such batch"}} \n'

    async def missing(request: web.Request) -> web.Response:
        return web.Response(status=404, body=payload, content_type="application/json",
                            headers={"request-id": "req_up_1"})

    app = web.Application()
    app.router.add_get("/v1/messages/batches/{id}", missing)
    harness = await make_harness(**{"upstreams.anthropic": {"format": "anthropic", "url": await serve(aiohttp_server, app)}})
    resp = await harness.client.get("/v1/messages/batches/msgbatch_1")
    assert resp.status == 404
    assert await resp.read() == payload
    assert resp.headers["request-id"] == "req_up_1"
    assert resp.headers["Content-Length"] == str(len(payload))
