"""The busy paths (``routing.HOT_PATHS``) reach their handler without aiohttp resolving them again
(``app._hot``), with the very match aiohttp's own resolution gives, its app, and its
``on_response_prepare``; every other path, and a request that expects ``100 Continue``, is
resolved by aiohttp as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from projectionist.proxy.config import Config
from projectionist.proxy.edge.app import create_app, open_log, open_store
from projectionist.proxy.edge.routing import HOT_PATHS
from tests.conftest import routed_client
from tests.fakes import COMPLETION

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _client(aiohttp_client: Any, make_config: Callable[..., Config],
                  seen: list[tuple[Any, ...]] | None = None) -> tuple[Any, web.Application]:
    config = make_config()
    app = create_app(config, store=open_store(config), log=open_log(config))
    if seen is not None:
        async def matched(request: web.Request, response: web.StreamResponse) -> None:
            resolved = await request.app.router.resolve(request)  # what aiohttp itself makes of it
            seen.append((request.rel_url.raw_path, request.match_info.route, resolved.route,
                         request.app, tuple(request.match_info.apps)))
        app.on_response_prepare.append(matched)
    return await routed_client(aiohttp_client, app), app


async def test_a_hot_path_is_not_resolved_again_and_any_other_is(
        aiohttp_client: Any, make_config: Callable[..., Config], monkeypatch: pytest.MonkeyPatch) -> None:
    client, app = await _client(aiohttp_client, make_config)
    resolved: list[str] = []
    general = app.router.resolve

    async def counting(request: web.Request) -> Any:
        resolved.append(request.rel_url.raw_path)
        return await general(request)

    monkeypatch.setattr(app.router, "resolve", counting)
    answer = await client.post("/v1/chat/completions", json=CHAT)
    assert answer.status == 200 and (await answer.json())["id"] == COMPLETION["id"]
    assert resolved == []
    answer = await client.get("/v1/models")  # the catch-all: aiohttp resolves it
    assert answer.status == 200 and resolved == ["/v1/models"]
    answer = await client.post("/v1/chat/completions", json=CHAT, expect100=True)  # aiohttp answers the 100
    assert answer.status == 200 and resolved == ["/v1/models", "/v1/chat/completions"]


@pytest.mark.parametrize("path", HOT_PATHS)
async def test_a_hot_path_gets_the_match_aiohttps_resolution_gives(
        aiohttp_client: Any, make_config: Callable[..., Config], path: str) -> None:
    seen: list[tuple[Any, ...]] = []
    client, app = await _client(aiohttp_client, make_config, seen)
    body = CHAT if path != "/v1/messages" else {"model": "m", "max_tokens": 8, "messages": CHAT["messages"]}
    answer = await client.post(path, json=body)
    await answer.read()
    ((raw_path, route, resolved, request_app, apps),) = seen
    assert raw_path == path and route is resolved and request_app is app and apps == (app,)


async def test_a_hot_path_spelled_otherwise_is_aiohttps_to_resolve(
        aiohttp_client: Any, make_config: Callable[..., Config]) -> None:
    """``/v1/chat/completions?x=1`` is the hot route (the query is not the path); a percent-encoded
    spelling is not its raw path: aiohttp resolves it, and it is answered as before."""
    seen: list[tuple[Any, ...]] = []
    client, _ = await _client(aiohttp_client, make_config, seen)
    answer = await client.post("/v1/chat/completions?x=1", json=CHAT)
    assert answer.status == 200
    # sent byte for byte: the upstream has no such path, and says so (it is passed through)
    answer = await client.post(URL("/v1/chat%2Fcompletions", encoded=True), json=CHAT)
    await answer.read()
    assert [entry[0] for entry in seen] == ["/v1/chat/completions", "/v1/chat%2Fcompletions"]
    assert all(route is resolved for _, route, resolved, _, _ in seen)
