"""The inspector in a real headless Chromium against a live proxy on loopback: sign in, find the
session, recover a quarantined image with its button (the page and the log both change, and a
reference whose bytes are still gone stays quarantined), fork from the page, and read a replay."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.browser import Browser, chromium
from tests.conftest import Harness
from tests.imaging import make_image, ref_id


@pytest.fixture(scope="module")
def driver() -> Iterator[webdriver.Chrome]:
    with chromium() as found:
        yield found


@pytest.fixture
def browser(driver: webdriver.Chrome) -> Browser:
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})  # every test signs in anew
    driver.get_log("browser")  # type: ignore[no-untyped-call]  # and starts with an empty console
    return Browser(driver, "")


def at(browser: Browser, harness: Harness) -> Browser:
    browser.base_url = str(harness.client.admin.make_url("")).rstrip("/")  # the console's own listener
    return browser


def no_console_errors(browser: Browser) -> None:
    """No script error and no CSP violation (answers with an error status are the tests' own doing)."""
    errors = [entry for entry in browser.logs() if entry["level"] == "SEVERE" and entry["source"] != "network"]
    assert errors == []


async def quarantine(harness: Harness, session: str, data: bytes, name: str) -> str:
    """An admitted image whose object is then lost, referenced by ``name`` in ``session``."""
    aid = await harness.admit(data, name=name)
    await harness.remove(aid)
    assert (await harness.chat(session, f"{aid}?name={name}")).status == 200
    return aid


async def test_sign_in_then_recover_from_the_session_page(harness: Harness, browser: Browser) -> None:
    back, gone = make_image(64, 48, color=1), make_image(64, 48, color=2)
    readmitted = await quarantine(harness, "agent-7", back, "diagram.png")
    missing = await quarantine(harness, "agent-7", gone, "screenshot.png")
    assert await harness.admit(back, name="diagram.png") == readmitted  # the bytes are back
    at(browser, harness)

    await browser.open("/admin/ui/sessions/agent-7")
    assert (await browser.path()).startswith("/admin/ui/login?next=")  # no cookie: the login form
    await browser.type("#token", "wrong")
    await browser.click("#sign-in")
    await browser.until_text(".error", "not the admin token")
    await browser.sign_in("admintok")
    assert await browser.path() == "/admin/ui"
    row = await browser.text("#sessions tbody tr")
    assert row.split()[:3] == ["agent-7", "2", "2"]  # events, quarantined
    await browser.click("#sessions a")
    await browser.until(lambda d: d.current_url.endswith("/admin/ui/sessions/agent-7"))

    rows = {r.get_attribute("data-aid"): r for r in await browser.all("#held tr.held")}
    assert set(rows) == {readmitted, missing}
    assert "diagram.png" in rows[readmitted].text and "not_found" in rows[readmitted].text
    # the re-admitted image has a thumbnail from a verified read; the missing one says it has none
    await browser.until(lambda d: d.execute_script(  # loaded, or replaced by "no verified bytes"
        "return [...document.querySelectorAll('img.thumb')].every(i => i.complete && i.naturalWidth > 0)"))
    thumbs = await browser.all("img.thumb")
    assert len(thumbs) == 1 and thumbs[0].get_property("naturalWidth") == 64
    assert "no verified bytes" in rows[missing].text

    await browser.click(f'tr[data-aid="{readmitted}"] button.recover')
    result = await browser.until_text(f'tr[data-aid="{readmitted}"] .result', "recovered")
    assert "verified image/png, " in result and "64×48" in result
    assert "recovered" in str((await browser.find(f'tr[data-aid="{readmitted}"]')).get_attribute("class"))
    assert await browser.all(f'tr[data-aid="{readmitted}"] button.recover') == []
    assert await browser.text("#held-count") == "1"

    await browser.click(f'tr[data-aid="{missing}"] button.recover')
    refused = await browser.until_text(f'tr[data-aid="{missing}"] .result', "verification failed")
    assert "ATTACHMENT_NOT_FOUND" in refused
    assert await browser.all(f'tr[data-aid="{missing}"] button.recover') != []

    events = await harness.events("agent-7")
    recovered = [e for e in events if e["type"] == "attachment/recovered"]
    assert [e["data"] for e in recovered] == [{"attachment_id": readmitted, "bytes": len(back),
                                               "media_type": "image/png", "width": 64, "height": 48}]
    assert events[-1]["type"] == "attachment/recovered"
    await browser.open("/admin/ui/sessions/agent-7")  # reloaded: only the missing one is held
    assert [r.get_attribute("data-aid") for r in await browser.all("#held tr.held")] == [missing]
    assert "verified: image/png" in await browser.text("#timeline tr.recovered")
    no_console_errors(browser)


async def test_fork_from_the_page(harness: Harness, browser: Browser) -> None:
    await quarantine(harness, "parent", make_image(color=3), "a.png")
    assert (await harness.chat("parent", ref_id(make_image(color=4)))).status == 200
    at(browser, harness)
    await browser.sign_in("admintok", "/admin/ui/sessions/parent")
    assert await browser.path() == "/admin/ui/sessions/parent"

    await browser.type("#fork-id", "parent")  # taken
    await browser.click("#fork button")
    assert "SESSION_EXISTS" in await browser.until_text("#fork-result", "fork refused")

    await browser.run(lambda: browser.driver.find_element(By.ID, "fork-id").clear())
    await browser.type("#fork-id", "child-1")
    await browser.type("#fork-seq", "1")
    await browser.click("#fork button")
    assert "forked at seq 1" in await browser.until_text("#fork-result", "forked")
    await browser.click("#fork-link")
    await browser.until(lambda d: d.current_url.endswith("/admin/ui/sessions/child-1"))
    assert await browser.text("#held-count") == "1"
    assert "from parent at seq 1" in await browser.text("#timeline tr.forked")

    child = await harness.events("child-1")
    assert [e["type"] for e in child] == ["attachment/quarantine", "session/forked"]
    assert child[-1]["data"] == {"parent": "parent", "at_seq": 1}
    no_console_errors(browser)


async def test_replay_view_puts_the_rebuilt_body_beside_the_recorded_one(make_harness: Any, browser: Browser) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    at(browser, harness)
    ok = await harness.admit(make_image(color=5), name="ok.png")
    gone = ref_id(make_image(color=6))
    assert (await harness.chat("calls", ok, gone)).status == 200
    await browser.sign_in("admintok", "/admin/ui/sessions/calls")
    call = await browser.text("#timeline tr.call")
    assert "POST /v1/chat/completions → openai (openai_chat) 200" in call
    assert "/messages/0/content/2 " + gone[:15] + " placeholder (not_found)" in call
    await browser.click("#timeline tr.call a.replay")
    await browser.until(lambda d: "/replay?seq=" in d.current_url)

    assert "matches the record" in await browser.text("#replay-facts")
    recorded, rebuilt = await browser.text("#body-recorded"), await browser.text("#body-rebuilt")
    assert f'"url": "attachment:{ok}"' in recorded
    assert re.search(r'"url": "data:image/png;base64,<sha256:[0-9a-f]{8}, \d+ bytes>"', rebuilt)
    assert f'"text": "[image unavailable: not_found ({gone[:15]})]"' in rebuilt
    marked = {e.get_attribute("data-path") for e in await browser.all("#body-rebuilt .line.diff")}
    assert {"/messages/0/content/1/image_url/url", "/messages/0/content/2/text"} <= marked
    unmarked = {e.get_attribute("data-path") for e in await browser.all("#body-rebuilt .line:not(.diff)")}
    assert "/model" in unmarked and "/messages/0/content/0/text" in unmarked
    # the marks are visible: a differing line has another background than an equal one
    colours = await browser.run(lambda: browser.driver.execute_script(
        "const s = p => getComputedStyle(document.querySelector(`#body-rebuilt .line[data-path='${p}']`)).backgroundColor;"
        "return [s('/messages/0/content/1/image_url/url'), s('/model')];"))
    assert colours[0] != colours[1]
    no_console_errors(browser)


EVIL = """<html><head><title>evil</title></head><body><script>
fetch('CONSOLE/admin/ui/sessions/s1', {credentials: 'include'}).then(r => r.text())
  .then(t => { document.title = t.includes('csrf-token') ? 'read the console' : 'read nothing'; })
  .catch(() => { document.title = 'blocked'; });
</script></body></html>"""


async def test_a_page_an_upstream_returns_never_reads_the_console(harness: Harness, browser: Browser) -> None:
    """An upstream that answers text/html: the browser shows it from the proxy's address, with
    the operator signed in to the console. The console is another origin (its own listener), and
    the page is sandboxed besides (no script, no origin), so it cannot read a console page and
    take its CSRF token, as it did when the two shared an origin."""
    console = str(harness.client.admin.make_url("")).rstrip("/")

    async def evil(request: Any, body: Any) -> Any:
        from aiohttp import web
        return web.Response(text=EVIL.replace("CONSOLE", console), content_type="text/html")

    harness.upstream.script = evil
    at(browser, harness)
    await browser.open("/admin/ui/login")
    await browser.sign_in("admintok")
    assert await browser.path() == "/admin/ui"
    # the operator's browser posts to a pass-through route (FakeUpstream scripts answer POSTs), and
    # the upstream's answer is that page, shown from this proxy's address
    # (from a blank page: the console's own CSP lets its pages post only to the console)
    await browser.run(lambda: browser.driver.get("about:blank"))
    await browser.run(lambda: browser.driver.execute_script(
        "const f = document.createElement('form'); f.method = 'POST'; f.action = arguments[0];"
        "document.body.appendChild(f); f.submit();", str(harness.client.proxy.make_url("/v1/embeddings"))))
    await browser.until(lambda d: d.current_url.endswith("/v1/embeddings"))
    await asyncio.sleep(1.5)  # the page's script, were it allowed to run, has long finished
    title = await browser.run(lambda: browser.driver.title)
    assert title == "evil", f"the upstream's page ran a script on the proxy's origin: {title!r}"
