"""The inspector without a browser: who may see and do what (sign-in cookie, CSRF, no admin token),
the security headers, what a page escapes, thumbnails from verified reads only, and the timeline's
window. The browser itself drives the pages in ``tests/system/test_inspector.py``."""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from PIL import Image

from projectionist.policy.events import Quarantine
from projectionist.proxy.console import ui
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.inbound.auth import Guard
from tests.backends import BACKENDS
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]


async def sign_in(harness: Harness, token: str = "admintok", next_url: str = "/admin/ui") -> Any:
    return await harness.client.post("/admin/ui/login", data={"token": token, "next": next_url},
                                     allow_redirects=False)


async def csrf_of(harness: Harness, session: str) -> str:
    page = await harness.client.get(f"/admin/ui/sessions/{session}")
    assert page.status == 200, await page.text()
    found = re.search(r'<meta name="csrf-token" content="([0-9a-f]{64})">', await page.text())
    assert found is not None
    return found.group(1)


async def quarantined(harness: Harness, session: str = "s1", *, readmit: bool = True) -> tuple[str, bytes]:
    """A session whose image was quarantined as missing; with ``readmit`` its bytes are back."""
    data = make_image(40, 30, color=7)
    aid = await harness.admit(data, name="shot.png")
    await harness.remove(aid)
    assert (await harness.chat(session, aid)).status == 200
    if readmit:
        assert await harness.admit(data, name="shot.png") == aid
    return aid, data


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def test_without_an_admin_token_the_inspector_answers_like_the_admin_api(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"server.admin_token": ""})
    for method, path in [("GET", "/admin/ui"), ("GET", "/admin/ui/login"), ("POST", "/admin/ui/login"),
                         ("GET", "/admin/ui/sessions/s1"), ("GET", "/admin/ui/static/ui.js"),
                         ("POST", "/admin/ui/sessions/s1/fork"), ("GET", f"/admin/ui/attachments/{ref_id(b'x')}/thumb")]:
        resp = await harness.client.request(method, path, data={"token": ""}, allow_redirects=False)
        assert resp.status == 401, path
        assert (await resp.json())["error"]["code"] == "ADMIN_UNAUTHORIZED"
        assert "set-cookie" not in resp.headers
    api = await harness.client.get("/admin/sessions/s1/events")
    assert api.status == 401 and (await api.json())["error"]["code"] == "ADMIN_UNAUTHORIZED"


async def test_no_cookie_is_sent_to_the_login_form_or_refused(harness: Harness) -> None:
    aid, _ = await quarantined(harness)
    for path in ["/admin/ui", "/admin/ui/sessions/s1", "/admin/ui/sessions/s1/replay?seq=1"]:
        resp = await harness.client.get(path, allow_redirects=False)
        assert resp.status == 303
        assert resp.headers["Location"].startswith("/admin/ui/login?next=%2Fadmin%2Fui")
    thumb = await harness.client.get(f"/admin/ui/attachments/{aid}/thumb")
    assert thumb.status == 401 and thumb.content_type == "application/json"
    recover = await harness.client.post(f"/admin/ui/sessions/s1/attachments/{aid}/recover")
    assert recover.status == 401 and (await recover.json())["error"]["code"] == "ADMIN_UNAUTHORIZED"
    fork = await harness.client.post("/admin/ui/sessions/s1/fork", json={"new_session_id": "s2"})
    assert fork.status == 401
    login = await harness.client.get("/admin/ui/login?next=/admin/ui/sessions/s1")
    assert login.status == 200 and 'name="token"' in await login.text()
    assert types_of(await harness.events("s1"))[-1] == "attachment/quarantine"
    assert await harness.events("s2") == []


async def test_a_wrong_token_sets_no_cookie_and_the_right_one_a_derived_strict_cookie(harness: Harness) -> None:
    wrong = await sign_in(harness, "admintoken")
    assert wrong.status == 401 and "not the admin token" in await wrong.text()
    assert "set-cookie" not in wrong.headers
    assert (await harness.client.get("/admin/ui", allow_redirects=False)).status == 303
    empty = await sign_in(harness, "")
    assert empty.status == 401 and "set-cookie" not in empty.headers

    right = await sign_in(harness, next_url="/admin/ui/sessions/s1")
    assert right.status == 303 and right.headers["Location"] == "/admin/ui/sessions/s1"
    cookie = right.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/admin/ui" in cookie
    value = right.cookies[ui.COOKIE].value
    assert "admintok" not in value and re.fullmatch(r"\d+\.[0-9a-f]{16}\.[0-9a-f]{64}", value)
    page = await harness.client.get("/admin/ui")
    assert page.status == 200 and "<h1>Sessions</h1>" in await page.text()


async def test_the_cookie_is_secure_behind_a_tls_terminator(make_harness: Any) -> None:
    plain = await make_harness()
    assert "Secure" not in (await sign_in(plain)).headers["Set-Cookie"]  # plain http: a Secure one never returns
    behind = await make_harness(**{"server.public_url": "https://llm.example.com/proxy"})
    assert "Secure" in (await sign_in(behind)).headers["Set-Cookie"]


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/admin/ui", "/admin/uix",
                                    "/admin/ui/../../v1/x\\y", "javascript:alert(1)"])
async def test_sign_in_only_sends_the_browser_to_an_inspector_page(harness: Harness, target: str) -> None:
    resp = await sign_in(harness, next_url=target)
    assert resp.status == 303 and resp.headers["Location"] == "/admin/ui"


async def test_a_forged_an_expired_or_another_tokens_cookie_is_not_a_sign_in(harness: Harness) -> None:
    guard = Guard((), "admintok")
    now = 1_900_000_000.0
    good = ui.issue(guard, now)
    assert ui.valid(guard, good, now)
    assert not ui.valid(guard, good, now + ui.TTL + 1)  # expired
    expires, nonce, mac = good.split(".")
    assert not ui.valid(guard, f"{int(expires) + 3600}.{nonce}.{mac}", now)  # a later expiry, the old MAC
    assert not ui.valid(guard, f"{expires}.{'1' * 16}.{mac}", now)  # another nonce, the old MAC
    assert not ui.valid(Guard((), "othertok"), good, now)  # the token changed: everyone signs in again
    assert not ui.valid(guard, "", now) and not ui.valid(guard, "garbage", now)
    harness.client.admin.session.cookie_jar.update_cookies({ui.COOKIE: f"{expires}.{'0' * 64}"})
    assert (await harness.client.get("/admin/ui", allow_redirects=False)).status == 303


async def test_actions_need_the_csrf_token_of_the_signed_in_cookie(harness: Harness) -> None:
    aid, _ = await quarantined(harness)
    await sign_in(harness)
    csrf = await csrf_of(harness, "s1")
    url = f"/admin/ui/sessions/s1/attachments/{aid}/recover"
    for headers in [{}, {"X-CSRF-Token": "0" * 64}, {"X-CSRF-Token": csrf[:-1]}]:
        refused = await harness.client.post(url, headers=headers)
        assert refused.status == 403 and (await refused.json())["error"]["code"] == "CSRF_REJECTED"
    fork = await harness.client.post("/admin/ui/sessions/s1/fork", json={"new_session_id": "s2"})
    assert fork.status == 403
    assert types_of(await harness.events("s1"))[-1] == "attachment/quarantine"
    assert await harness.events("s2") == []

    done = await harness.client.post(url, headers={"X-CSRF-Token": csrf})
    assert done.status == 200
    body = await done.json()
    assert body["recovered"] is True and body["event"]["data"]["width"] == 40
    assert types_of(await harness.events("s1"))[-1] == "attachment/recovered"
    forked = await harness.client.post("/admin/ui/sessions/s1/fork", json={"new_session_id": "s2"},
                                       headers={"X-CSRF-Token": csrf})
    assert forked.status == 201 and (await forked.json())["parent"] == "s1"
    assert types_of(await harness.events("s2"))[-1] == "session/forked"


async def test_a_script_may_use_the_bearer_token_instead(harness: Harness) -> None:
    aid, _ = await quarantined(harness)
    page = await harness.client.get("/admin/ui/sessions/s1", headers=ADMIN)
    assert page.status == 200 and aid[:15] in await page.text()
    done = await harness.client.post(f"/admin/ui/sessions/s1/attachments/{aid}/recover", headers=ADMIN)
    assert done.status == 200 and (await done.json())["recovered"] is True
    wrong = await harness.client.get("/admin/ui", headers={"Authorization": "Bearer nope"}, allow_redirects=False)
    assert wrong.status == 303


async def test_every_page_carries_the_security_headers(harness: Harness) -> None:
    await quarantined(harness)
    await sign_in(harness)
    for path in ["/admin/ui", "/admin/ui/login", "/admin/ui/sessions/s1", "/admin/ui/static/ui.js",
                 "/admin/ui/static/ui.css", "/admin/ui/sessions/s1/replay"]:
        resp = await harness.client.get(path)
        csp = resp.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, path
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Referrer-Policy"] == "no-referrer"
        assert resp.headers["X-Frame-Options"] == "DENY"
    page = await (await harness.client.get("/admin/ui/sessions/s1")).text()
    assert "<script>" not in page and " style=" not in page and " on" + "click=" not in page


async def test_what_a_client_or_the_log_wrote_is_escaped(harness: Harness) -> None:
    session = '"<i>x'
    aid = ref_id(make_image(color=9))
    resp = await harness.client.post("/v1/chat/completions", headers={"X-Session-Id": session}, json={
        "model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"attachment:{aid}?name=%3Cimg%20src%3Dx%3E.png"}}]}]})
    assert resp.status == 200
    await sign_in(harness)
    listing = await (await harness.client.get("/admin/ui")).text()
    assert "&quot;&lt;i&gt;x" in listing and '"<i>x' not in listing
    page = await harness.client.get("/admin/ui/sessions/%22%3Ci%3Ex")
    text = await page.text()
    assert page.status == 200 and "&lt;img src=x&gt;.png" in text and "<img src=x>" not in text


async def test_a_thumbnail_is_a_small_reencoded_png_of_verified_bytes_only(harness: Harness) -> None:
    data = make_image(400, 300, media_type="image/jpeg", color=3)
    admitted = await harness.client.post("/v1/attachments", data=data, headers={"Content-Type": "image/jpeg"})
    aid = (await admitted.json())["id"]
    await sign_in(harness)
    resp = await harness.client.get(f"/admin/ui/attachments/{aid}/thumb")
    assert resp.status == 200 and resp.content_type == "image/png"
    body = await resp.read()
    assert body != data
    with Image.open(io.BytesIO(body)) as thumb:
        assert thumb.format == "PNG" and thumb.size == (160, 120)
    assert "immutable" in resp.headers["Cache-Control"] and resp.headers["X-Content-Type-Options"] == "nosniff"
    again = await harness.client.get(f"/admin/ui/attachments/{aid}/thumb", headers={"If-None-Match": resp.headers["ETag"]})
    assert again.status == 304 and await again.read() == b""

    await harness.corrupt(aid, data[:-10] + b"\0" * 10)
    corrupt = await harness.client.get(f"/admin/ui/attachments/{aid}/thumb")
    assert corrupt.status == 404 and (await corrupt.json())["error"]["code"] == "FILE_NOT_FOUND"
    missing = await harness.client.get(f"/admin/ui/attachments/{ref_id(b'gone')}/thumb")
    assert missing.status == 404
    bad = await harness.client.get("/admin/ui/attachments/sha256:zz/thumb")
    assert bad.status == 400 and (await bad.json())["error"]["code"] == "INVALID_ATTACHMENT_REF"


async def test_a_thumbnail_that_renders_too_long_is_a_retryable_503(make_harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = await make_harness(**{"policy.variant_timeout": 0.2})
    aid = await harness.admit(make_image(8, 8, color=4))
    release = threading.Event()
    monkeypatch.setattr(ui, "make_thumbnail", lambda data: release.wait(5) and b"late")  # Pillow stuck on a hostile image
    await sign_in(harness)
    try:
        resp = await harness.client.get(f"/admin/ui/attachments/{aid}/thumb")
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"]["code"] == "STORE_BUSY"
    finally:
        release.set()


async def test_the_timeline_shows_a_window_of_the_log(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui, "PAGE", 3)
    aid = ref_id(make_image(color=11))
    for _ in range(2):
        assert (await harness.chat("long", aid)).status == 200  # one quarantine, then nothing new
    others = [await harness.admit(color=20 + n) for n in range(4)]
    for other in others:
        await harness.remove(other)
        assert (await harness.chat("long", other)).status == 200
    events = await harness.events("long")
    assert len(events) == 5
    await sign_in(harness)
    latest = await (await harness.client.get("/admin/ui/sessions/long")).text()
    assert re.findall(r'id="seq-(\d+)"', latest) == ["3", "4", "5"]
    assert "seq 3–5 of 5" in latest and "after=0" in latest
    early = await (await harness.client.get("/admin/ui/sessions/long?after=0")).text()
    assert re.findall(r'id="seq-(\d+)"', early) == ["1", "2", "3"]
    bad = await harness.client.get("/admin/ui/sessions/long?after=-1")
    assert bad.status == 400 and "INVALID_QUERY" in await bad.text()
    assert bad.content_type == "text/html"


async def test_the_replay_view_marks_what_projection_changed(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    data = make_image(color=5)
    ok = await harness.admit(data)
    gone = ref_id(make_image(color=6))
    assert (await harness.chat("r1", ok, gone)).status == 200
    await sign_in(harness)
    session = await (await harness.client.get("/admin/ui/sessions/r1")).text()
    assert '<a class="replay" href="/admin/ui/sessions/r1/replay?seq=' in session  # full mode keeps the body
    assert "no-replay" not in session
    page = await harness.client.get("/admin/ui/sessions/r1/replay")
    text = await page.text()
    assert page.status == 200, text
    assert "matches the record" in text
    marked = set(re.findall(r'<span class="line diff" data-path="([^"]*)"', text))
    assert "/messages/0/content/1/image_url/url" in marked
    assert {"/messages/0/content/2/type", "/messages/0/content/2/image_url", "/messages/0/content/2/text"} <= marked
    assert "/model" not in marked
    assert "&lt;sha256:" in text and len(max(re.findall(r"[A-Za-z0-9+/=]{40,}", text), key=len, default="")) < 80


async def test_a_replay_of_a_metadata_record_says_why_it_cannot_show_the_body(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    assert (await harness.chat("m1", ref_id(b"none"))).status == 200
    assert (await harness.chat("m1", ref_id(b"none"))).status == 200
    await sign_in(harness)
    # the session's page offers no replay that would end in a 409, and says why, once
    text = await (await harness.client.get("/admin/ui/sessions/m1")).text()
    calls = re.findall(r'<tr class="ev call" id="seq-\d+">.*?</tr>', text)
    assert len(calls) == 2 and 'class="replay"' not in text and "/replay" not in text
    assert all('<span class="no-replay" title="Calls recorded in &quot;metadata&quot; mode' in row for row in calls)
    assert text.count('<p class="note" id="no-replay">') == 1
    assert 'Set record.mode = &quot;full&quot; to replay the calls recorded from then on' in text
    # asked for anyway (an old link), the replay page says the same in its error
    page = await harness.client.get("/admin/ui/sessions/m1/replay")
    said = await page.text()
    assert page.status == 409 and "REPLAY_NEEDS_BODY" in said and "record.mode = &quot;full&quot;" in said
    none = await harness.client.get("/admin/ui/sessions/nobody/replay")
    assert none.status == 404 and "NOT_RECORDED" in await none.text()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_list_page_and_recovery_on_either_backend(harness: Harness) -> None:
    aid, _ = await quarantined(harness, "b1")
    assert (await harness.client.post("/admin/sessions/b1/fork", json={"new_session_id": "b2"}, headers=ADMIN)).status == 201
    await sign_in(harness)
    listing = await (await harness.client.get("/admin/ui")).text()
    rows = dict(re.findall(r'<a href="/admin/ui/sessions/(b\d)">b\d</a></td><td class="num">\d+</td>'
                           r'<td class="num">(\d+)</td>', listing))
    assert rows == {"b1": "1", "b2": "1"}
    csrf = await csrf_of(harness, "b1")
    done = await harness.client.post(f"/admin/ui/sessions/b1/attachments/{aid}/recover", headers={"X-CSRF-Token": csrf})
    assert done.status == 200 and (await done.json())["recovered"] is True
    listing = await (await harness.client.get("/admin/ui")).text()
    rows = dict(re.findall(r'<a href="/admin/ui/sessions/(b\d)">b\d</a></td><td class="num">\d+</td>'
                           r'<td class="num">(\d+)</td>', listing))
    assert rows == {"b1": "0", "b2": "1"} and "2 sessions, 1 with quarantined images" in listing


@pytest.mark.parametrize("cookie", ["².ab", "1²³.ab", "١٢٣٤٥٦٧٨٩٠١٢.ab"])
async def test_a_cookie_of_non_ascii_digits_is_no_sign_in_not_a_crash(harness: Harness, cookie: str) -> None:
    # str.isdigit() is true of '²', which int() refuses: a stranger's cookie must not be a 500.
    assert not ui.valid(Guard((), "admintok"), cookie, 1_900_000_000.0)
    resp = await harness.client.get("/admin/ui", headers={"Cookie": f"{ui.COOKIE}={cookie}"}, allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"].startswith("/admin/ui/login")
    for query in ["sessions/s1?after=²", "sessions/s1/replay?seq=²"]:
        page = await harness.client.get(f"/admin/ui/{query}", headers={"Authorization": "Bearer admintok"})
        assert page.status == 400 and page.headers["X-Projectionist-Error-Code"] == "INVALID_QUERY", query


async def test_signing_out_revokes_the_cookie_not_only_the_browsers_copy(harness: Harness) -> None:
    await sign_in(harness)
    cookie = harness.client.admin.session.cookie_jar.filter_cookies(harness.client.admin.make_url("/admin/ui"))["projectionist_ui"]
    csrf = await csrf_of(harness, "s1")
    assert (await harness.client.post("/admin/ui/logout", headers={"X-CSRF-Token": csrf})).status == 204
    # a copy of the cookie kept elsewhere (another tab, a stolen one) no longer signs anyone in
    page = await harness.client.get("/admin/ui", headers={"Cookie": f"projectionist_ui={cookie.value}"},
                                    allow_redirects=False)
    assert page.status in (302, 303, 401), await page.text()
    await sign_in(harness)  # a new sign-in works
    assert (await harness.client.get("/admin/ui", allow_redirects=False)).status == 200


async def test_the_session_list_is_paginated(harness: Harness) -> None:
    services = harness.app[SERVICES]
    for n in range(ui.SESSIONS_PER_PAGE + 5):  # sessions with an event each, made straight in the log
        await services.log.append(f"s{n:04d}", 0, [Quarantine("sha256:" + f"{n:064x}", "not_found", False)])
    await sign_in(harness)
    first = await (await harness.client.get("/admin/ui")).text()
    assert first.count('<tr class="held">') == ui.SESSIONS_PER_PAGE and 'href="/admin/ui?page=1"' in first
    second = await (await harness.client.get("/admin/ui?page=1")).text()
    assert second.count('<tr class="held">') == 5 and 'rel="next"' not in second and 'href="/admin/ui?page=0"' in second
    assert (await harness.client.get(f"/admin/ui?page={ui.MAX_PAGE + 1}")).status == 400
