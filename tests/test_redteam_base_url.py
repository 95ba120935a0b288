"""Red team (redteam2): the base-URL hint swallows a 404 the client needs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tests.conftest import Harness

MakeHarness = Callable[..., Awaitable[Harness]]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
NOT_DEPLOYED = {"error": {"code": "DeploymentNotFound",
                          "message": "The API deployment for this resource does not exist."}}


async def paths_without_v1(aiohttp_server: Any) -> str:
    """An OpenAI-format upstream whose paths have no /v1 (Azure OpenAI's ``/openai/deployments/...``,
    DeepSeek's ``/chat/completions`` and ``/models/{id}``): a deployment or model it lacks is its
    own, meaningful 404."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        if request.match_info["name"] != "gpt-4o":
            return web.json_response(NOT_DEPLOYED, status=404)
        return web.json_response({"id": "x", "object": "chat.completion", "choices": []})

    async def model(request: web.Request) -> web.StreamResponse:
        if request.match_info["id"] != "deepseek-chat":
            return web.json_response({"error": {"code": "model_not_found", "message": "Model Not Exist"}},
                                     status=404)
        return web.json_response({"id": "deepseek-chat", "object": "model"})

    app = web.Application()
    app.router.add_post("/openai/deployments/{name}/chat/completions", chat)
    app.router.add_get("/models/{id}", model)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


async def test_a_missing_deployment_s_404_reaches_the_client(make_harness: MakeHarness, aiohttp_server: Any) -> None:
    """``base_url_mistake`` calls every 404 of an openai/anthropic upstream on a path without /v1
    a client base URL lacking /v1, and ``relay`` drops the upstream's body for BASE_URL_MISMATCH:
    on an upstream that serves such paths (Azure, DeepSeek) the client gets wrong advice ("set the
    client's base URL to .../v1") instead of the upstream's DeploymentNotFound / model_not_found."""
    url = await paths_without_v1(aiohttp_server)
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": url}})
    ok = await harness.client.post("/openai/deployments/gpt-4o/chat/completions?api-version=2024-06-01", json=CHAT)
    assert ok.status == 200, await ok.text()
    resp = await harness.client.post("/openai/deployments/gpt-5o/chat/completions?api-version=2024-06-01", json=CHAT)
    body = await resp.text()
    assert resp.status == 404
    assert resp.headers.get("x-projectionist-error-code") != "BASE_URL_MISMATCH", body
    assert "DeploymentNotFound" in body


async def test_a_missing_model_s_404_reaches_the_client(make_harness: MakeHarness, aiohttp_server: Any) -> None:
    url = await paths_without_v1(aiohttp_server)
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": url}})
    ok = await harness.client.get("/models/deepseek-chat")
    assert ok.status == 200, await ok.text()
    resp = await harness.client.get("/models/deepseek-reasoner-x")
    body = await resp.text()
    assert resp.status == 404
    assert resp.headers.get("x-projectionist-error-code") != "BASE_URL_MISMATCH", body
    assert "model_not_found" in body
