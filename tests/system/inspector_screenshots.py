"""The README's inspector screenshots, taken with headless Chromium from a live proxy on loopback.

    python -m tests.system.inspector_screenshots [OUT_DIR]     # default: docs/

Starts the fake upstream and a proxy (``record.mode = "full"``) on a temp data dir, plays a few
agent sessions through it (healthy calls, a lost object, a lost object whose bytes came back, a
fork), signs in and saves ``inspector-sessions.png`` (the list), ``inspector-session.png`` (one
session) and ``inspector-replay.png`` (its last call replayed). Nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from PIL import Image, ImageDraw

from projectionist.proxy.config import load_config, with_upstream_urls
from projectionist.proxy.edge.app import create_app
from tests.browser import Browser, chromium
from tests.fakes import FakeUpstream

TOKEN = "screenshot-admin-token"
ROOT = Path(__file__).resolve().parents[2]


def picture(kind: int, width: int = 320, height: int = 200) -> bytes:
    """A small made-up figure: bars or a window frame, in one of a few palettes."""
    palettes = [((37, 99, 235), (16, 185, 129)), ((234, 88, 12), (250, 204, 21)), ((124, 58, 237), (236, 72, 153))]
    first, second = palettes[kind % len(palettes)]
    image = Image.new("RGB", (width, height), (248, 250, 252))
    draw = ImageDraw.Draw(image)
    if kind % 2:
        draw.rectangle((10, 10, width - 10, height - 10), outline=first, width=4)
        draw.rectangle((10, 10, width - 10, 36), fill=first)
        for row in range(4):
            draw.rectangle((24, 52 + 30 * row, width - 40 - 30 * row, 70 + 30 * row), fill=second)
    else:
        for bar in range(6):
            top = 30 + (bar * 37 + kind * 23) % 130
            draw.rectangle((20 + bar * 50, top, 55 + bar * 50, height - 20), fill=first if bar % 2 else second)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
    return runner, f"http://127.0.0.1:{port}"


class Agent:
    def __init__(self, http: aiohttp.ClientSession, store: Path) -> None:
        self.http, self.store = http, store

    async def admit(self, data: bytes, name: str) -> str:
        async with self.http.post("/v1/attachments", data=data, params={"name": name},
                                  headers={"Content-Type": "image/png"}) as resp:
            assert resp.status == 200, await resp.text()
            return str((await resp.json())["id"])

    def lose(self, attachment_id: str) -> None:
        hexdigest = attachment_id.removeprefix("sha256:")
        (self.store / "objects" / hexdigest[:2] / hexdigest).unlink()

    async def ask(self, session: str, text: str, *images: tuple[str, str]) -> None:
        parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
        parts += [{"type": "image_url", "image_url": {"url": f"attachment:{aid}?name={name}"}} for aid, name in images]
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": parts}]}
        async with self.http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": session}) as resp:
            assert resp.status == 200, await resp.text()

    async def fork(self, session: str, child: str) -> None:
        async with self.http.post(f"/admin/sessions/{session}/fork", json={"new_session_id": child},
                                  headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 201, await resp.text()


async def play(agent: Agent) -> None:
    """A few sessions worth looking at; ``agent-7`` is the one shown."""
    diagram, screenshot, chart = picture(0), picture(1), picture(2)
    ids = {name: await agent.admit(data, name) for name, data in
           [("diagram.png", diagram), ("screenshot.png", screenshot), ("chart.png", chart)]}
    d, s, c = ((ids[n], n) for n in ("diagram.png", "screenshot.png", "chart.png"))
    await agent.ask("agent-7", "What changed between the diagram and the screenshot?", d, s)
    await agent.ask("support-42", "Is this chart right?", c)
    agent.lose(s[0])
    agent.lose(c[0])
    await agent.ask("agent-7", "And now, with the chart?", d, s, c)
    await agent.ask("support-42", "Again, please.", c)
    await agent.admit(chart, "chart.png")  # the chart's bytes came back: ready to recover
    await agent.fork("agent-7", "agent-7-retry")
    for n in range(3):
        await agent.ask(f"batch-{n}", "Describe the diagram.", d)


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeUpstream()
        upstream, fake.url = await start(fake.app())
        config = load_config(None, **{"server.data_dir": tmp, "server.admin_token": TOKEN, "record.mode": "full",
                                    "store.stamp_ttl": 0})  # a lost object is noticed at once
        config = with_upstream_urls(config, {"openai": fake.url, "anthropic": fake.url})
        proxy, base = await start(create_app(config))
        try:
            async with aiohttp.ClientSession(base) as http:
                await play(Agent(http, Path(config.store_path)))
            with chromium(1280, 800) as driver:
                browser = Browser(driver, base)
                await browser.sign_in(TOKEN)
                await browser.screenshot(out / "inspector-sessions.png")
                await browser.open("/admin/ui/sessions/agent-7")
                await browser.until(lambda d: d.execute_script(
                    "return [...document.querySelectorAll('img.thumb')].every(i => i.complete && i.naturalWidth > 0)"))
                await browser.screenshot(out / "inspector-session.png")
                await browser.run(lambda: driver.set_window_size(1280, 800))
                await browser.open("/admin/ui/sessions/agent-7/replay")
                await browser.screenshot(out / "inspector-replay.png")
        finally:
            await proxy.cleanup()
            await upstream.cleanup()
    print(f"wrote inspector-sessions.png, inspector-session.png and inspector-replay.png to {out}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs"))
