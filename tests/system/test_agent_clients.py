"""The real agent CLIs, installed pinned from npm (``tests/agents.py``), configured with nothing but
the proxy's base URL and a dummy key, against a scripted upstream on loopback
(``tests/agent_upstream.py``) that refuses their image the way the providers do.

- Claude Code (an old 1.0.x of the "API Error: 400 Could not process image" reports and a current
  2.1.x): ``ANTHROPIC_BASE_URL=http://127.0.0.1:PORT``, ``claude -p``. The scripted upstream
  answers the first agent turn with a ``tool_use`` of ``Read`` on ``shot.png`` in the working
  folder; Claude Code inlines the file as a base64 ``image`` block inside the ``tool_result``
  (``messages[2].content[0].content[0]``) of its next call.
- Codex CLI: a custom model provider in ``$CODEX_HOME/config.toml`` (``base_url =
  http://127.0.0.1:PORT/v1``, ``wire_api = "responses"``), ``codex exec PROMPT -i shot.png``; the
  image is an ``input_image`` ``data:`` URL in the user message (``input[3].content[1]``).

For each client: a happy path through the proxy; a control run straight at the scripted upstream
with the refusal on (it must fail as users report, proving the harness can fail); and the rescue
through the proxy, once with a refusal that names no place and once with one that names it. The
rescue is what the README promises for a refused image (one ``attachment/rejected`` event, one
re-send with the placeholder in the image's place), for images the client inlined itself, in
the session the client carries without naming it to the proxy (Claude Code's own session id,
Codex's ``session-id`` header).

Then the next turn of that conversation (``claude -p --resume ID``, ``codex exec resume ID``): the
client re-sends its history with the refused image inlined again, and the proxy puts the
placeholder in its place before the provider is called, so the provider never sees the bytes
again. Claude Code 1.0.x starts a new session id in every process, so for it the promise holds
per process: its resumed turn is a new session, which the tenant's refusal of the bytes covers
before the call.
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import pytest
from PIL import Image

from projectionist.proxy.config import Config
from projectionist.proxy.edge.app import create_app, open_log, open_store
from projectionist.proxy.inbound.services import SERVICES
from tests.agent_upstream import ANSWER, ScriptedUpstream, Seen
from tests.agents import CLAUDE_CODE_VERSIONS, CODEX_VERSION, claude_code, codex, codex_config, run_agent
from tests.conftest import ADMIN, Harness, routed_client
from tests.fakes import CountingStore
from tests.imaging import make_image, ref_id
from tests.mcp_screenshots import screenshot

# The first run installs the CLIs from npm when .ci/run has not; each run starts a real agent.
pytestmark = pytest.mark.timeout(900)

CLIENTS = [*(f"claude-code-{v}" for v in CLAUDE_CODE_VERSIONS), f"codex-{CODEX_VERSION}"]
#: The model calls of each client (the routes the image travels on).
MODEL_PATHS = {"claude": "/v1/messages", "codex": "/v1/responses"}
PROMPT = "Describe the screenshot shot.png"
#: The user's next message in the same conversation (``run(..., resume=...)``).
NEXT_PROMPT = "Which colour did the square in the screenshot have?"


@pytest.fixture
async def scripted(aiohttp_server: Any) -> ScriptedUpstream:
    fake = ScriptedUpstream()
    server = await aiohttp_server(fake.app(), host="127.0.0.1")
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


MakeProxy = Callable[..., Awaitable[Harness]]


@pytest.fixture
def make_proxy(aiohttp_client: Any, make_config: Callable[..., Config], scripted: ScriptedUpstream,
               unused_tcp_port: int) -> MakeProxy:
    """A live proxy on a port chosen first (its ``public_url`` is its real address), recording
    every call's metadata, with ``anthropic`` and ``openai`` both at the scripted upstream."""
    async def make(**overrides: Any) -> Harness:
        public = f"http://127.0.0.1:{unused_tcp_port}"
        config = make_config(**{"server.public_url": public, "record.mode": "metadata",
                                "upstreams.anthropic": {"format": "anthropic", "url": scripted.url},
                                "upstreams.openai": {"format": "openai", "url": scripted.url}, **overrides})
        store = CountingStore(open_store(config))
        client = await routed_client(aiohttp_client, create_app(config, store=store, log=open_log(config)),
                                     server_kwargs={"host": "127.0.0.1", "port": unused_tcp_port})
        assert str(client.make_url("")).rstrip("/") == public
        return Harness(client, store, None)  # type: ignore[arg-type]  # the upstream is `scripted`
    return make


def base_url(live: Harness) -> str:
    return str(live.client.make_url("")).rstrip("/")


class Shot:
    """The image the agent sends: a PNG in its working folder (``cwd``, made under ``base``), and
    the agent's home beside it."""

    def __init__(self, base: Path) -> None:
        self.cwd = base / "work"
        self.cwd.mkdir()
        self.home = base / "home"
        self.data = make_image(64, 48, color=3)
        self.path = self.cwd / "shot.png"
        self.path.write_bytes(self.data)
        self.id = ref_id(self.data)


async def run(client: str, url: str, cwd: Path, home: Path, scripted: ScriptedUpstream,
              *, resume: str | None = None) -> tuple[int, str, str]:
    """One non-interactive turn of ``client`` whose only configuration is ``url`` (the proxy's
    or the scripted upstream's base URL) and a dummy key. ``resume``: the client's session id of
    an earlier turn in the same ``home`` and ``cwd``; this turn continues that conversation with
    ``NEXT_PROMPT`` (``claude -p --resume ID``, ``codex exec resume ID``) and attaches nothing new."""
    home.mkdir(parents=True, exist_ok=True)
    if client.startswith("claude-code-"):
        scripted.read_file = str(cwd / "shot.png")
        turn = ["--resume", resume, NEXT_PROMPT] if resume is not None else [PROMPT]
        argv = [str(claude_code(client.removeprefix("claude-code-"))), "-p", *turn, "--allowedTools", "Read"]
        env = {"HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-ant-dummy"}
    else:
        codex_home = home / ".codex"
        codex_config(codex_home, f"{url}/v1")
        turn = ["resume", "--skip-git-repo-check", resume, NEXT_PROMPT] if resume is not None else \
            ["--skip-git-repo-check", PROMPT, "-i", "shot.png"]
        argv = [str(codex(client.removeprefix("codex-"))), "exec", *turn]
        env = {"HOME": str(home), "CODEX_HOME": str(codex_home), "PROJ_API_KEY": "sk-dummy"}
    return await run_agent(argv, env, cwd, timeout=240)


def model_calls(scripted: ScriptedUpstream, client: str) -> list[Seen]:
    return scripted.requests(MODEL_PATHS[client.split("-", 1)[0]])


def carrying(calls: list[Seen], image_id: str) -> list[tuple[int, tuple[str, ...]]]:
    """(index in ``calls``, place of the image's value) for each call that inlined ``image_id``."""
    return [(i, path) for i, call in enumerate(calls) for path, found in call.images if found == image_id]


def at(body: Any, path: tuple[str, ...]) -> Any:
    for step in path:
        body = body[int(step)] if isinstance(body, list) else body[step]
    return body


def block_of(path: tuple[str, ...]) -> tuple[str, ...]:
    """The content part an image value sits in: ``...content/0/source/data`` -> ``...content/0``
    (Anthropic), ``...content/1/image_url`` -> ``...content/1`` (Responses)."""
    for key in ("source", "image_url"):
        if key in path:
            return path[:path.index(key)]
    return path


def placeholder(image_id: str) -> re.Pattern[str]:
    """The rejection placeholder for ``image_id``, with or without a name:
    ``[image unavailable: rejected; "shot.png" (sha256:1a2b3c4d)]``."""
    return re.compile(rf'\[image unavailable: rejected(?:; .*)? \(sha256:{image_id[7:15]}\)\]')


async def all_events(live: Harness) -> dict[str, list[dict[str, Any]]]:
    """Every session's events (the proxy names a session the client never named itself)."""
    await live.app[SERVICES].recording.drain()
    resp = await live.client.get("/admin/sessions", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    return {s["session"]: await live.events(s["session"]) for s in (await resp.json())["sessions"]
            if not s["session"].startswith(("~refusals", "~conversations"))}  # conversations, not the tenant's refusals


def outcome(rc: int, out: str, err: str) -> str:
    return f"exit {rc}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"


@pytest.mark.parametrize("client", CLIENTS)
async def test_happy_path_through_the_proxy(client: str, scripted: ScriptedUpstream, make_proxy: MakeProxy,
                                            tmp_path: Path) -> None:
    """No refusal: the agent, given only the proxy's base URL, finishes its turn with the scripted
    answer; its image reaches the upstream byte for byte, where the client put it."""
    live = await make_proxy()
    shot = Shot(tmp_path)
    cwd = shot.cwd
    rc, out, err = await run(client, base_url(live), cwd, shot.home, scripted)
    assert rc == 0 and ANSWER in out, outcome(rc, out, err)
    calls = model_calls(scripted, client)
    [(_, place)] = carrying(calls, shot.id)
    assert all(call.status == 200 for call in calls)
    if client.startswith("claude"):
        assert place == ("messages", "2", "content", "0", "content", "0", "source", "data")
        assert at(calls[-1].body, block_of(place))["source"]["media_type"] == "image/png"
    else:
        assert place[0] == "input" and place[-1] == "image_url"
    events = await all_events(live)
    assert [e for ev in events.values() for e in ev if e["type"] == "attachment/rejected"] == []


@pytest.mark.parametrize("client", CLIENTS)
async def test_control_the_refusal_bricks_the_client_without_the_proxy(client: str, scripted: ScriptedUpstream,
                                                                        tmp_path: Path) -> None:
    """Straight at the scripted upstream, the refusal fails the run the way users report it
    ("API Error: 400 ... Could not process image"; Codex: "ERROR: ... unsupported image"): the
    harness can fail."""
    shot = Shot(tmp_path)
    cwd = shot.cwd
    scripted.refused[shot.id] = False
    rc, out, err = await run(client, scripted.url, cwd, shot.home, scripted)
    said = out + err
    assert rc != 0, outcome(rc, out, err)
    assert ANSWER not in out
    assert ("Could not process image" in said if client.startswith("claude") else "unsupported image" in said), \
        outcome(rc, out, err)
    assert scripted.refusals >= 1
    calls = model_calls(scripted, client)
    assert all(calls[i].status == 400 for i, _ in carrying(calls, shot.id))


@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
@pytest.mark.parametrize("client", CLIENTS)
async def test_the_proxy_rescues_the_session_from_a_refused_image(client: str, named: bool,
                                                                  scripted: ScriptedUpstream,
                                                                  make_proxy: MakeProxy, tmp_path: Path) -> None:
    """The upstream refuses the image the client inlined itself (named: the error names its
    place, ``messages.2.content.0.tool_result.content.0.image.source.base64`` /
    ``param: input[3].content[1].image_url``). Through the proxy the run exits 0 with the scripted
    answer: the image reached the upstream once, the proxy re-sent the call with the rejection
    placeholder in the image's place, and the log of the client's own session holds exactly one
    ``attachment/rejected``."""
    live = await make_proxy()
    shot = Shot(tmp_path)
    cwd = shot.cwd
    scripted.refused[shot.id] = named
    rc, out, err = await run(client, base_url(live), cwd, shot.home, scripted)
    calls = model_calls(scripted, client)
    hits = carrying(calls, shot.id)
    assert len(hits) == 1, f"the image reached the upstream {len(hits)} times\n{outcome(rc, out, err)}"
    [(i, place)] = hits
    assert calls[i].status == 400 and scripted.refusals == 1
    assert i + 1 < len(calls), f"nothing was sent after the refusal\n{outcome(rc, out, err)}"
    resent = calls[i + 1]
    assert resent.status == 200
    part = at(resent.body, block_of(place))
    assert part.get("type") in ("text", "input_text"), part
    assert placeholder(shot.id).fullmatch(part["text"]), part
    assert rc == 0 and ANSWER in out, outcome(rc, out, err)
    events = await all_events(live)
    rejected = [(sid, e["data"]) for sid, ev in events.items() for e in ev if e["type"] == "attachment/rejected"]
    assert len(rejected) == 1, rejected
    assert rejected[0][1]["attachment_id"] == shot.id
    # the session is the one the client carries itself: Claude Code's session id, Codex's header
    assert rejected[0][0].startswith("claude-code:" if client.startswith("claude") else "codex:"), rejected


#: The clients whose next turn (``run(..., resume=...)``) continues the conversation in the same
#: session id: Claude Code 2.x (``--resume ID`` keeps it), Codex (``exec resume ID`` keeps it).
#: Claude Code 1.0.x starts a session id of its own in every process, ``--resume`` too: its next
#: turn is ``test_claude_code_1_0_resumes_into_a_new_session_that_never_sends_the_image_again``.
SAME_SESSION = [f"claude-code-{v}" for v in CLAUDE_CODE_VERSIONS if not v.startswith("1.")] + [f"codex-{CODEX_VERSION}"]
OLD_CLAUDE_CODE = [f"claude-code-{v}" for v in CLAUDE_CODE_VERSIONS if v.startswith("1.")]
#: The header in which each client names its own session on every call (Claude Code 1.0.x names
#: it only in ``metadata.user_id``: ``user_<hash>_account__session_<uuid>``).
SESSION_HEADERS = {"claude": "X-Claude-Code-Session-Id", "codex": "session-id"}


def since(scripted: ScriptedUpstream, client: str, start: int) -> list[Seen]:
    """The model calls the scripted upstream received from its ``start``-th request on (one turn)."""
    return [c for c in scripted.received[start:] if c.path == MODEL_PATHS[client.split("-", 1)[0]]]


def rejections(events: dict[str, list[dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """(session, data) of every ``attachment/rejected`` event in the log."""
    return [(sid, e["data"]) for sid, ev in events.items() for e in ev if e["type"] == "attachment/rejected"]


def refs_of(events: list[dict[str, Any]], after: int = 0) -> list[dict[str, Any]]:
    """The ``refs`` of every ``request/recorded`` event past ``seq`` ``after``: what the proxy found
    where in each call the client sent, and what it sent on in its place."""
    return [ref for e in events if e["type"] == "request/recorded" and e["seq"] > after
            for ref in e["data"].get("refs", [])]


def has_placeholder(call: Seen, place: tuple[str, ...], image_id: str) -> bool:
    """Whether ``call`` holds the rejection placeholder of ``image_id`` in the content part at ``place``."""
    try:
        part = at(call.body, block_of(place))
    except (KeyError, IndexError, TypeError, ValueError):
        return False
    return (isinstance(part, dict) and part.get("type") in ("text", "input_text")
            and placeholder(image_id).fullmatch(str(part.get("text"))) is not None)


def user_id_session(call: Seen) -> str | None:
    """Claude Code 1.0.x's session id, the tail of ``metadata.user_id``."""
    user = ((call.body or {}).get("metadata") or {}).get("user_id") or ""
    _, found, session = user.partition("_session_")
    return session if found else None


async def rescued_first_turn(client: str, live: Harness, scripted: ScriptedUpstream, cwd: Path, home: Path,
                             shot: Shot) -> tuple[str, tuple[str, ...]]:
    """The first turn through the proxy, its image refused (a refusal that names no place) and
    rescued: (the proxy's session of it, place of the image in the refused call)."""
    scripted.refused[shot.id] = False
    rc, out, err = await run(client, base_url(live), cwd, home, scripted)
    assert rc == 0 and ANSWER in out, outcome(rc, out, err)
    calls = model_calls(scripted, client)
    [(i, place)] = carrying(calls, shot.id)
    assert calls[i].status == 400 and scripted.refusals == 1
    [(session, data)] = rejections(await all_events(live))
    assert data["attachment_id"] == shot.id
    return session, place


@pytest.mark.parametrize("client", SAME_SESSION)
async def test_the_next_turn_of_a_rescued_session_never_sends_the_image_to_the_provider(
    client: str, scripted: ScriptedUpstream, make_proxy: MakeProxy, tmp_path: Path
) -> None:
    """The later-turn promise, with the real client. After a rescued turn the user goes on in the
    same conversation (``claude -p --resume ID``, ``codex exec resume ID``; same ``HOME`` and
    folder): the client keeps its session id and re-sends its history, the refused image inlined
    again where it was. The proxy puts the placeholder in its place before the provider is called:
    the scripted upstream never receives those bytes again (no refusal on that turn), the turn
    exits 0 with the scripted answer (Claude Code: plain text, no new ``tool_use``), and the
    session's log still holds exactly one ``attachment/rejected``. A last turn of the same
    conversation straight at the upstream, past the proxy, shows that the client really re-sends
    the bytes (they reach the upstream and are refused again): the promise is not kept vacuously."""
    live = await make_proxy()
    shot = Shot(tmp_path)
    cwd, home = shot.cwd, shot.home
    session, place = await rescued_first_turn(client, live, scripted, cwd, home, shot)
    source, own = session.split(":", 1)
    assert source == ("claude-code" if client.startswith("claude") else "codex"), session
    start = len(scripted.received)
    logged = max(e["seq"] for e in (await all_events(live))[session])

    # the next turn, through the proxy
    rc, out, err = await run(client, base_url(live), cwd, home, scripted, resume=own)
    turn = since(scripted, client, start)
    assert turn, f"the resumed turn made no model call\n{outcome(rc, out, err)}"
    assert carrying(turn, shot.id) == [], f"the image reached the provider again\n{outcome(rc, out, err)}"
    assert scripted.refusals == 1, f"{scripted.refusals - 1} refusal(s) on the resumed turn"
    assert [c.status for c in turn] == [200] * len(turn)
    assert rc == 0 and ANSWER in out, outcome(rc, out, err)
    header = SESSION_HEADERS[client.split("-", 1)[0]]
    assert {c.headers.get(header) for c in turn} == {own}, "the resumed turn carries another session id"
    if client.startswith("claude"):
        assert [c.stop_reason for c in turn] == ["end_turn"] * len(turn), "the script answered with a tool_use"
    # the client re-sent the image, the proxy found it in this session and sent the placeholder on
    assert any(has_placeholder(c, place, shot.id) for c in turn), [at(c.body, block_of(place)[:2]) for c in turn]
    events = await all_events(live)
    replaced = [(r["attachment_id"], r["outcome"], r.get("failure")) for r in refs_of(events[session], logged)]
    assert replaced and set(replaced) == {(shot.id, "placeholder", "rejected")}, replaced
    assert len(rejections(events)) == 1 and rejections(events)[0][0] == session, rejections(events)

    # the control: the same conversation resumed straight at the upstream sends the bytes again
    start = len(scripted.received)
    rc, out, err = await run(client, scripted.url, cwd, home, scripted, resume=own)
    direct = since(scripted, client, start)
    assert carrying(direct, shot.id), f"resumed past the proxy, the client did not re-send the image\n" \
                                      f"{outcome(rc, out, err)}"
    assert scripted.refusals > 1 and ANSWER not in out, outcome(rc, out, err)


@pytest.mark.parametrize("client", OLD_CLAUDE_CODE)
async def test_claude_code_1_0_resumes_into_a_new_session_that_never_sends_the_image_again(
    client: str, scripted: ScriptedUpstream, make_proxy: MakeProxy, tmp_path: Path
) -> None:
    """Claude Code 1.0.x starts a new session id in every process, ``--resume ID`` too: 1.0.88
    names its session only in ``metadata.user_id``, loads the old transcript, re-sends the image
    inlined where it was and writes a new transcript under the new id. Nothing in the call ties the
    new id to the old one, so the next turn is a NEW session for the proxy. The refusal of those
    bytes holds for the whole tenant (``call.refusals``): the new session gets its own
    ``attachment/rejected`` before the call and the placeholder in the image's place, and the
    provider never sees the bytes again (one refused call in all). The turn exits 0 with the
    scripted answer; each session's log holds exactly one rejection."""
    live = await make_proxy()
    shot = Shot(tmp_path)
    cwd, home = shot.cwd, shot.home
    session, place = await rescued_first_turn(client, live, scripted, cwd, home, shot)
    source, own = session.split(":", 1)
    assert source == "claude-code", session
    start = len(scripted.received)

    rc, out, err = await run(client, base_url(live), cwd, home, scripted, resume=own)
    turn = since(scripted, client, start)
    assert rc == 0 and ANSWER in out, outcome(rc, out, err)
    [new] = {user_id_session(c) for c in turn}
    assert new is not None and new != own, f"1.0.x kept its session id {own} on --resume: promote it to SAME_SESSION"
    assert all(c.headers.get(SESSION_HEADERS["claude"]) is None for c in turn)
    # the new session: the placeholder before the call, never the bytes, never a refusal
    assert carrying(turn, shot.id) == [] and scripted.refusals == 1, f"{scripted.refusals} refusals"
    assert [c.status for c in turn] == [200] * len(turn)
    assert any(has_placeholder(c, place, shot.id) for c in turn)
    events = await all_events(live)
    assert sorted(sid for sid, _ in rejections(events)) == sorted([session, f"claude-code:{new}"]), rejections(events)
    assert {data["attachment_id"] for _, data in rejections(events)} == {shot.id}


# --- many screenshots: Anthropic's many-image rule ----------------------------------------------------

#: Screenshots one run takes, one per agent turn: past 20, every image must be within 2000 px.
MANY: Final = 22
#: The MCP server that takes them (``tests/mcp_screenshots.py``), as browser MCP servers do: 2400 px
#: wide. Claude Code 1.0.88 passes them on as they are (its ``Read`` tool resizes to 2000 px, an
#: MCP tool's images it does not); 2.1.92 resizes them to 2000 px itself.
MCP_SERVER: Final = Path(__file__).resolve().parents[1] / "mcp_screenshots.py"
SCREENSHOT_TOOL: Final = "mcp__shots__screenshot"


async def take_screenshots(version: str, url: str, base: Path, scripted: ScriptedUpstream) -> tuple[int, str, str]:
    """One ``claude -p`` run that takes ``MANY`` screenshots, one per turn, against ``url``."""
    cwd, home = base / "work", base / "home"
    cwd.mkdir()
    home.mkdir()
    config = base / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"shots": {"type": "stdio", "command": sys.executable,
                                                           "args": [str(MCP_SERVER)]}}}))
    scripted.tool_turns = (SCREENSHOT_TOOL, MANY)
    scripted.enforce = True
    argv = [str(claude_code(version)), "-p", "Take a screenshot after each step, then describe the last one",
            "--mcp-config", str(config), "--allowedTools", SCREENSHOT_TOOL]
    env = {"HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-ant-dummy"}
    return await run_agent(argv, env, cwd, timeout=420)


def sides(call: Seen) -> list[int]:
    """The longest side of every image a Messages call carried."""
    found = []
    for path, _ in call.images:
        with Image.open(io.BytesIO(base64.b64decode(at(call.body, path)))) as img:
            found.append(max(img.size))
    return found


@pytest.mark.parametrize("version", CLAUDE_CODE_VERSIONS)
async def test_claude_code_taking_22_screenshots_keeps_working_through_the_proxy(
        version: str, scripted: ScriptedUpstream, make_proxy: MakeProxy, tmp_path: Path) -> None:
    """Each turn re-sends every screenshot taken so far; from the 21st the upstream refuses any
    side over 2000 px, as the API does. Through the proxy the run finishes: every call past 20
    images carries each screenshot as an image within 2000 px (a pinned variant of each one the
    client sent wider), none is refused, and no image is lost to a placeholder."""
    live = await make_proxy()
    rc, out, err = await take_screenshots(version, base_url(live), tmp_path, scripted)
    assert rc == 0 and ANSWER in out, outcome(rc, out, err)
    assert scripted.limit_refusals == []
    calls = [c for c in scripted.requests("/v1/messages") if c.images]
    last = calls[-1]
    assert len(last.images) == MANY and max(sides(last)) <= 2000
    wide = {found for c in calls for (_, found), side in zip(c.images, sides(c)) if side > 2000}
    if version == CLAUDE_CODE_VERSIONS[0]:  # it sends them as the tool took them: the proxy fits them
        assert len(wide) == 20 and all(set(sides(c)) == {2400} for c in calls if len(c.images) <= 20)
    events = await all_events(live)
    kinds = [e["type"] for ev in events.values() for e in ev]
    assert "attachment/rejected" not in kinds and "attachment/quarantine" not in kinds
    pinned = {e["data"]["attachment_id"] for ev in events.values() for e in ev if e["type"] == "attachment/variant"}
    taken = {ref_id(base64.b64decode(screenshot(n, 2400, 1400))) for n in range(MANY)}  # what the tool returned
    assert pinned == (taken if wide else set()), (len(pinned), len(wide))


async def test_control_claude_code_taking_22_screenshots_fails_without_the_proxy(
        scripted: ScriptedUpstream, tmp_path: Path) -> None:
    """Straight at the upstream, Claude Code 1.0.88's turn with the 21st screenshot is refused in the
    many-image rule's own words, and every retry too: the run fails as users report it (the
    harness can fail)."""
    rc, out, err = await take_screenshots(CLAUDE_CODE_VERSIONS[0], scripted.url, tmp_path, scripted)
    assert ANSWER not in out, outcome(rc, out, err)
    assert scripted.limit_refusals and all("many-image requests: 2000 pixels" in m for m in scripted.limit_refusals)
