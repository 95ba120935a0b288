"""Found by a red team, and held since: the Files API listing (``GET /v1/files``) passes an upstream answer that is not a
file list back "as it came" (``files.sdk._upstream_list``) with the upstream's headers, by its own
``web.Response``, not through the relay's ``_response_head``. So what the relay guarantees for every
other upstream answer is missing there: a ``Set-Cookie`` for the console's cookie (or any cookie
under ``/admin``) reaches the browser (cookies ignore ports: the console on its own port gets it),
and an HTML page is served on the proxy's origin without ``Content-Security-Policy: sandbox``
or ``X-Content-Type-Options: nosniff``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.conftest import Harness
from tests.proxy.upstream.test_client import Conn, MakeServer, RawServer, serve  # noqa: F401 (a fixture)

MakeHarness = Callable[..., Awaitable[Harness]]
PAGE = b"<html><script>document.cookie='projectionist_ui=planted; path=/admin'</script></html>"


async def hostile(conn: Conn) -> None:
    while await conn.request():
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                        b"Set-Cookie: projectionist_ui=planted; Path=/admin; HttpOnly\r\n"
                        b"Content-Length: " + str(len(PAGE)).encode() + b"\r\n\r\n" + PAGE)


@pytest.mark.parametrize("path", ["/v1/files", "/v1/chat/completions"], ids=["files-list", "relay"])
async def test_an_upstream_answer_never_sets_the_console_cookie_nor_runs_on_our_origin(
        make_harness: MakeHarness, make_config: Callable[..., Any], serve: MakeServer, path: str) -> None:  # noqa: F811
    raw: RawServer = await serve(hostile)
    harness = await make_harness(make_config(**{"upstreams.openai": {"format": "openai", "url": str(raw.url)}}))
    if path == "/v1/files":
        resp = await harness.client.get(path)
    else:
        resp = await harness.client.post(path, json={"model": "m", "messages": []})
    await resp.read()
    assert resp.status == 200
    cookies = resp.headers.getall("Set-Cookie", [])
    assert not any("projectionist_ui" in c for c in cookies), f"the console cookie came through: {cookies}"
    assert "sandbox" in resp.headers.get("Content-Security-Policy", ""), "an upstream page runs as the proxy's origin"
