"""The agents people run today beyond the suite's first four (issue 38), each installed pinned
from npm (``tests/agents.py``), given nothing but the proxy's base URL and a dummy key, and run
headless in a network namespace of its own (``tests/netns.py``): the proxy is the only address
it can reach, so everything it needs must answer there, and nothing it sends leaves the machine.
Behind the proxy, the scripted upstream (``tests/agent_upstream.py``) refuses the image as the
provider does.

For each agent:

- a plain turn with a screenshot works (exit 0, the scripted answer), every call it made was
  answered 2xx (no route it needs, a model list, a token count, a side call, is a 404 or a 400),
  and its model call streamed;
- straight at the scripted upstream, the refusal fails the run (the harness can fail);
- through the proxy, the image refused plainly and with its place named is rescued: the run
  exits 0, the image reached the upstream in one refused call, and the log holds exactly one
  ``attachment/rejected``, in the session the proxy found for that client;
- the next turn of the same conversation (the agent's own resume) never sends the image to the
  provider again;
- Qwen Code's compaction (a summary first, the screenshot attached anew) keeps the conversation's
  session (the conversations index), and the image its placeholder.

These start real agents (seconds each): they run in a CI step of their own (the ``agents`` mark,
``.ci/run``), not in the README's test command.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from structlog.testing import capture_logs

from projectionist.proxy.config import Config
from projectionist.proxy.edge.app import create_app, open_log, open_store
from projectionist.proxy.inbound.services import SERVICES
from tests import agents, netns
from tests.agent_upstream import ANSWER, ScriptedUpstream, Seen, is_model_call
from tests.conftest import Harness, routed_client
from tests.fakes import CountingStore
from tests.system.test_agent_clients import (
    Shot,
    all_events,
    at,
    block_of,
    carrying,
    outcome,
    placeholder,
    rejections,
    scripted,  # noqa: F401  (the fixture: the scripted upstream on loopback)
)

pytestmark = [pytest.mark.agents, pytest.mark.timeout(600),
              pytest.mark.skipif(not netns.available(), reason="no network namespace can be made here")]

PROMPT: Final = "Describe the screenshot"
NEXT_PROMPT: Final = "Which colour did the square in the screenshot have?"


@dataclass(frozen=True)
class Agent:
    """How one agent is run headless with only a base URL: its command line for a turn (and for
    the next turn of the same conversation), its environment, the files it reads at start."""

    name: str
    #: ``argv(prompt, first)``: the command line of a turn; ``first`` is False for the next turn.
    argv: Callable[[str, bool], list[str]]
    #: ``env(url)``: the base URL and a dummy key, as the agent's documentation spells them.
    env: Callable[[str], dict[str, str]]
    #: ``setup(home, url)``: settings files under the agent's ``HOME``.
    setup: Callable[[Path, str], None] = lambda home, url: None
    #: Extra ``PATH`` folders (Qwen Code's Node.js 22).
    path: Callable[[], list[Path]] = lambda: []
    #: The text parts the placeholder may land in (``text``).
    #: Whether a model call is the agent's own turn (not a side call: a router, a title, a summary).
    main: Callable[[Seen], bool] = lambda call: True
    #: Whether the agent survives a refused image on its own (Claude Code 2.1.3xx and Qwen Code
    #: drop it and send the call again): then the proxy must not break that rescue, and records
    #: the refusal.
    self_rescues: bool = False
    #: Whether the agent's next turn extends its first as the proxy derives sessions (Qwen Code's
    #: second turn drops a ``<system-reminder>`` part from the first user message: the derived
    #: session leaves such parts out, so it holds).
    keeps_session: bool = True
    #: Whether the agent can send an image headless at all.
    images: bool = True
    #: Whether the agent sends calls side by side, which may meet one refusal at once.
    side_by_side: bool = False
    #: Whether the agent sends the image re-encoded (other bytes than the file's).
    reencodes: bool = False
    #: ``script(scripted, shot)``: what the scripted upstream answers this agent with (a tool call).
    script: Callable[[ScriptedUpstream, Shot], None] = lambda scripted, shot: None


def _gemini_settings(home: Path, url: str) -> None:
    folder = home / ".gemini"
    folder.mkdir(parents=True, exist_ok=True)
    # an API key (the key's auth method must be chosen up front headless), nothing that phones home
    (folder / "settings.json").write_text(json.dumps({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }))


GEMINI: Final = Agent(
    "gemini-cli",
    # ``@shot.png`` in the prompt: the CLI reads the file and inlines it (``inlineData``)
    lambda prompt, first: [str(agents.agent(agents.GEMINI_CLI)), *(() if first else ("--resume", "latest")),
                           "-p", f"{prompt} @shot.png" if first else prompt],
    lambda url: {"GOOGLE_GEMINI_BASE_URL": url, "GEMINI_API_KEY": "dummy-gemini-key",
                 "GEMINI_CLI_TRUST_WORKSPACE": "true"},
    _gemini_settings,
    main=lambda call: call.path.endswith(":streamGenerateContent"),
)

def _read_the_shot(scripted: ScriptedUpstream, shot: Shot) -> None:
    scripted.read_file = str(shot.path)  # the first agent turn is answered with a Read of it


CLAUDE_CODE: Final = Agent(
    f"claude-code-{agents.CURRENT_CLAUDE_CODE}",
    # the scripted upstream has it Read the file: the image comes back inlined in the tool_result
    lambda prompt, first: [str(agents.claude_code(agents.CURRENT_CLAUDE_CODE)), "-p", *(() if first else ("-c",)),
                           f"{prompt} shot.png" if first else prompt, "--allowedTools", "Read"],
    lambda url: {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-ant-dummy"},
    main=lambda call: bool((call.body or {}).get("tools")),
    self_rescues=True,
    script=_read_the_shot,
)

QWEN_CODE: Final = Agent(
    "qwen-code",
    # ``@shot.png`` in the prompt: the CLI inlines the image (re-encoded) as an ``image_url`` part
    lambda prompt, first: [str(agents.agent(agents.QWEN_CODE)), *(() if first else ("--continue",)),
                           "-p", f"{prompt} @shot.png" if first else prompt],
    lambda url: {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "sk-dummy", "OPENAI_MODEL": "gpt-4o"},
    path=lambda: [agents.node22_bin()],
    reencodes=True,
    self_rescues=True,  # 0.24.4 sends a refused call again with the image's part as text
    main=lambda call: str(((call.body or {}).get("messages") or [{}])[0].get("content")).startswith("You are Qwen Code"),
)

def _pi_models(home: Path, url: str) -> None:
    folder = home / ".pi" / "agent"
    folder.mkdir(parents=True, exist_ok=True)
    # a provider of its own (pi's models.json): Chat Completions at the proxy, a model that takes images
    (folder / "models.json").write_text(json.dumps({"providers": {"proxy": {
        "baseUrl": f"{url}/v1", "api": "openai-completions", "apiKey": "sk-dummy",
        "models": [{"id": "gpt-4o", "input": ["text", "image"]}]}}}))


PI: Final = Agent(
    "pi",
    # ``@shot.png`` on the command line: pi inlines it as an ``image_url`` part
    lambda prompt, first: [str(agents.agent(agents.PI)), "-p", *(() if first else ("-c",)), "--provider", "proxy",
                           "--model", "gpt-4o", *(("@shot.png",) if first else ()), prompt],
    lambda url: {},
    _pi_models,
)

def _opencode_config(home: Path, url: str) -> None:
    folder = home / ".config" / "opencode"
    folder.mkdir(parents=True, exist_ok=True)
    # a provider of its own, OpenAI-compatible at the proxy, a model that takes attachments
    model = {"name": "gpt-4o", "attachment": True, "modalities": {"input": ["text", "image"], "output": ["text"]}}
    (folder / "opencode.json").write_text(json.dumps({
        "provider": {"proxy": {"npm": "@ai-sdk/openai-compatible", "name": "proxy",
                               "options": {"baseURL": f"{url}/v1", "apiKey": "sk-dummy"},
                               "models": {"gpt-4o": model}}},
        "autoupdate": False, "share": "disabled"}))


OPENCODE: Final = Agent(
    "opencode",
    # ``-f shot.png``: the file attached to the message, inlined as an ``image_url`` part
    lambda prompt, first: [str(agents.agent(agents.OPENCODE)), "run", *(() if first else ("-c",)),
                           "-m", "proxy/gpt-4o", prompt, *(("-f", "shot.png") if first else ())],
    lambda url: {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"},
    _opencode_config,
    main=lambda call: bool((call.body or {}).get("tools")),  # the other one names the session
    side_by_side=True,
)

def _cline_auth(home: Path, url: str) -> None:
    # its own command writes the provider: OpenAI-compatible at the proxy
    done = subprocess.run([str(agents.agent(agents.CLINE)), "auth", "-p", "openai", "-k", "sk-dummy", "-m", "gpt-4o",
                           "-b", f"{url}/v1"], env={**agents.quiet_env(home), "HOME": str(home)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


CLINE: Final = Agent(
    "cline",
    # headless it cannot attach an image: an ``@shot.png`` mention reads "Cannot read binary file
    # into context", so only its plain turn is tried
    lambda prompt, first: [str(agents.agent(agents.CLINE)), f"{prompt} @shot.png"],
    lambda url: {},
    _cline_auth,
    images=False,
)

AGENTS: Final = {a.name: a for a in (GEMINI, CLAUDE_CODE, QWEN_CODE, PI, OPENCODE, CLINE)}
#: The agents that send an image headless: the refusal tests.
IMAGING: Final = [name for name, agent in AGENTS.items() if agent.images]


MakeProxy = Callable[[], Awaitable[Harness]]


@pytest.fixture
def make_proxy(aiohttp_client: Any, make_config: Callable[..., Config], scripted: ScriptedUpstream,
               unused_tcp_port: int) -> MakeProxy:
    """A live proxy on its own port, recording every call's metadata, every format's upstream at
    the scripted one."""
    async def make() -> Harness:
        public = f"http://127.0.0.1:{unused_tcp_port}"
        config = make_config(**{"server.public_url": public, "record.mode": "metadata",
                                **{f"upstreams.{name}": {"format": name, "url": scripted.url}
                                   for name in ("anthropic", "openai", "gemini")}})
        store = CountingStore(open_store(config))
        client = await routed_client(aiohttp_client, create_app(config, store=store, log=open_log(config)),
                                     server_kwargs={"host": "127.0.0.1", "port": unused_tcp_port})
        return Harness(client, store, None)  # type: ignore[arg-type]  # the upstream is `scripted`
    return make


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


async def run(agent: Agent, url: str, shot: Shot, scripted: ScriptedUpstream, *,
              first: bool = True) -> tuple[int, str, str]:
    """One headless turn of ``agent`` in its own network namespace, where ``url`` (the proxy's
    or the scripted upstream's) is the only address that answers."""
    shot.home.mkdir(parents=True, exist_ok=True)
    agent.setup(shot.home, url)
    agent.script(scripted, shot)
    bridge = await netns.Bridge(shot.home.parent / f"bridge-{port_of(url)}.sock", port_of(url)).start()
    try:
        env = {"HOME": str(shot.home), **agent.env(url)}
        extra = agent.path()
        if extra:
            env["PATH"] = ":".join([*map(str, extra), agents.quiet_env(shot.home)["PATH"]])
        argv = netns.isolated(agent.argv(PROMPT if first else NEXT_PROMPT, first), [bridge])
        return await agents.run_agent(argv, env, shot.cwd, timeout=240)
    finally:
        agents.reap(str(shot.cwd))  # what the agent left running (Cline's hub daemon), and its namespace with it
        await bridge.stop()


def model_calls(scripted: ScriptedUpstream, start: int = 0) -> list[Seen]:
    return [s for s in scripted.received[start:] if s.method == "POST" and is_model_call(s.path)]


def refused_routes(live: Harness) -> list[tuple[str, str, str]]:
    """What the proxy answered the agent with a 4xx or 5xx of its own, by (route, status, upstream)."""
    return [key for key, n in live.app[SERVICES].metrics.requests.items()
            if n and key[1][:1] in ("4", "5") and not key[0].startswith("admin")]


def shape(call: Seen) -> tuple[Any, ...]:
    """What tells one logical call from another: its path, its messages' count and roles, its tools."""
    body = call.body if isinstance(call.body, dict) else {}
    turns = body.get("messages") or body.get("contents") or []
    return (call.path, tuple(t.get("role") for t in turns if isinstance(t, dict)),
            json.dumps(body.get("tools"), sort_keys=True), json.dumps(body.get("system"))[:200])


def shows_placeholder(call: Seen, image: str) -> bool:
    """Whether the rejection placeholder of ``image`` is anywhere in ``call``'s body."""
    return placeholder(image).search(json.dumps(call.body)) is not None


def part_of(place: tuple[str, ...]) -> tuple[str, ...]:
    """The content part an image value sits in, in every format: ``.../parts/2/inlineData/data``
    -> ``.../parts/2`` (Gemini), and as ``block_of`` says for the others."""
    for key in ("inlineData", "inline_data"):
        if key in place:
            return place[:place.index(key)]
    return block_of(place)


def has_placeholder(call: Seen, place: tuple[str, ...], image_id: str, agent: Agent) -> bool:
    """Whether ``call`` holds the rejection placeholder of ``image_id`` where the image was."""
    try:
        part = at(call.body, part_of(place))
    except (KeyError, IndexError, TypeError, ValueError):
        return False
    return isinstance(part, dict) and placeholder(image_id).fullmatch(str(part.get("text"))) is not None


@pytest.mark.parametrize("name", list(AGENTS))
async def test_a_plain_turn_through_the_proxy(name: str, scripted: ScriptedUpstream, make_proxy: MakeProxy,
                                              tmp_path: Path) -> None:
    """Only a base URL: the turn ends with the scripted answer, every call the agent made was
    answered 2xx (model lists, token counts, side calls), a model call streamed, and the
    screenshot went upstream as the agent sent it."""
    agent = AGENTS[name]
    live = await make_proxy()
    shot = Shot(tmp_path)
    rc, out, err = await run(agent, str(live.client.make_url("")).rstrip("/"), shot, scripted)
    assert rc == 0 and ANSWER in out, outcome(rc, out, err)
    assert scripted.received, "nothing reached the upstream"
    assert [(s.path_qs, s.status) for s in scripted.received if not 200 <= s.status < 300] == []
    assert refused_routes(live) == []  # nor did the proxy refuse a route it answers itself
    calls = model_calls(scripted)
    assert any(c.path_qs.endswith("alt=sse") or (c.body or {}).get("stream") for c in calls), \
        "no model call streamed"
    assert rejections(await all_events(live)) == []
    if agent.images:
        image = sent(calls)
        assert image == shot.id or agent.reencodes, "the screenshot was not sent as it is"
    else:
        assert not any(c.images for c in calls)


@pytest.mark.parametrize("name", IMAGING)
async def test_control_the_refusal_without_the_proxy(name: str, scripted: ScriptedUpstream, tmp_path: Path) -> None:
    """Straight at the scripted upstream the refusal fails the run as users report it (the harness
    can fail); an agent that rescues itself (Claude Code 2.1.3xx, Qwen Code) finishes, after its own refused
    call, by sending the turn again without the image."""
    agent = AGENTS[name]
    shot = Shot(tmp_path)
    scripted.refuse_any = False
    rc, out, err = await run(agent, scripted.url, shot, scripted)
    assert scripted.refusals >= 1
    if not agent.self_rescues:
        assert rc != 0 and ANSWER not in out, outcome(rc, out, err)
        return
    assert rc == 0 and ANSWER in out, outcome(rc, out, err)
    calls = model_calls(scripted)
    last = max(i for i, c in enumerate(calls) if c.status == 400)
    assert any(c.status == 200 and not c.images for c in calls[last + 1:])


def sent(calls: list[Seen]) -> str:
    """The id of the one image the agent sent: the screenshot's bytes, or what the agent made of
    them (Qwen Code re-encodes an image before it sends it)."""
    found = {image for c in calls for _, image in c.images}
    assert len(found) == 1, f"the agent sent {len(found)} different images"
    return found.pop()


def rescued(calls: list[Seen], image: str, agent: Agent) -> list[Seen]:
    """Each call of ``calls`` that the upstream refused for ``image``, checked to have gone again
    at once with the rejection placeholder in the image's place."""
    refused = [(i, path) for i, c in enumerate(calls) for path, found in c.images
               if found == image and c.status == 400]
    for i, place in refused:  # its re-send: the next call of its shape (agents send calls side by side)
        again = next((c for c in calls[i + 1:] if shape(c) == shape(calls[i])), None)
        assert again is not None, f"the refused call to {calls[i].path} was not sent again"
        assert again.status == 200 and has_placeholder(again, place, image, agent), at(again.body, part_of(place)[:2])
    return [calls[i] for i, _ in refused]


def one_each(events: dict[str, list[dict[str, Any]]], image: str) -> set[str]:
    """The sessions holding a rejection of ``image``, each exactly one."""
    found = rejections(events)
    assert {data["attachment_id"] for _, data in found} <= {image}
    sessions = [sid for sid, _ in found]
    assert len(set(sessions)) == len(sessions), found
    return set(sessions)


async def rescued_first_turn(agent: Agent, live: Harness, scripted: ScriptedUpstream, shot: Shot,
                             named: bool) -> tuple[str, set[str], int]:
    """A first turn through the proxy whose image the upstream refuses (``named``: the error names
    its place), checked rescued: (the image's id as sent, the sessions that met it, refused calls)."""
    scripted.refuse_any = named
    rc, out, err = await run(agent, str(live.client.make_url("")).rstrip("/"), shot, scripted)
    assert rc == 0 and ANSWER in out, outcome(rc, out, err)
    calls = model_calls(scripted)
    image = sent(calls)
    refused = rescued(calls, image, agent)
    assert refused and scripted.refusals == len(refused), outcome(rc, out, err)
    # the agent's own call got the placeholder: once refused and sent again, or before it was sent
    # at all when a side call of the same session was refused first (OpenCode's title)
    assert all(c.status == 400 for c in calls if agent.main(c) and carrying([c], image))
    assert any(agent.main(c) and c.status == 200 and shows_placeholder(c, image) for c in calls), \
        "the agent's own call never went with the placeholder"
    met = one_each(await all_events(live), image)
    # one refused call in the whole turn, side calls with prompts of their own included: the refusal
    # holds for the tenant's every session (``call.refusals``), each of which records its own event;
    # calls sent side by side (OpenCode's title and turn) may both meet the refusal, one event still
    assert len(refused) == 1 or agent.side_by_side and len(refused) == 2, [c.path_qs for c in refused]
    assert met
    return image, met, len(refused)


@pytest.mark.parametrize("named", [False, True], ids=["plain", "named"])
@pytest.mark.parametrize("name", IMAGING)
async def test_the_proxy_rescues_a_refused_image(name: str, named: bool, scripted: ScriptedUpstream,
                                                 make_proxy: MakeProxy, tmp_path: Path) -> None:
    """The run exits 0 with the scripted answer; the call refused for the image went again at once
    with the placeholder in its place (before an agent that rescues itself sees the refusal); it
    is the only refused call of the turn, side calls made with a prompt of their own (Gemini
    CLI's model router, Qwen Code's memory subagent: sessions of their own to the proxy)
    included, as the refusal holds for every session of the tenant; and each session that met the
    image holds one rejection."""
    await rescued_first_turn(AGENTS[name], await make_proxy(), scripted, Shot(tmp_path), named)


@pytest.mark.parametrize("name", [name for name in IMAGING if AGENTS[name].keeps_session])
async def test_the_next_turn_never_sends_the_refused_image(name: str, scripted: ScriptedUpstream,
                                                           make_proxy: MakeProxy, tmp_path: Path) -> None:
    """On the next two turns of the same conversation the agent re-sends its history with the
    image: each turn's own model call goes upstream once (no refused round trip), no call of
    either turn carries the image, side calls included, and nothing is refused. The turns stay in
    the first turn's session (Qwen Code drops its date reminder on turn 2: the derived session
    leaves it out), which holds its one rejection."""
    agent = AGENTS[name]
    live = await make_proxy()
    shot = Shot(tmp_path)
    image, met, refused = await rescued_first_turn(agent, live, scripted, shot, False)
    for _ in range(2):
        start = len(scripted.received)
        with capture_logs() as logs:
            rc, out, err = await run(agent, str(live.client.make_url("")).rstrip("/"), shot, scripted, first=False)
        assert rc == 0 and ANSWER in out, outcome(rc, out, err)
        turn = model_calls(scripted, start)
        main = [c for c in turn if agent.main(c)]
        assert len(main) == 1, f"the turn made {len(main)} model calls of its own: {[c.path_qs for c in turn]}"
        assert carrying(main, image) == [], "the image reached the provider again in the conversation"
        assert carrying(turn, image) == [] and scripted.refusals == refused, "a side call sent the image again"
        assert [(s.path_qs, s.status) for s in scripted.received[start:] if not 200 <= s.status < 400] == []
        later = one_each(await all_events(live), image)
        assert met <= later  # a side call's new session got its own event, from the tenant's refusal
        # the turn's own call is in a session that met the image on the first turn (a side call
        # with a prompt of its own may open one more)
        turn_sessions = {line["session"] for line in logs if line.get("event") == "request"
                         and is_model_call(str(line.get("path", "")).split("?")[0]) and "session" in line}
        assert turn_sessions & met, f"the turn left the conversation's sessions {met} for {turn_sessions}"


async def test_qwen_codes_compaction_keeps_the_conversations_session(scripted: ScriptedUpstream,
                                                                      make_proxy: MakeProxy, tmp_path: Path) -> None:
    """Qwen Code compacting the conversation (its auto-compaction forced by a tiny threshold, the
    scripted upstream reporting a long prompt): the call after it opens with the summary and
    attaches the screenshot anew, and it is still the first turn's session to the proxy
    (``session_source=continued``: the conversations index), so the image goes as its
    placeholder, with no refused call, in every call of the compacted turn."""
    agent = QWEN_CODE
    live = await make_proxy()
    shot = Shot(tmp_path)
    url = str(live.client.make_url("")).rstrip("/")
    image, met, refused = await rescued_first_turn(agent, live, scripted, shot, False)
    settings = shot.home / ".qwen" / "settings.json"
    current = json.loads(settings.read_text()) if settings.exists() else {}
    settings.write_text(json.dumps({**current, "context": {"autoCompactThreshold": 0.0001}}))
    scripted.answer = f"<state_snapshot>the user asked about shot.png</state_snapshot> {ANSWER}"
    scripted.prompt_tokens = 20000  # the summary saves tokens: Qwen Code keeps it
    compacted: list[Seen] = []
    turn_sessions: set[str] = set()
    sources: set[str] = set()
    for _ in range(2):  # the compaction runs after a turn: the next turn sends the compacted history
        start = len(scripted.received)
        with capture_logs() as logs:
            rc, out, err = await run(agent, url, shot, scripted, first=False)
        assert rc == 0 and ANSWER in out, outcome(rc, out, err)
        turn = model_calls(scripted, start)
        assert carrying(turn, image) == [] and scripted.refusals == refused, "the image reached the provider again"
        compacted += [c for c in turn if agent.main(c) and "<state_snapshot>" in json.dumps(c.body["messages"][1])]
        lines = [line for line in logs if line.get("event") == "request" and line.get("session")
                 and is_model_call(str(line.get("path", "")).split("?")[0])]
        turn_sessions |= {line["session"] for line in lines}
        sources |= {line.get("session_source") for line in lines}
    assert compacted, "Qwen Code never sent a compacted conversation"
    assert any(shows_placeholder(c, image) for c in compacted), "the compacted call lost the screenshot's place"
    assert "continued" in sources
    assert turn_sessions <= met, f"the compacted turn left the conversation's sessions {met} for {turn_sessions}"
