"""Where the console is: ``serve`` prints its URL at start-up (and why it will refuse you when no
admin token is set), and ``/admin`` asked of the proxy's own port answers 404 ``CONSOLE_NOT_HERE``
naming it: in the client's error format, or as a page linking there for a browser."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from tests.commands import served

TOKEN = "hint-admin-token"


def environment(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PROJECTIONIST_ADMIN_TOKEN"}
    return env if token is None else {**env, "PROJECTIONIST_ADMIN_TOKEN": token}


async def test_serve_prints_the_console_and_the_proxy_port_points_there(tmp_path: Path) -> None:
    async with served("--data-dir", str(tmp_path), lines=2, env=environment(TOKEN)) as serve, \
            aiohttp.ClientSession() as http:
        console = f"{serve.admin_url}/admin/ui"
        assert serve.banner == [
            f"projectionist serve: the proxy on {serve.url} (the base URL for clients; 1 process)",
            f"projectionist serve: the console on {console} (sign in with the admin token)"]
        async with http.get(console, allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"].startswith("/admin/ui/login")  # it is there

        for path in ("/admin", "/admin/", "/admin/ui", "/admin/ui/sessions/x", "/admin/sessions"):
            async with http.get(serve.url + path) as resp:
                assert (resp.status, resp.headers["x-projectionist-error-code"]) == (404, "CONSOLE_NOT_HERE"), path
                error = (await resp.json())["error"]
                assert error["code"] == "CONSOLE_NOT_HERE" and f"the console is {console}" in error["message"], path
        # in the format the client speaks: Anthropic's error shape for an Anthropic client
        async with http.get(serve.url + "/admin/ui", headers={"anthropic-version": "2023-06-01"}) as resp:
            body = await resp.json()
            assert resp.status == 404 and body["type"] == "error" and console in body["error"]["message"]
        # a browser gets a page with the link
        async with http.get(serve.url + "/admin/ui", headers={"Accept": "text/html,application/xhtml+xml,*/*"}) as resp:
            page = await resp.text()
            assert (resp.status, resp.content_type, resp.headers["x-projectionist-error-code"]) == \
                (404, "text/html", "CONSOLE_NOT_HERE")
            assert f'<a href="{console}">' in page and resp.headers["Content-Security-Policy"] == "default-src 'none'"
        # another spelling of the path is no typo of the console's address: it stays a plain 404
        async with http.get(URL(serve.url + "/%61dmin/ui", encoded=True)) as resp:
            assert resp.headers["x-projectionist-error-code"] == "ROUTE_NOT_FOUND"


async def test_without_an_admin_token_serve_says_the_console_will_refuse(tmp_path: Path) -> None:
    async with served("--data-dir", str(tmp_path), lines=2, env=environment(None)) as serve, \
            aiohttp.ClientSession() as http:
        line = serve.banner[1]
        assert line.startswith(f"projectionist serve: the console on {serve.admin_url}/admin/ui, but no admin token")
        assert "401 ADMIN_UNAUTHORIZED" in line and "PROJECTIONIST_ADMIN_TOKEN" in line
        async with http.get(f"{serve.admin_url}/admin/ui") as resp:
            assert resp.status == 401  # as it said


@pytest.mark.timeout(120)
async def test_the_workers_supervisor_prints_the_console_too(tmp_path: Path) -> None:
    async with served("--data-dir", str(tmp_path), "--workers", "2", lines=2, env=environment(TOKEN)) as serve, \
            aiohttp.ClientSession() as http:
        assert serve.banner[0].endswith("(the base URL for clients; 2 processes)")
        assert serve.banner[1] == f"projectionist serve: the console on {serve.admin_url}/admin/ui " \
                                  "(sign in with the admin token)"
        async with http.get(serve.url + "/admin/ui") as resp:  # each worker knows where the console is
            assert f"{serve.admin_url}/admin/ui" in (await resp.json())["error"]["message"]
