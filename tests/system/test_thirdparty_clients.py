"""The third-party clients people point at a base URL, unmodified, each run as its users run it (a
subprocess of ``.venv-clients``, configured from the environment, the session in the base URL)
against a live proxy on loopback whose ``public_url`` is its real address: ``llm`` (CLI),
LiteLLM as a client (``openai/``, ``anthropic/``, ``gemini/`` routes), ``langchain-openai``,
``instructor`` and ``openai-agents``. Each test checks what reached the fake upstream (the admitted
bytes inlined, the placeholder for an image that vanished) and the session's log (its records, one
quarantine). The versions and the README's client table: ``tests/thirdparty.py``."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from projectionist.proxy.config import Config, load_config
from projectionist.policy.model import scoped_session
from projectionist.proxy.edge.app import create_app, open_log, open_store
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import Harness, routed_client
from tests.fakes import COMPLETION, CountingStore, FakeUpstream
from tests.imaging import make_image
from tests.thirdparty import clients_python, run_client

# The first of these tests builds .venv-clients when .ci/run has not (pip, from PyPI): minutes on a
# slow network, beyond the suite's 300 s per test.
pytestmark = pytest.mark.timeout(1800)


MakeLive = Callable[..., Awaitable[Harness]]


@pytest.fixture
def make_live(aiohttp_client: Any, make_config: Callable[..., Config], upstream: FakeUpstream,
              unused_tcp_port: int) -> MakeLive:
    """A proxy listening on a port chosen first, so that its ``public_url`` (where ``href``s point)
    is its real address; it records every call's metadata; ``gemini`` is the fake upstream too."""
    async def make(**overrides: Any) -> Harness:
        public = f"http://127.0.0.1:{unused_tcp_port}"
        config = make_config(**{"server.public_url": public, "record.mode": "metadata",
                                "upstreams.gemini": {"format": "gemini", "url": upstream.url}, **overrides})
        store = CountingStore(open_store(config))
        client = await routed_client(aiohttp_client, create_app(config, store=store, log=open_log(config)),
                                     server_kwargs={"host": "127.0.0.1", "port": unused_tcp_port})
        assert str(client.make_url("")).rstrip("/") == public
        return Harness(client, store, upstream)
    return make


@pytest.fixture
async def live(make_live: MakeLive) -> Harness:
    return await make_live()


class Image:
    """An uploaded image: the upload answer (``id``, ``url``, ``href``) and its bytes."""

    def __init__(self, data: bytes, answer: dict[str, Any]) -> None:
        self.data = data
        self.id: str = answer["id"]
        self.url: str = answer["url"]
        self.href: str = answer["href"]

    @property
    def b64(self) -> str:
        return base64.b64encode(self.data).decode()

    def placeholder(self, name: str) -> str:
        return f'[image unavailable: not_found; "{name}" ({self.id[:15]})]'


async def upload(live: Harness, color: int, name: str, token: str | None = None) -> Image:
    data = make_image(color=color)
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    resp = await live.client.post("/v1/attachments", data=data, params={"name": name},
                                  headers={"Content-Type": "image/png", **auth})
    assert resp.status == 200, await resp.text()
    image = Image(data, await resp.json())
    assert image.href.startswith(str(live.client.make_url("/v1/attachments/sha256:")))
    return image


async def vanished(live: Harness, color: int, name: str) -> Image:
    """An image that was admitted, whose object then disappeared from the store."""
    image = await upload(live, color, name)
    await live.remove(image.id)
    return image


def url(live: Harness, path: str) -> str:
    return str(live.client.make_url(path))


def openai_env(live: Harness, session: str) -> dict[str, str]:
    return {"OPENAI_BASE_URL": url(live, f"/s/{session}/v1"), "OPENAI_API_KEY": "sk-from-env"}


async def records(live: Harness, session: str) -> list[dict[str, Any]]:
    """The session's ``request/recorded`` events (written off the request path: drained first)."""
    await live.app[SERVICES].recording.drain()
    return [e["data"] for e in await live.events(session) if e["type"] == "request/recorded"]


def refs(record: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["attachment_id"], r["outcome"]) for r in record.get("refs", [])]


async def quarantined(live: Harness, session: str) -> list[str]:
    return [e["data"]["attachment_id"] for e in await live.events(session) if e["type"] == "attachment/quarantine"]


def result(out: str) -> Any:
    """A client script's last line, ``RESULT <json>`` (libraries may print their own lines before)."""
    last = out.strip().splitlines()[-1]
    assert last.startswith("RESULT "), out[-2000:]
    return json.loads(last.removeprefix("RESULT "))


def chat_parts(live: Harness) -> list[dict[str, Any]]:
    sent = live.upstream.last
    assert sent.path_qs == "/v1/chat/completions"
    parts: list[dict[str, Any]] = sent.json()["messages"][0]["content"]
    return parts


def image_url(image: Image) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image.b64}}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


async def test_llm_cli_sends_the_href_and_its_next_turn_gets_the_placeholder(live: Harness, tmp_path: Path) -> None:
    """``llm -a URL`` HEADs the URL for its type (a vanished image fails there, in llm) and passes
    it on as an ``image_url``; ``--at URL TYPE`` skips the HEAD. ``llm -c`` re-sends the whole
    conversation from its own database, so an image that vanished between turns is found by the
    proxy, quarantined, and replaced."""
    shot, later = await upload(live, 1, "shot.png"), await upload(live, 2, "later.png")
    python, env = clients_python(), openai_env(live, "llm")
    first = await run_client(python, "", env, home=tmp_path,
                             args=("llm", "-m", "gpt-4o", "describe", "-a", shot.href, "--at", later.href, "image/png"))
    assert first.strip() == "tok1 tok2 tok3 tok4"  # llm streams by default
    assert chat_parts(live) == [text("describe"), image_url(shot), image_url(later)]
    assert live.upstream.last.json()["stream"] is True
    await live.remove(later.id)
    with pytest.raises(AssertionError, match="404 Not Found"):  # a new -a of it fails at llm's own HEAD
        await run_client(python, "", env, home=tmp_path, args=("llm", "-m", "gpt-4o", "again", "-a", later.href))
    assert len(live.upstream.received) == 1
    second = await run_client(python, "", env, home=tmp_path, args=("llm", "-c", "and now?", "--no-stream"))
    assert second.strip() == "Hello from the fake upstream."
    assert chat_parts(live) == [text("describe"), image_url(shot), text(later.placeholder("later.png"))]
    assert [m["content"] for m in live.upstream.last.json()["messages"][1:]] == ["tok1 tok2 tok3 tok4 ", "and now?"]
    calls = await records(live, "llm")
    assert [refs(c) for c in calls] == [[(shot.id, "inlined"), (later.id, "inlined")],
                                        [(shot.id, "inlined"), (later.id, "placeholder")]]
    assert await quarantined(live, "llm") == [later.id]


async def test_llm_behind_client_tokens_takes_the_href_with_its_type_given(
    make_live: MakeLive, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With client tokens, ``llm``'s key is the client token and the proxy holds the provider key.
    ``-a URL`` fails at llm's own HEAD, which carries no credential; ``--at URL image/png`` sends
    no HEAD and works."""
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "ct-llm")
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-held-by-the-proxy")
    live = await make_live(**{"upstreams.openai": {"format": "openai", "url": upstream.url,
                                                   "api_key_env": "TEST_OPENAI_KEY"}})
    shot = await upload(live, 14, "shot.png", token="ct-llm")
    python, env = clients_python(), {**openai_env(live, "llm-guarded"), "OPENAI_API_KEY": "ct-llm"}
    with pytest.raises(AssertionError, match="401 Unauthorized"):
        await run_client(python, "", env, home=tmp_path, args=("llm", "-m", "gpt-4o", "describe", "-a", shot.href))
    assert live.upstream.received == []
    answer = await run_client(python, "", env, home=tmp_path,
                              args=("llm", "-m", "gpt-4o", "describe", "--at", shot.href, "image/png", "--no-stream"))
    assert answer.strip() == "Hello from the fake upstream."
    assert chat_parts(live) == [text("describe"), image_url(shot)]
    assert live.upstream.last.headers["Authorization"] == "Bearer sk-held-by-the-proxy"
    # behind client tokens the session is its tenant's: the token is a tenant of its own
    tenant = load_config(None).tenants({"PROJECTIONIST_CLIENT_TOKENS": "ct-llm"})["ct-llm"]
    [call] = await records(live, scoped_session(tenant, "llm-guarded"))
    assert refs(call) == [(shot.id, "inlined")]


LITELLM = """
import json, os, litellm
from urllib.parse import urlsplit
litellm.user_url_allowed_hosts = [urlsplit(os.environ["HREF"]).netloc]  # lets it download from loopback
results = {}
def ask(label, model, *urls):
    content = [{"type": "text", "text": "describe"}] + [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    try:
        answer = litellm.completion(model=model, max_tokens=20, messages=[{"role": "user", "content": content}])
        results[label] = "ok: " + answer.choices[0].message.content
    except Exception as error:
        results[label] = "error: " + type(error).__name__
ask("openai", "openai/gpt-4o", os.environ["URL"], os.environ["HREF"], os.environ["GONE"])
ask("anthropic url", "anthropic/claude-sonnet-4-5", os.environ["URL"])
ask("anthropic href", "anthropic/claude-sonnet-4-5", os.environ["HREF"])
ask("anthropic gone", "anthropic/claude-sonnet-4-5", os.environ["GONE"])
ask("gemini url", "gemini/gemini-2.5-flash", os.environ["URL"])
ask("gemini href", "gemini/gemini-2.5-flash", os.environ["HREF"])
ask("gemini gone", "gemini/gemini-2.5-flash", os.environ["GONE"])
print("RESULT " + json.dumps(results))
"""


async def test_litellm_passes_references_on_its_openai_route_and_downloads_hrefs_on_the_others(
    live: Harness, tmp_path: Path
) -> None:
    """LiteLLM's ``openai/`` route passes image URLs through, so the proxy projects both forms. Its
    ``anthropic/`` and ``gemini/`` routes accept only ``data:`` or http(s) URLs, which they download
    themselves (allowed hosts permitting) and send inline: the proxy sees an inline image."""
    shot, other, gone = await upload(live, 3, "shot.png"), await upload(live, 4, "other.png"), \
        await vanished(live, 5, "gone.png")
    env = {**openai_env(live, "litellm-openai"),
           "ANTHROPIC_BASE_URL": url(live, "/s/litellm-anthropic"), "ANTHROPIC_API_KEY": "sk-ant-from-env",
           "GEMINI_API_BASE": url(live, "/s/litellm-gemini/v1beta"), "GEMINI_API_KEY": "g-from-env",
           "URL": shot.url, "HREF": other.href, "GONE": gone.href}
    answers = result(await run_client(clients_python(), LITELLM, env, home=tmp_path))
    assert answers == {
        "openai": "ok: Hello from the fake upstream.",
        "anthropic url": "error: BadRequestError",      # "Image url not in expected format", never sent
        "anthropic href": "ok: Hello from the fake upstream.",
        "anthropic gone": "error: BadRequestError",     # its own download got the proxy's 404
        "gemini url": "error: APIConnectionError",      # "Invalid image received", never sent
        "gemini href": "ok: Hello from the fake Gemini upstream.",
        "gemini gone": "error: ImageFetchError",        # its own download got the proxy's 404
    }
    by_path = {r.path_qs: r.json() for r in live.upstream.received}
    assert len(live.upstream.received) == len(by_path) == 3
    assert by_path["/v1/chat/completions"]["messages"][0]["content"] == [
        text("describe"), image_url(shot), image_url(other), text(gone.placeholder("gone.png"))]
    [call] = await records(live, "litellm-openai")
    assert refs(call) == [(shot.id, "inlined"), (other.id, "inlined"), (gone.id, "placeholder")]
    assert await quarantined(live, "litellm-openai") == [gone.id]

    assert by_path["/v1/messages"]["messages"][0]["content"][1] == {
        "type": "image", "source": {"type": "base64", "media_type": "image/png", "data": other.b64}}
    gemini = by_path["/v1beta/models/gemini-2.5-flash:generateContent"]
    assert gemini["contents"][0]["parts"][1] == {"inline_data": {"data": other.b64, "mime_type": "image/png"}}
    for session in ("litellm-anthropic", "litellm-gemini"):  # recorded in its session: the client's own image
        [call] = await records(live, session)
        assert refs(call) == [(other.id, "client")]
        assert await quarantined(live, session) == []


LANGCHAIN = """
import json, os
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
content = [{"type": "text", "text": "describe"}]
content += [{"type": "image_url", "image_url": {"url": os.environ[k]}} for k in ("URL", "HREF", "GONE")]
answer = ChatOpenAI(model="gpt-4o").invoke([HumanMessage(content=content)])
print("RESULT " + json.dumps(answer.content))
"""


async def test_langchain_openai_passes_both_forms_through(live: Harness, tmp_path: Path) -> None:
    shot, other, gone = await upload(live, 6, "shot.png"), await upload(live, 7, "other.png"), \
        await vanished(live, 8, "gone.png")
    env = {**openai_env(live, "langchain"), "URL": shot.url, "HREF": other.href, "GONE": gone.href}
    assert result(await run_client(clients_python(), LANGCHAIN, env, home=tmp_path)) == "Hello from the fake upstream."
    assert chat_parts(live) == [text("describe"), image_url(shot), image_url(other), text(gone.placeholder("gone.png"))]
    assert live.upstream.last.headers["Authorization"] == "Bearer sk-from-env"
    [call] = await records(live, "langchain")
    assert refs(call) == [(shot.id, "inlined"), (other.id, "inlined"), (gone.id, "placeholder")]
    assert await quarantined(live, "langchain") == [gone.id]


INSTRUCTOR = """
import json, os, instructor, openai
from pydantic import BaseModel
class Seen(BaseModel):
    images: list[str]
    texts: list[str]
try:
    instructor.Image.from_url(os.environ["URL"])
    refused = None
except Exception as error:
    refused = type(error).__name__
client = instructor.from_openai(openai.OpenAI())
seen = client.chat.completions.create(model="gpt-4o", response_model=Seen, messages=[{"role": "user", "content": [
    "describe", instructor.Image.from_url(os.environ["HREF"]), instructor.Image.from_url(os.environ["GONE"])]}])
print("RESULT " + json.dumps({"seen": seen.model_dump(), "attachment_url": refused}))
"""


async def report_what_the_model_saw(request: web.Request, body: Any) -> web.StreamResponse | None:
    """A model answering instructor's forced tool call with what reached it: the base64 of each
    inline image and each text part of the first message."""
    if request.path != "/v1/chat/completions" or not isinstance(body, dict) or not body.get("tools"):
        return None
    parts = body["messages"][0]["content"]
    seen = {"images": [p["image_url"]["url"].partition("base64,")[2] for p in parts if p["type"] == "image_url"],
            "texts": [p["text"] for p in parts if p["type"] == "text"]}
    call = {"id": "call_fake", "type": "function",
            "function": {"name": body["tools"][0]["function"]["name"], "arguments": json.dumps(seen)}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return web.json_response({**COMPLETION, "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})


async def test_instructor_takes_the_href_without_fetching_it(live: Harness, tmp_path: Path) -> None:
    """``Image.from_url`` refuses ``attachment:`` (not http) and refuses to fetch from loopback, but
    the ``href`` ends in ``.png`` and is taken as it is: the proxy projects it. The structured answer
    the user gets is what the model saw."""
    live.upstream.script = report_what_the_model_saw
    shot, gone = await upload(live, 9, "shot.png"), await vanished(live, 10, "gone.png")
    env = {**openai_env(live, "instructor"), "URL": shot.url, "HREF": shot.href, "GONE": gone.href}
    answer = result(await run_client(clients_python(), INSTRUCTOR, env, home=tmp_path))
    assert answer == {"seen": {"images": [shot.b64], "texts": ["describe", gone.placeholder("gone.png")]},
                      "attachment_url": "RemoteFetchError"}
    assert live.upstream.calls == 1
    assert chat_parts(live) == [text("describe"), image_url(shot), text(gone.placeholder("gone.png"))]
    [call] = await records(live, "instructor")
    assert refs(call) == [(shot.id, "inlined"), (gone.id, "placeholder")]
    assert await quarantined(live, "instructor") == [gone.id]


AGENTS = """
import json, os
from agents import Agent, Runner
agent = Agent(name="viewer", instructions="Describe the images.", model="gpt-4o")
images = [{"type": "input_image", "image_url": os.environ[k], "detail": "auto"} for k in ("URL", "HREF", "GONE")]
run = Runner.run_sync(agent, [{"role": "user", "content": [{"type": "input_text", "text": "describe"}, *images]}])
print("RESULT " + json.dumps(run.final_output))
"""


async def test_openai_agents_sends_both_forms_on_the_responses_api(live: Harness, tmp_path: Path) -> None:
    shot, other, gone = await upload(live, 11, "shot.png"), await upload(live, 12, "other.png"), \
        await vanished(live, 13, "gone.png")
    env = {**openai_env(live, "agents"), "URL": shot.url, "HREF": other.href, "GONE": gone.href}
    assert result(await run_client(clients_python(), AGENTS, env, home=tmp_path)) == "Hello from the fake upstream."
    sent = live.upstream.last
    assert sent.path_qs == "/v1/responses" and sent.json()["instructions"] == "Describe the images."
    inline = [{"type": "input_image", "detail": "auto", "image_url": "data:image/png;base64," + i.b64}
              for i in (shot, other)]
    assert sent.json()["input"][0]["content"] == [
        {"type": "input_text", "text": "describe"}, *inline,
        {"type": "input_text", "text": gone.placeholder("gone.png")}]
    [call] = await records(live, "agents")
    assert call["route"] == "openai_responses"
    assert refs(call) == [(shot.id, "inlined"), (other.id, "inlined"), (gone.id, "placeholder")]
    assert await quarantined(live, "agents") == [gone.id]
