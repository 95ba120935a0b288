"""``client.files.list()`` of the official ``openai`` SDK against the proxy: the upstream's own files
(fetched with the client's auth) followed by the admitted images as ``purpose="vision"`` files, with
the ``purpose`` filter, cursor pagination across both parts, and the upstream's errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp import web

from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]


def upstream_file(n: int, purpose: str) -> dict[str, Any]:
    return {"id": f"file-up{n:02d}", "object": "file", "bytes": 100 + n, "created_at": 1_700_000_000 + n,
            "filename": f"doc{n}.pdf", "purpose": purpose, "status": "processed", "expires_at": None,
            "status_details": None}


class OpenAIFiles:
    """An OpenAI-like Files API listing: newest first by default, ``after``/``limit``/``purpose``."""

    def __init__(self, files: list[dict[str, Any]]) -> None:
        self.files = files
        self.hits: list[tuple[str, dict[str, str]]] = []
        self.fail: tuple[int, dict[str, Any]] | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/files", self.list)
        return app

    async def list(self, request: web.Request) -> web.Response:
        self.hits.append((request.path_qs, dict(request.headers)))
        if self.fail is not None:
            return web.json_response(self.fail[1], status=self.fail[0])
        q = request.query
        files = sorted(self.files, key=lambda f: f["created_at"], reverse=q.get("order", "desc") == "desc")
        if "purpose" in q:
            files = [f for f in files if f["purpose"] == q["purpose"]]
        if "after" in q:
            files = files[[f["id"] for f in files].index(q["after"]) + 1:]
        limit = int(q.get("limit", "10000"))
        page = files[:limit]
        return web.json_response({"object": "list", "data": page, "has_more": len(files) > limit,
                                  "first_id": page[0]["id"] if page else None,
                                  "last_id": page[-1]["id"] if page else None})


@pytest.fixture
async def listing(make_harness: MakeHarness, aiohttp_server: Any) -> tuple[Harness, OpenAIFiles]:
    fake = OpenAIFiles([upstream_file(1, "assistants"), upstream_file(2, "vision"), upstream_file(3, "batch")])
    server = await aiohttp_server(fake.app())
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": str(server.make_url(""))}})
    return harness, fake


def client_for(harness: Harness, path: str = "/v1", **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(harness.client.make_url(path)), api_key="sk-client", max_retries=0, **kw)


async def upload(client: openai.AsyncOpenAI, *colors: int) -> list[str]:
    ids = []
    for color in colors:
        created = await client.files.create(file=(f"c{color}.png", make_image(color=color), "image/png"),
                                            purpose="vision")
        ids.append(created.id)
    return ids


async def test_list_shows_the_upstream_files_then_the_admitted_images(listing: tuple[Harness, OpenAIFiles]) -> None:
    harness, fake = listing
    async with client_for(harness) as client:
        ours = await upload(client, 180, 181)
        page = await client.files.list()
        assert [f.id for f in page.data] == ["file-up03", "file-up02", "file-up01", *sorted(ours)]
        assert page.has_more is False
        mine = {f.id: f for f in page.data if f.id.startswith("sha256:")}
        png = make_image(color=180)
        assert mine[ref_id(png)].model_dump() == {
            "id": ref_id(png), "object": "file", "bytes": len(png), "created_at": mine[ref_id(png)].created_at,
            "filename": "c180.png", "purpose": "vision", "status": "processed", "expires_at": None,
            "status_details": None}
    [(path_qs, headers)] = fake.hits
    assert path_qs == "/v1/files"
    assert headers["Authorization"] == "Bearer sk-client"  # the client's own auth, as the pass-through sends it
    assert harness.upstream.received == []


async def test_purpose_vision_filters_the_upstream_and_keeps_ours(listing: tuple[Harness, OpenAIFiles]) -> None:
    harness, fake = listing
    async with client_for(harness) as client:
        ours = await upload(client, 182)
        vision = await client.files.list(purpose="vision")
        assert [f.id for f in vision.data] == ["file-up02", *ours]
        assert {f.purpose for f in vision.data} == {"vision"}
        other = await client.files.list(purpose="assistants")
        assert [f.id for f in other.data] == ["file-up01"]  # another purpose: the upstream's alone
    assert [p for p, _ in fake.hits] == ["/v1/files?purpose=vision", "/v1/files?purpose=assistants"]


async def test_pagination_walks_the_upstream_then_ours_each_file_once(listing: tuple[Harness, OpenAIFiles]) -> None:
    harness, fake = listing
    async with client_for(harness) as client:
        ours = sorted(await upload(client, 183, 184, 185))
        pages = []
        first = await client.files.list(limit=2, order="asc")
        async for page in first.iter_pages():
            pages.append([f.id for f in page.data])
        seen = [item async for item in await client.files.list(limit=2, order="asc")]
    assert pages == [["file-up01", "file-up02"], ["file-up03", ours[0]], ours[1:]]
    assert [f.id for f in seen] == ["file-up01", "file-up02", "file-up03", *ours]
    # pages of ours only (``after=sha256:...``) never ask the upstream again
    assert [p for p, _ in fake.hits] == 2 * ["/v1/files?limit=2&order=asc", "/v1/files?limit=2&order=asc&after=file-up02"]


async def test_a_full_last_upstream_page_says_ours_are_still_to_come(listing: tuple[Harness, OpenAIFiles]) -> None:
    harness, fake = listing
    async with client_for(harness) as client:
        [ours] = await upload(client, 186)
        page = await client.files.list(limit=3)
        assert [f.id for f in page.data] == ["file-up03", "file-up02", "file-up01"] and page.has_more is True
        rest = await client.files.list(limit=3, after="file-up01")
        assert [f.id for f in rest.data] == [ours] and rest.has_more is False


async def test_upstream_errors_pass_through_and_no_files_api_lists_ours(listing: tuple[Harness, OpenAIFiles]) -> None:
    harness, fake = listing
    async with client_for(harness) as client:
        ours = await upload(client, 187)
        fake.fail = (401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                     "param": None, "code": "invalid_api_key"}})
        with pytest.raises(openai.AuthenticationError) as denied:
            await client.files.list()
        assert denied.value.code == "invalid_api_key"  # the upstream's own error, unchanged
        fake.fail = (404, {"error": {"message": "no such route"}})  # an OpenAI-compatible server without files
        page = await client.files.list()
        assert [f.id for f in page.data] == ours and page.has_more is False


async def test_bad_limit_and_cursor_are_the_clients_errors(listing: tuple[Harness, OpenAIFiles]) -> None:
    harness, fake = listing
    async with client_for(harness) as client:
        for bad in ({"limit": 0}, {"limit": 10_001}, {"after": "sha256:nothex"}):
            with pytest.raises(openai.BadRequestError) as refused:
                await client.files.list(**bad)  # type: ignore[arg-type]
            assert refused.value.code in ("INVALID_QUERY", "INVALID_ATTACHMENT_REF")
    assert [p for p, _ in fake.hits] == []


async def test_named_openai_upstream_lists_too(make_harness: MakeHarness, aiohttp_server: Any) -> None:
    fake = OpenAIFiles([upstream_file(2, "vision")])
    server = await aiohttp_server(fake.app())
    named = await make_harness(**{"upstreams.compat": {"format": "openai", "url": str(server.make_url(""))}})
    async with client_for(named, "/u/compat/v1") as client:
        ours = await upload(client, 188)
        page = await client.files.list(purpose="vision")
    assert [f.id for f in page.data] == ["file-up02", *ours]
    assert [p for p, _ in fake.hits] == ["/v1/files?purpose=vision"]


async def test_a_limit_of_non_ascii_digits_is_the_clients_error(listing: tuple[Harness, OpenAIFiles]) -> None:
    harness, fake = listing
    for limit in ["²", "1²", "١٠"]:  # str.isdigit() is true of each, int() refuses the first two
        resp = await harness.client.get("/v1/files", params={"limit": limit})
        assert resp.status == 400, limit
        assert (await resp.json())["error"]["code"] == "INVALID_QUERY"
    assert fake.hits == []
