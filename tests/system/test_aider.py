"""The real aider CLI (``aider-chat``, ``.venv-aider``: ``tests/aider.py``) pointed at projectionist
with nothing but a base URL and a dummy key, on its OpenAI route (``openai/gpt-4o``,
``OPENAI_API_BASE``) and its Anthropic route (``anthropic/claude-sonnet-4-5``,
``ANTHROPIC_API_BASE``), an image given on its command line. aider inlines the image itself (a
``data:`` URL, a base64 source) and names no session.

Behind the proxy a scripted upstream (``tests/agent_upstream.py``) answers one scripted reply and
refuses the image as providers do. Without the proxy aider prints the provider's 400 and the turn
is lost (it still exits 0). Through the proxy the refusal is rescued: one ``attachment/rejected``
event in the session the proxy derives, the call re-sent once with the placeholder in the image's
place, and aider gets its answer. A second aider run with the same image and the same first
message opens the same conversation, lands in the same derived session, and the image never
reaches the provider again: the proxy puts the placeholder in its place first.

Everything a run could reach beyond loopback goes to a dead-end proxy (``Trap``) instead, and the
tests check that nothing tried.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from projectionist.proxy.config import Config
from projectionist.proxy.edge.app import create_app, open_log, open_store
from projectionist.proxy.inbound.services import SERVICES
from tests.aider import AiderRun, run_aider
from tests.agent_upstream import ANSWER, ScriptedUpstream, Seen, Trap
from tests.conftest import ADMIN, Harness, routed_client
from tests.fakes import CountingStore, FakeUpstream
from tests.imaging import make_image
from tests.refusing import OPENAI_MESSAGE

# The first of these tests builds .venv-aider when .ci/run has not (pip, from PyPI); each aider run
# takes a few seconds (litellm's import).
pytestmark = pytest.mark.timeout(1800)

#: The rejected placeholder: ``[image unavailable: rejected (sha256:1a2b3c4d)]`` for an image the
#: client inlined with no name, ``[image unavailable: rejected; "shot.png" (sha256:1a2b3c4d)]`` with one.
PLACEHOLDER = re.compile(r'\[image unavailable: rejected(?:; .*)? \(sha256:(?P<short>[0-9a-f]{8})\)\]')


@dataclass(frozen=True)
class Route:
    name: str
    model: str
    path: str  # the upstream path aider's call reaches
    format: str  # the upstream format of the proxy's config

    def env(self, base: str) -> dict[str, str]:
        """aider's configuration: the base URL (the proxy's, or the upstream's) and a dummy key."""
        if self.name == "openai":
            return {"OPENAI_API_BASE": base + "/v1", "OPENAI_BASE_URL": base + "/v1", "OPENAI_API_KEY": "sk-dummy"}
        return {"ANTHROPIC_API_BASE": base, "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "sk-ant-dummy"}


OPENAI = Route("openai", "openai/gpt-4o", "/v1/chat/completions", "openai")
ANTHROPIC = Route("anthropic", "anthropic/claude-sonnet-4-5", "/v1/messages", "anthropic")
ROUTES = pytest.mark.parametrize("route", [OPENAI, ANTHROPIC], ids=lambda r: r.name)


@dataclass(frozen=True)
class Shot:
    data: bytes

    @property
    def id(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()


@pytest.fixture
def shot() -> Shot:
    return Shot(make_image(color=11))


@pytest.fixture
async def scripted(aiohttp_server: Any) -> ScriptedUpstream:
    fake = ScriptedUpstream(anthropic_field="base64.data")  # named: ``...image.source.base64.data: ...``
    server = await aiohttp_server(fake.app())
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


@pytest.fixture
async def trap() -> AsyncIterator[Trap]:
    trap = await Trap().start()
    yield trap
    await trap.stop()


MakeProxy = Callable[..., Awaitable[Harness]]


@pytest.fixture
def make_proxy(aiohttp_client: Any, make_config: Callable[..., Config], upstream: FakeUpstream,
               scripted: ScriptedUpstream, unused_tcp_port: int) -> MakeProxy:
    """A live proxy on loopback whose ``openai`` and ``anthropic`` upstreams are the scripted one;
    it records every call's metadata (the evidence of what an upstream accepted)."""
    async def make(**overrides: Any) -> Harness:
        public = f"http://127.0.0.1:{unused_tcp_port}"
        config = make_config(**{
            "server.public_url": public, "record.mode": "metadata",
            "upstreams.openai": {"format": "openai", "url": scripted.url},
            "upstreams.anthropic": {"format": "anthropic", "url": scripted.url}, **overrides})
        store = CountingStore(open_store(config))
        client = await routed_client(aiohttp_client, create_app(config, store=store, log=open_log(config)),
                                     server_kwargs={"host": "127.0.0.1", "port": unused_tcp_port})
        return Harness(client, store, upstream)
    return make


def base_url(live: Harness) -> str:
    return str(live.client.make_url("")).rstrip("/")


async def aider(route: Route, base: str, shot: Shot, trap: Trap, tmp_path: Path, *extra: str) -> AiderRun:
    """One aider turn: ``aider --model M --message "describe the image" shot.png`` in a clean home."""
    run = await run_aider(["--model", route.model, *extra, "--message", "describe the image", "shot.png"],
                          {**route.env(base), **trap.env()}, home=tmp_path / "home", files={"shot.png": shot.data})
    assert trap.requests == [], f"aider tried to leave loopback: {trap.requests}"
    return run


def part_of(call: Seen, image_path: tuple[str, ...]) -> Any:
    """The content part (OpenAI ``image_url`` part, Anthropic ``image`` block) holding an image value."""
    node: Any = call.body
    for step in image_path[:4]:  # messages, N, content, M
        node = node[int(step)] if isinstance(node, list) else node[step]
    return node


def without_part(call: Seen, image_path: tuple[str, ...]) -> Any:
    body = copy.deepcopy(call.body)
    node = body
    for step in image_path[:3]:
        node = node[int(step)] if isinstance(node, list) else node[step]
    node[int(image_path[3])] = None
    return body


def refusal_text(route: Route, named: bool, image_path: tuple[str, ...]) -> str:
    """What of the provider's error aider prints (it wraps lines: compare without whitespace)."""
    if route is OPENAI:
        return OPENAI_MESSAGE
    if named:
        return ".".join(image_path[:4]) + ".image.source.base64.data: Could not process image"
    return "Could not process image"


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


async def sessions(live: Harness) -> list[dict[str, Any]]:
    resp = await live.client.get("/admin/sessions", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    found: list[dict[str, Any]] = [s for s in (await resp.json())["sessions"]
                                   if not s["session"].startswith(("~refusals", "~conversations"))]  # not the tenant's refusals
    return found


@ROUTES
async def test_aider_directly_against_a_refusing_provider_prints_the_400_and_loses_the_turn(
    route: Route, scripted: ScriptedUpstream, shot: Shot, trap: Trap, tmp_path: Path
) -> None:
    """The control, what users report: no proxy, the provider refuses the image. aider shows
    litellm's ``BadRequestError`` with the provider's message, sends nothing more (a 400 is not
    retried, by aider, litellm or the openai SDK) and still exits 0, with no answer."""
    scripted.refused[shot.id] = False
    run = await aider(route, scripted.url, shot, trap, tmp_path)
    assert run.rc == 0, run.output[-3000:]
    [call] = scripted.received
    assert (call.method, call.path) == ("POST", route.path)
    [(where, found)] = call.images
    assert found == shot.id
    assert "litellm.BadRequestError" in run.stdout
    assert squeeze(refusal_text(route, False, where)) in squeeze(run.stdout)
    assert ANSWER not in run.output
    assert scripted.refusals == 1


@ROUTES
@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
async def test_aider_through_the_proxy_survives_the_provider_refusing_its_image(
    route: Route, named: bool, make_proxy: MakeProxy, scripted: ScriptedUpstream, shot: Shot, trap: Trap,
    tmp_path: Path
) -> None:
    """The rescue. The first call carries aider's image as aider inlined it (the happy path, up to
    the provider's answer). The provider refuses aider's image, with an error that
    names no place or one that does (Anthropic ``messages.8.content.1.image.source.base64.data: ...``,
    OpenAI ``param: "messages[3].content[1].image_url"``). The proxy records one
    ``attachment/rejected`` in the session it derives, re-sends the call once with the placeholder
    in the image's place, and aider gets its answer and exits 0."""
    scripted.refused[shot.id] = named
    live = await make_proxy()
    run = await aider(route, base_url(live), shot, trap, tmp_path)

    # (b) what reached the provider: the image inlined, refused; the same call with the placeholder
    assert [(c.method, c.path) for c in scripted.received] == [("POST", route.path)] * 2, \
        f"{[(c.method, c.path) for c in scripted.received]}\n{run.output[-3000:]}"
    first, second = scripted.received
    [(where, found)] = first.images
    assert found == shot.id  # the client's own inlined image reached the provider unchanged, streamed
    assert first.body["stream"] is True
    part = part_of(first, where)
    if route is OPENAI:
        assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
    else:
        assert part["type"] == "image" and part["source"]["type"] == "base64"
        assert part["source"]["media_type"] == "image/png"
    assert scripted.refusals == 1
    assert second.images == [], "the re-sent call still inlines an image"
    placeholder = part_of(second, where)
    assert placeholder["type"] == "text", placeholder
    match = PLACEHOLDER.fullmatch(placeholder["text"])
    assert match is not None, placeholder["text"]
    assert match["short"] == shot.id.removeprefix("sha256:")[:8]
    assert without_part(second, where) == without_part(first, where), "the re-sent call differs beyond the image"

    # (a) aider got the scripted answer, no error
    assert run.rc == 0, run.output[-3000:]
    assert ANSWER in run.stdout, run.output[-3000:]
    assert "BadRequestError" not in run.output

    # (c) the session the proxy derived (aider names none): exactly one rejection, of this image
    await live.app[SERVICES].recording.drain()
    found_sessions = await sessions(live)
    assert len(found_sessions) == 1, found_sessions
    events = await live.events(found_sessions[0]["session"])
    rejected = [e["data"] for e in events if e["type"] == "attachment/rejected"]
    assert len(rejected) == 1, events
    assert rejected[0]["attachment_id"] == shot.id
    assert rejected[0]["format"] == route.format


@ROUTES
async def test_aiders_next_run_of_a_rescued_conversation_never_sends_the_image_to_the_provider(
    route: Route, make_proxy: MakeProxy, scripted: ScriptedUpstream, shot: Shot, trap: Trap, tmp_path: Path
) -> None:
    """The later-turn promise, with aider. After a rescued run the user runs aider again with the
    same image on its command line and the same first message (same ``HOME`` and folder; aider
    restores no chat history): it opens the conversation the same way and inlines the same bytes,
    so the call lands in the same derived session (credential + opening messages, the image
    counted by its identity). The proxy puts the placeholder in the image's place before the
    provider is called: the scripted upstream never receives those bytes again (one call, no
    refusal), aider exits 0 with the scripted answer, and the session's log still holds exactly
    one ``attachment/rejected``."""
    scripted.refused[shot.id] = False
    live = await make_proxy()
    first_run = await aider(route, base_url(live), shot, trap, tmp_path)
    assert first_run.rc == 0 and ANSWER in first_run.stdout, first_run.output[-3000:]
    assert [c.status for c in scripted.received] == [400, 200] and scripted.refusals == 1
    refused = scripted.received[0]
    [(where, found)] = refused.images
    assert found == shot.id
    await live.app[SERVICES].recording.drain()
    [session] = [s["session"] for s in await sessions(live)]
    assert session.startswith("derived:"), session
    logged = max(e["seq"] for e in await live.events(session))

    run = await aider(route, base_url(live), shot, trap, tmp_path)

    # what reached the provider: the same call once, the placeholder where aider put the image again
    assert [(c.method, c.path) for c in scripted.received[2:]] == [("POST", route.path)], \
        f"{[(c.method, c.path, c.status) for c in scripted.received[2:]]}\n{run.output[-3000:]}"
    call = scripted.received[2]
    assert call.images == [], "the image reached the provider again"
    assert scripted.refusals == 1 and call.status == 200
    placeholder = part_of(call, where)
    assert placeholder["type"] == "text", placeholder
    match = PLACEHOLDER.fullmatch(placeholder["text"])
    assert match is not None and match["short"] == shot.id.removeprefix("sha256:")[:8], placeholder["text"]
    assert without_part(call, where) == without_part(refused, where), "the next run opened another conversation"

    # aider got the scripted answer, no error
    assert run.rc == 0, run.output[-3000:]
    assert ANSWER in run.stdout, run.output[-3000:]
    assert "BadRequestError" not in run.output

    # the same derived session: the proxy found aider's image in it and sent the placeholder on;
    # still exactly one rejection
    await live.app[SERVICES].recording.drain()
    assert [s["session"] for s in await sessions(live)] == [session]
    events = await live.events(session)
    refs = [ref for e in events if e["type"] == "request/recorded" and e["seq"] > logged
            for ref in e["data"].get("refs", [])]
    assert [(r["attachment_id"], r["outcome"], r.get("failure")) for r in refs] == \
        [(shot.id, "placeholder", "rejected")], refs
    rejected = [e["data"] for e in events if e["type"] == "attachment/rejected"]
    assert len(rejected) == 1 and rejected[0]["attachment_id"] == shot.id, rejected
