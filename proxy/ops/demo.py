"""``projectionist demo``: the keyless, runnable story of a session surviving bad images (proxy layer).

In one process: a temporary data dir, the built-in fake upstream (``fake_upstream``: it records
what it receives and answers what the model would have seen), and the real proxy app on
loopback. The story: admit images, send, delete one object and corrupt another, send again
(placeholders, two quarantine events), restart, fork, repair and recover, a refused recovery, and
an image the upstream itself refuses (one ``rejected`` quarantine, the call sent again, the
session carries on). ``--json`` writes the snapshot pinned by ``tests/snapshots/``; ``--keep``
keeps the data dir and prints how to serve it and open it in the console.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from ..edge.app import create_app
from ..inbound.services import ADMIN_APP
from ..config import load_config, with_upstream_urls
from .fake_upstream import FakeUpstream
from ...adapters.redact import shorten

IMAGES: dict[str, bytes] = {
    name: base64.b64decode(b64)
    for name, b64 in {
        "diagram.png": "iVBORw0KGgoAAAANSUhEUgAAAAMAAAACCAIAAAASFvFNAAAAFUlEQVR4nGO8o6HBwMDAwMDAxAADABYIATCkkfrTAAAAAElFTkSuQmCC",
        "screenshot.png": "iVBORw0KGgoAAAANSUhEUgAAAAIAAAADCAIAAAA2iEnWAAAAFElEQVR4nGPUWGDDwMDAxMDAgKAAE4wBCswjCosAAAAASUVORK5CYII=",
        "photo.png": "iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAFElEQVR4nGOUsznBAANMDEgANwcAOP4BKsYBRcEAAAAASUVORK5CYII=",
    }.items()
}
#: The image the demo's upstream refuses (step 9).
REFUSED = ("chart.png", base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAMAAAADCAIAAADZSiLoAAAAF0lEQVR4nGM8oRHFwMDAwMDAxAADCBYAJP4BUHpV2V4AAAAASUVORK5CYII="))
SESSION = "demo"
FORK = "demo-fork"
Say = Callable[[str], None]


class DemoFailed(Exception):
    """The story did not go as promised: the demo is also a check."""


def normalize_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state events, times blanked (records hold latencies: evidence, not the story)."""
    return [{**e, "time": "<time>"} for e in events if not e["type"].endswith("/recorded")]


class Server:
    """An app on a loopback socket, started and stopped explicitly (restart = new Server); the
    proxy's console and admin API on a socket of their own (``admin_url``)."""

    def __init__(self, app: web.Application) -> None:
        self.runners = [web.AppRunner(app, handler_cancellation=True, access_log=None)]
        if ADMIN_APP in app:
            self.runners.append(web.AppRunner(app[ADMIN_APP], handler_cancellation=True, access_log=None))
        self.socks = [socket.socket() for _ in self.runners]
        for sock in self.socks:
            sock.bind(("127.0.0.1", 0))
        self.url, *admin = ["http://127.0.0.1:%d" % sock.getsockname()[1] for sock in self.socks]
        self.admin_url = admin[0] if admin else self.url

    async def __aenter__(self) -> Server:
        for runner, sock in zip(self.runners, self.socks):
            await runner.setup()
            await web.SockSite(runner, sock).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for runner in reversed(self.runners):
            await runner.cleanup()


def _request(ids: dict[str, str]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What changed between these screens?"}]
    for name, aid in ids.items():
        parts.append({"type": "image_url", "image_url": {"url": f"attachment:{aid}?name={name}"}})
    return {"model": "demo-model", "messages": [{"role": "user", "content": parts}]}


#: The file of a kept data dir holding the demo's admin token (``serve --admin-token-file``).
TOKEN_FILE = "admin-token"


@contextlib.contextmanager
def data_dir(keep: bool) -> Iterator[str]:
    """A fresh temporary data dir, removed at the end unless ``keep``."""
    path = tempfile.mkdtemp(prefix="projectionist-demo-")
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def kept(path: str) -> list[str]:
    """How to look at a kept demo's data: the admin verbs, and ``serve`` with its console."""
    token = Path(path) / TOKEN_FILE
    return [f"The data is kept in {path}. To look at it:",
            f"   projectionist timeline {SESSION} --data-dir {path}",
            f"   projectionist serve --data-dir {path} --admin-token-file {token} --fake-upstream",
            f"then open the console it prints (http://127.0.0.1:8788/admin/ui) and sign in with the token in {token}."]


#: The last line of a demo whose data is gone.
KEEP_HINT = ("To see this session in the console, run `projectionist demo --keep`: it keeps the data and prints "
             "how to serve it.")


async def run_demo(say: Say = print, *, keep: bool = False) -> dict[str, Any]:
    """Play the whole story; return the snapshot. Raises ``DemoFailed`` if a promise breaks. With
    ``keep`` the data dir stays, with the admin token in it, and the last lines say how to open it."""
    token = secrets.token_hex(16)
    admin = {"Authorization": f"Bearer {token}"}
    steps: list[dict[str, Any]] = []
    with data_dir(keep) as tmp:
        echo = FakeUpstream()
        async with Server(echo.app()) as upstream, aiohttp.ClientSession() as http:
            config = with_upstream_urls(
                # stamp_ttl 0: the story damages objects behind the proxy's back and shows the very
                # next request noticing (with the default window it would within 10 s)
                load_config(None, **{"server.data_dir": tmp, "server.admin_token": token, "record.mode": "metadata",
                                     "store.stamp_ttl": 0}),
                {"openai": upstream.url},
            )

            async def events(proxy: Server, session: str) -> list[dict[str, Any]]:
                async with http.get(f"{proxy.admin_url}/admin/sessions/{session}/events", headers=admin) as resp:
                    found: list[dict[str, Any]] = (await resp.json())["events"]
                    return found

            async def send(proxy: Server, session: str, body: dict[str, Any]) -> tuple[int, bytes, str]:
                async with http.post(f"{proxy.url}/v1/chat/completions", json=body,
                                     headers={"X-Session-Id": session}) as resp:
                    answer = await resp.json()
                # the admin API writes the queued records first: each call's records precede the
                # next call's events, so the log's seqs are the same in every run
                await events(proxy, session)
                return resp.status, echo.bodies[-1], answer["choices"][0]["message"]["content"]

            def record(step: str, **fields: Any) -> None:
                steps.append({"step": step, **fields})

            proxy = Server(create_app(config))
            async with proxy:
                say(f"projectionist demo: proxy on {proxy.url}, console on {proxy.admin_url}/admin/ui, "
                    f"fake upstream on {upstream.url}, data in {tmp}\n")
                ids: dict[str, str] = {}
                admitted = []
                say("1. admitted three images through POST /v1/attachments:")
                for name, data in IMAGES.items():
                    async with http.post(f"{proxy.url}/v1/attachments", data=data, params={"name": name},
                                         headers={"Content-Type": "image/png"}) as resp:
                        meta = await resp.json()
                    ids[name] = meta["id"]
                    admitted.append(meta)
                    say(f"   {name}: {meta['id'][:15]}… {meta['width']}x{meta['height']}, {meta['bytes']} bytes")
                record("admit", attachments=admitted)
                body = _request(ids)

                status, sent, answer = await send(proxy, SESSION, body)
                say(f"2. sent a request with 3 references: HTTP {status}; the model saw: {answer}")
                record("first request", status=status, upstream_body=shorten(msgspec.json.decode(sent)))

                store_root = config.store_path / "objects"
                deleted, corrupted = ids["screenshot.png"], ids["photo.png"]
                hexd = deleted.removeprefix("sha256:")
                (store_root / hexd[:2] / hexd).unlink()
                hexd = corrupted.removeprefix("sha256:")
                (store_root / hexd[:2] / hexd).write_bytes(b"\x00" * len(IMAGES["photo.png"]))
                say("3. deleted screenshot.png's object and overwrote photo.png's bytes with zeros")
                record("damage", deleted=deleted, corrupted=corrupted)

                status, damaged_body, answer = await send(proxy, SESSION, body)
                log = await events(proxy, SESSION)
                quarantines = [e for e in log if e["type"] == "attachment/quarantine"]
                say(f"4. sent again: HTTP {status}; the model saw: {answer}")
                for e in quarantines:
                    say(f"   event {e['seq']}: {e['type']} {e['data']['failure']} {e['data']['attachment_id'][:15]}…")
                if status != 200 or len(quarantines) != 2:
                    raise DemoFailed(f"expected HTTP 200 and 2 quarantine events, got {status} and {len(quarantines)}")
                record("second request", status=status, upstream_body=shorten(msgspec.json.decode(damaged_body)),
                       events=normalize_events(log))

            proxy = Server(create_app(config))
            async with proxy:
                status, restarted_body, _ = await send(proxy, SESSION, body)
                same = restarted_body == damaged_body
                say(f"5. restarted the proxy and sent again: HTTP {status}; upstream body byte-identical: {same}")
                record("restart", status=status, identical=same)

                async with http.post(f"{proxy.admin_url}/admin/sessions/{SESSION}/fork", headers=admin,
                                     json={"new_session_id": FORK}) as resp:
                    fork_status = resp.status
                status, forked_body, _ = await send(proxy, FORK, body)
                forked_same = forked_body == damaged_body
                say(f"6. forked {SESSION} into {FORK} (HTTP {fork_status}) and sent there: byte-identical: {forked_same}")
                record("fork", status=status, identical=forked_same, events=normalize_events(await events(proxy, FORK)))

                async with http.post(f"{proxy.url}/v1/attachments", data=IMAGES["screenshot.png"],
                                     headers={"Content-Type": "image/png"}) as resp:
                    repaired = (await resp.json())["id"] == deleted
                async with http.post(f"{proxy.admin_url}/admin/sessions/{SESSION}/attachments/{deleted}/recover",
                                     headers=admin) as resp:
                    recovered = await resp.json()
                status, recovered_body, answer = await send(proxy, SESSION, body)
                say(f"7. re-admitted screenshot.png (same id: {repaired}) and recovered it: "
                    f"recovered={recovered['recovered']}; the model saw: {answer}")
                record("repair and recover", repaired=repaired, recovered=recovered["recovered"],
                       upstream_body=shorten(msgspec.json.decode(recovered_body)))

                before = len(await events(proxy, SESSION))
                async with http.post(f"{proxy.admin_url}/admin/sessions/{SESSION}/attachments/{corrupted}/recover",
                                     headers=admin) as resp:
                    refused_status = resp.status
                    refused_code = (await resp.json())["error"]["code"]
                after = len(await events(proxy, SESSION))
                say(f"8. tried to recover photo.png: HTTP {refused_status} {refused_code}; "
                    f"events appended: {after - before}")
                record("refused recovery", status=refused_status, code=refused_code, events_appended=after - before)
                refused = await _refusal(http, proxy, echo, send, events, body, say)
                record("upstream refuses an image", **refused)
                final = normalize_events(await events(proxy, SESSION))

    checks = [same, forked_same, repaired, recovered["recovered"], refused_status == 409, after == before,
              refused["statuses"] == [200, 200], refused["upstream_calls"] == [2, 1]]
    if not all(checks):
        raise DemoFailed(f"a promise broke: {checks}")
    say("\nThe session survived: one missing and one corrupt image and one the upstream refused, no failed "
        "request, identical bodies after restart and fork, and recovery only after verification.\n")
    if keep:
        token_file = Path(tmp) / TOKEN_FILE
        token_file.touch(mode=0o600)
        token_file.write_text(token + "\n")
        for line in kept(tmp):
            say(line)
    else:
        say(KEEP_HINT)
    return {"steps": steps, "events": {SESSION: final}}


Send = Callable[[Server, str, dict[str, Any]], Awaitable[tuple[int, bytes, str]]]
Events = Callable[[Server, str], Awaitable[list[dict[str, Any]]]]


async def _refusal(http: aiohttp.ClientSession, proxy: Server, echo: FakeUpstream, send: Send, events: Events,
                   body: dict[str, Any], say: Say) -> dict[str, Any]:
    """Step 9: a new image the upstream refuses joins the images it took before. Only the new one
    is quarantined (``attachment/rejected``, for OpenAI-format upstreams), the call goes again at once, and the
    next request derives the placeholder from the log: one call."""
    name, data = REFUSED
    async with http.post(f"{proxy.url}/v1/attachments", data=data, params={"name": name},
                         headers={"Content-Type": "image/png"}) as resp:
        chart = (await resp.json())["id"]
    echo.refuse.add(chart)
    body = {**body, "messages": [{**body["messages"][0], "content": [
        *body["messages"][0]["content"], {"type": "image_url", "image_url": {"url": f"attachment:{chart}?name={name}"}}]}]}
    statuses, calls = [], []
    for _ in range(2):
        before = len(echo.bodies)
        status, sent, answer = await send(proxy, SESSION, body)
        statuses.append(status)
        calls.append(len(echo.bodies) - before)
    rejected = [e for e in await events(proxy, SESSION) if e["type"] == "attachment/rejected"]
    say(f"9. the upstream refuses a new image, {name}: HTTP {statuses[0]} after {calls[0]} upstream calls, "
        f"{len(rejected)} rejected quarantine; sent again: HTTP {statuses[1]}, {calls[1]} call; the model saw: {answer}")
    return {"statuses": statuses, "upstream_calls": calls, "events": normalize_events(rejected),
            "upstream_body": shorten(msgspec.json.decode(sent))}


def write_snapshot(snapshot: dict[str, Any], target: str) -> None:
    data = msgspec.json.format(msgspec.json.encode(snapshot), indent=2) + b"\n"
    if target == "-":
        sys.stdout.buffer.write(data)
    else:
        Path(target).write_bytes(data)

