"""The console's listener answers the addresses a newcomer types first (issue 37): its root,
``/admin`` and ``/admin/ui/`` lead to the console (``/admin/ui``), which asks for a sign-in; they
were bare JSON 404s. What is no entry stays a 404 in the API's shape."""

from __future__ import annotations

import pytest

from tests.conftest import Harness


@pytest.mark.parametrize("path", ["/", "/admin", "/admin/", "/admin/ui/"])
async def test_the_consoles_entry_points_lead_to_it(harness: Harness, path: str) -> None:
    resp = await harness.client.admin.get(path, allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"] == "/admin/ui"
    console = await harness.client.admin.get(path)  # followed: the sign-in page, as HTML
    assert console.status == 200 and console.content_type == "text/html" and "/admin/ui/login" in str(console.url)


async def test_what_is_no_entry_is_still_the_apis_404(harness: Harness) -> None:
    resp = await harness.client.admin.get("/admin/no-such-thing")
    assert resp.status == 404 and (await resp.json())["error"]["code"] == "ROUTE_NOT_FOUND"
