"""What an upstream answers never acts on the console: a pass-through answer is never sniffed
into active content, and an upstream's cookie for the console's name or path never reaches the
browser (it signed the operator out)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.conftest import Harness


async def test_an_upstream_page_is_nosniff_and_cannot_set_the_consoles_cookie(harness: Harness) -> None:
    async def page(request: web.Request, body: Any) -> web.StreamResponse:
        response = web.Response(text="<script>fetch('/admin/ui')</script>", content_type="text/html")
        response.headers.add("Set-Cookie", "projectionist_ui=forged; Path=/admin/ui; HttpOnly")
        response.headers.add("Set-Cookie", "tracker=1; Path=/ADMIN")
        response.headers.add("Set-Cookie", "theirs=1; Path=/v1")
        return response

    harness.upstream.script = page
    for resp in (await harness.client.post("/v1/embeddings", json={"input": "x"}),
                 await harness.client.post("/v1/chat/completions", json={"model": "m", "messages": []})):
        assert resp.status == 200
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers.getall("Set-Cookie") == ["theirs=1; Path=/v1"]
