"""A newcomer's base URL one /v1 off, and an upstream that fails, explain themselves (issue 37).

An upstream configured as ``https://api.openai.com/v1`` (the SDK's base, pasted) made every call
go to ``/v1/v1/...``; a client whose base URL lacked ``/v1`` called ``/chat/completions`` on an
upstream that wants ``/v1/chat/completions``: both were the upstream's bare 404. Now such a 404 is
``BASE_URL_MISMATCH`` saying which URL to change; a path that works goes on as before (DeepSeek
serves ``/chat/completions``). A 502 or 504 names the upstream and its base URL, never a
credential in it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tests.conftest import Harness

MakeHarness = Callable[..., Awaitable[Harness]]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def strict_upstream(aiohttp_server: Any, prefix: str = "") -> tuple[str, list[str]]:
    """An upstream that serves chat (and messages) at ``prefix`` + the /v1 path only, as OpenAI's
    and Anthropic's do; everything else is their 404. Returns its URL and the paths it saw."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        if request.path in (f"{prefix}/v1/chat/completions", f"{prefix}/v1/messages"):
            await request.read()
            return web.json_response({"id": "x", "object": "chat.completion", "choices": [], "type": "message",
                                      "content": [], "role": "assistant"})
        return web.json_response({"error": {"message": "Not found", "type": "invalid_request_error"}}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/"), seen


async def test_an_upstream_url_ending_in_v1_is_named_as_the_mistake(make_harness: MakeHarness,
                                                                    aiohttp_server: Any) -> None:
    url, seen = await strict_upstream(aiohttp_server)
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": url + "/v1"}})
    resp = await harness.client.post("/v1/chat/completions", json=CHAT)
    assert seen == ["/v1/v1/chat/completions"]
    assert resp.status == 404 and resp.headers["x-projectionist-error-code"] == "BASE_URL_MISMATCH"
    message = (await resp.json())["error"]["message"]
    assert "ends in /v1" in message and "[upstreams.openai] url" in message and url in message


async def test_a_client_base_url_without_v1_is_told_the_base_to_use(make_harness: MakeHarness,
                                                                    aiohttp_server: Any) -> None:
    url, seen = await strict_upstream(aiohttp_server)
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": url},
                                    "upstreams.anthropic": {"format": "anthropic", "url": url}})
    resp = await harness.client.post("/chat/completions", json=CHAT)
    assert resp.status == 404 and resp.headers["x-projectionist-error-code"] == "BASE_URL_MISMATCH"
    body = await resp.json()
    assert "has no /v1" in body["error"]["message"] and "/v1 (the SDKs' own bases" in body["error"]["message"]
    assert body["error"]["message"].endswith('the upstream said: {"error": {"message": "Not found", '
                                             '"type": "invalid_request_error"}}')  # its words are kept
    # in the client's own format: an Anthropic client gets Anthropic's error shape
    resp = await harness.client.post("/messages", json={"model": "c", "max_tokens": 5, **CHAT},
                                     headers={"anthropic-version": "2023-06-01"})
    assert resp.status == 404 and (await resp.json())["type"] == "error"
    # the right base goes through, and a 404 that is no base-URL mistake is the upstream's own
    assert (await harness.client.post("/v1/chat/completions", json=CHAT)).status == 200
    resp = await harness.client.get("/v1/no/such/thing")
    assert resp.status == 404 and "x-projectionist-error-code" not in resp.headers
    assert (await resp.json())["error"]["message"] == "Not found"
    # nor is a 404 on a path that is none of the proxy's routes (Azure's deployments, a provider's extras)
    resp = await harness.client.post("/openai/deployments/gone/chat/completions", json=CHAT)
    assert resp.status == 404 and "x-projectionist-error-code" not in resp.headers
    assert seen[:2] == ["/chat/completions", "/messages"] and seen[-1] == "/openai/deployments/gone/chat/completions"


async def test_a_path_without_v1_that_the_upstream_serves_goes_on(make_harness: MakeHarness, upstream: Any) -> None:
    """DeepSeek's own base has no /v1: its clients call /chat/completions, and it answers."""
    harness = await make_harness()  # the fake upstream answers every path
    resp = await harness.client.post("/chat/completions", json=CHAT)
    assert resp.status == 200 and upstream.last.path_qs == "/chat/completions"


async def test_an_upstream_that_fails_is_named_with_its_url_and_no_credential(make_harness: MakeHarness,
                                                                            aiohttp_server: Any) -> None:
    harness = await make_harness(**{"upstreams.openai": {"format": "openai",
                                                         "url": "http://bob:s3cret@127.0.0.1:9/api"}})
    resp = await harness.client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 502
    message = (await resp.json())["error"]["message"]
    assert "upstream 'openai' at http://127.0.0.1:9/api" in message
    assert "s3cret" not in await resp.text() and "bob" not in message

    async def stall(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stall)
    server = await aiohttp_server(app)
    slow = str(server.make_url("")).rstrip("/")
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": slow, "read_timeout": 0.2}})
    resp = await harness.client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 504 and resp.headers["x-projectionist-error-code"] == "UPSTREAM_TIMEOUT"
    assert f"upstream 'openai' at {slow}" in (await resp.json())["error"]["message"]
