"""The Codex CLI on its built-in OpenAI provider, pinned (``tests/agents.py``), with nothing but
``openai_base_url`` in its ``config.toml`` pointed at the proxy: it opens the Responses WebSocket
(``GET /v1/responses`` upgraded, ``openai-beta: responses_websockets=...``) and sends each turn as
``response.create`` messages on it (a ``generate: false`` prewarm first, then the turn).

Behind the proxy, a scripted WebSocket upstream (``CodexSocket``) answers each turn with the text
``ANSWER``, or, when the turn inlines a refused image, with OpenAI's refusal as an ``error`` event.

- Through the proxy, Codex finishes on the WebSocket as it does straight at the upstream: the
  same number of sockets and messages, no fallback to HTTP, no reconnect (before the relay, the
  proxy answered the upgrade with 500 and Codex retried 7 times, reconnected 5 times and fell back
  to HTTP, about 6.5 s a turn).
- A control run straight at the upstream with the refusal on fails, as users report.
- Through the proxy, the refused image is rescued within the socket: the upstream refuses it once,
  the proxy re-sends the turn with the placeholder, Codex never sees the error and prints the
  answer; the session (Codex's own ``session-id``) records the refusal; the next turn
  (``codex exec resume ID``), a new socket, re-sends the image in its history and the upstream
  never sees it again.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import WSMsgType, web

from projectionist.proxy.config import Config
from projectionist.proxy.edge.app import create_app, open_log, open_store
from projectionist.proxy.inbound.services import SERVICES
from tests.agents import CODEX_VERSION, codex, codex_builtin_config, run_agent
from tests.conftest import ADMIN, Harness, routed_client
from tests.fake_responses import output_message, response_object
from tests.fakes import CountingStore
from tests.imaging import make_image, ref_id
from tests.refusing import OPENAI_MESSAGE, inlined

pytestmark = pytest.mark.timeout(900)

ANSWER = "The scripted socket says: the screenshot shows a blue square."
PROMPT = "Describe the screenshot shot.png"
NEXT_PROMPT = "Which colour did the square in the screenshot have?"
REFUSAL: dict[str, Any] = {"type": "error", "status": 400,
                           "error": {"type": "invalid_request_error", "code": "invalid_image_format",
                                     "message": OPENAI_MESSAGE, "param": None}}


@dataclass
class CodexSocket:
    """The Responses WebSocket as Codex needs it: every upgrade and message recorded; a prewarm
    (``generate: false``) answered with an empty completed response, a turn with ``ANSWER``, a turn
    inlining an image in ``refused`` with OpenAI's refusal event. Any plain HTTP call is recorded
    and answered 404 (Codex must not fall back to it)."""

    url: str = ""
    upgrades: list[dict[str, str]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    http: list[str] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)
    refusals: int = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/responses" and request.headers.get("Upgrade", "").lower() == "websocket":
            return await self.socket(request)
        self.http.append(f"{request.method} {request.path}")
        return web.json_response({"error": {"message": "not here", "type": "invalid_request_error"}}, status=404)

    async def socket(self, request: web.Request) -> web.WebSocketResponse:
        self.upgrades.append(dict(request.headers))
        ws = web.WebSocketResponse(max_msg_size=64 * 1024 * 1024)
        await ws.prepare(request)
        async for message in ws:
            if message.type is not WSMsgType.TEXT:
                break
            doc = msgspec.json.decode(message.data)
            self.messages.append(doc)
            for event in self.answer(doc, len(self.messages)):
                await ws.send_str(msgspec.json.encode(event).decode())
        return ws

    def answer(self, doc: dict[str, Any], number: int) -> list[dict[str, Any]]:
        if any(found in self.refused for _, found in inlined(doc)):
            self.refusals += 1
            return [REFUSAL]
        rid = f"resp_codex_{number}"
        if doc.get("generate") is False:
            done = {**response_object(None), "id": rid, "output": []}
            return [{"type": "response.created", "sequence_number": 0, "response": {**done, "status": "in_progress"}},
                    {"type": "response.completed", "sequence_number": 1, "response": done}]
        item = output_message(ANSWER)
        done = {**response_object(ANSWER), "id": rid}
        return [{"type": "response.created", "sequence_number": 0,
                 "response": {**done, "status": "in_progress", "output": []}},
                {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                 "item": {**item, "status": "in_progress", "content": []}},
                {"type": "response.output_text.delta", "sequence_number": 2, "item_id": item["id"],
                 "output_index": 0, "content_index": 0, "delta": ANSWER, "logprobs": []},
                {"type": "response.output_item.done", "sequence_number": 3, "output_index": 0, "item": item},
                {"type": "response.completed", "sequence_number": 4, "response": done}]

    def turns(self) -> list[dict[str, Any]]:
        """The messages that asked for an answer (not the prewarms)."""
        return [m for m in self.messages if m.get("generate") is not False]


@pytest.fixture
async def upstream(aiohttp_server: Any) -> CodexSocket:
    fake = CodexSocket()
    server = await aiohttp_server(fake.app(), host="127.0.0.1")
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


MakeProxy = Callable[..., Awaitable[Harness]]


@pytest.fixture
def make_proxy(aiohttp_client: Any, make_config: Callable[..., Config], upstream: CodexSocket) -> MakeProxy:
    async def make(**overrides: Any) -> Harness:
        config = make_config(**{"record.mode": "metadata",
                                "upstreams.openai": {"format": "openai", "url": upstream.url}, **overrides})
        store = CountingStore(open_store(config))
        client = await routed_client(aiohttp_client, create_app(config, store=store, log=open_log(config)),
                                     server_kwargs={"host": "127.0.0.1"})
        return Harness(client, store, None)  # type: ignore[arg-type]  # the upstream is `upstream`
    return make


async def turn(url: str, cwd: Path, home: Path, *, image: bool = True, resume: str | None = None) -> tuple[int, str, str]:
    codex_home = home / ".codex"
    codex_builtin_config(codex_home, f"{url}/v1")
    if resume is not None:
        argv = ["resume", "--skip-git-repo-check", resume, NEXT_PROMPT]
    else:
        argv = ["--skip-git-repo-check", PROMPT, *(["-i", "shot.png"] if image else [])]
    env = {"HOME": str(home), "CODEX_HOME": str(codex_home), "CODEX_API_KEY": "sk-dummy-codex"}
    return await run_agent([str(codex(CODEX_VERSION)), "exec", *argv], env, cwd, timeout=240)


@pytest.fixture
def shot(tmp_path: Path) -> tuple[Path, Path, str]:
    cwd = tmp_path / "work"
    cwd.mkdir()
    data = make_image(64, 48, color=3)
    (cwd / "shot.png").write_bytes(data)
    return cwd, tmp_path / "home", ref_id(data)


def live_url(live: Harness) -> str:
    return str(live.client.make_url("")).rstrip("/")


async def session_events(live: Harness) -> dict[str, list[dict[str, Any]]]:
    """Every session's events (the proxy names the session Codex carries without naming it)."""
    await live.app[SERVICES].recording.drain()
    resp = await live.client.get("/admin/sessions", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    return {s["session"]: await live.events(s["session"]) for s in (await resp.json())["sessions"]
            if not s["session"].startswith(("~refusals", "~conversations"))}  # conversations, not the tenant's refusals


async def test_codex_turns_go_over_the_websocket_through_the_proxy_as_they_do_direct(
        upstream: CodexSocket, make_proxy: MakeProxy, shot: tuple[Path, Path, str], tmp_path: Path) -> None:
    cwd, _, _ = shot
    rc, out, err = await turn(upstream.url, cwd, tmp_path / "direct-home")
    assert rc == 0 and ANSWER in out, (out[-2000:], err[-2000:])
    direct = (len(upstream.upgrades), len(upstream.messages), list(upstream.http))
    assert direct[0] >= 1 and direct[2] == [], direct  # Codex on its built-in provider speaks the WebSocket
    upstream.upgrades.clear(), upstream.messages.clear(), upstream.http.clear()

    live = await make_proxy()
    rc, out, err = await turn(live_url(live), cwd, tmp_path / "proxied-home")
    assert rc == 0 and ANSWER in out, (out[-2000:], err[-2000:])
    # the same conversation on the wire: no HTTP fallback, no reconnect, no retried message
    assert (len(upstream.upgrades), len(upstream.messages), upstream.http) == direct
    for headers in upstream.upgrades:
        assert headers.get("Authorization") == "Bearer sk-dummy-codex"  # the client's key, as it sent it
        assert headers.get("openai-beta", "").startswith("responses_websockets=")


async def test_control_a_refused_image_bricks_codex_straight_at_the_upstream(
        upstream: CodexSocket, shot: tuple[Path, Path, str]) -> None:
    cwd, home, image_id = shot
    upstream.refused.add(image_id)
    rc, out, err = await turn(upstream.url, cwd, home)
    assert ANSWER not in out
    assert rc != 0 or "unsupported image" in (out + err), (rc, out[-2000:], err[-2000:])
    assert upstream.refusals >= 1


async def test_codex_over_the_websocket_is_rescued_from_a_refused_image_and_its_next_turn_never_sends_it(
        upstream: CodexSocket, make_proxy: MakeProxy, shot: tuple[Path, Path, str]) -> None:
    cwd, home, image_id = shot
    upstream.refused.add(image_id)
    live = await make_proxy()
    rc, out, err = await turn(live_url(live), cwd, home)
    assert rc == 0 and ANSWER in out, (out[-2000:], err[-2000:])
    assert upstream.refusals == 1
    turns = upstream.turns()
    carrying = [i for i, m in enumerate(turns) if any(found == image_id for _, found in inlined(m))]
    assert carrying == [0], carrying  # refused once; the re-send on the same socket carries the placeholder
    resent = msgspec.json.encode(turns[1]).decode()
    assert re.search(rf"\[image unavailable: rejected(?:; [^\]]*)? \(sha256:{image_id[7:15]}\)\]", resent), resent[-3000:]
    assert len(upstream.upgrades) == 1  # all of it within one socket
    events = await session_events(live)
    rejected = [(sid, e["data"]) for sid, evs in events.items() for e in evs if e["type"] == "attachment/rejected"]
    assert len(rejected) == 1 and rejected[0][1]["attachment_id"] == image_id, rejected
    session = rejected[0][0]
    assert session.startswith("codex:"), session
    recorded = [e for e in events[session] if e["type"] == "request/recorded"]
    assert recorded, events[session]  # each response.create went into the log as a call

    thread = upstream.upgrades[0]["session-id"]
    before = len(upstream.messages)
    rc, out, err = await turn(live_url(live), cwd, home, resume=thread)
    assert rc == 0 and ANSWER in out, (out[-2000:], err[-2000:])
    later = upstream.messages[before:]
    assert later and all(found != image_id for m in later for _, found in inlined(m))
    assert upstream.refusals == 1
