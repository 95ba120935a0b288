"""Routing: which upstream a request reaches (the rule in ``proxy.routing``), named upstreams under
``/u/{name}/``, unknown names, and the ``--upstream NAME=[FORMAT:]URL`` declarations."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import openai
import pytest
from aiohttp import web
from yarl import URL

from projectionist.policy.errors import InvalidRequest
from projectionist.proxy.config import Config, UpstreamConfig, load_config, parse_upstream_spec, with_upstreams
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness
from tests.fakes import COMPLETION, MESSAGE
from tests.imaging import make_image, ref_id


MakeHarness = Callable[..., Awaitable[Harness]]
SID = "route-1"
MODELS = {"object": "list", "data": [{"id": "deepseek-chat", "object": "model", "created": 0, "owned_by": "deepseek"}]}


@dataclass
class Hit:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


@dataclass
class Recorder:
    """A tiny upstream that records what reached it and says who it is."""

    name: str
    hits: list[Hit] = field(default_factory=list)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.answer)
        return app

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.hits.append(Hit(request.method, request.path_qs, {k.lower(): v for k, v in request.headers.items()}, body))
        path = request.path
        if request.method == "POST" and path.endswith("/chat/completions"):
            payload: Any = COMPLETION
        elif request.method == "POST" and path.endswith("/messages"):
            payload = MESSAGE
        elif request.method == "GET" and path.endswith("/models"):
            payload = MODELS
        else:
            payload = {"upstream": self.name, "method": request.method, "path_qs": request.path_qs}
        return web.json_response(payload, headers={"x-upstream": self.name})


async def recorder(aiohttp_server: Any, name: str) -> Recorder:
    rec = Recorder(name)
    server = await aiohttp_server(rec.app())
    rec.url = str(server.make_url("")).rstrip("/")
    return rec


@pytest.fixture
async def three(aiohttp_server: Any) -> dict[str, Recorder]:
    return {name: await recorder(aiohttp_server, name) for name in ("openai", "anthropic", "gemini")}


@pytest.fixture
async def routed(make_harness: MakeHarness, three: dict[str, Recorder]) -> Harness:
    """A proxy whose three default upstreams are three different recorders."""
    return await make_harness(**{f"upstreams.{name}": {"format": name, "url": rec.url} for name, rec in three.items()})


def who(three: dict[str, Recorder]) -> list[str]:
    return [name for name, rec in three.items() for _ in rec.hits]


# --- the default rule -----------------------------------------------------------------------------

ROUTES = [
    # rule 3: everything else goes to openai
    ("openai", "POST", "/v1/chat/completions", {}, b'{"model":"m","messages":[]}'),
    ("openai", "POST", "/chat/completions", {}, b'{"model":"m","messages":[]}'),
    ("openai", "POST", "/v1/responses", {}, b'{"model":"m","input":"hi"}'),
    ("openai", "GET", "/v1/models", {}, None),
    ("openai", "GET", "/v1/models/gpt-4o", {}, None),
    ("openai", "DELETE", "/v1/models/ft:gpt-4o-mini:acme::abc123", {}, None),
    ("openai", "POST", "/v1/embeddings", {}, b'{"input":"x"}'),
    ("openai", "POST", "/v1/messagesX", {}, b"{}"),  # only /v1/messages and /v1/messages/... are anthropic
    ("openai", "GET", "/v2/messages", {}, None),
    ("openai", "GET", "/v1/models?keys=1&api_key=2", {}, None),  # only a parameter named exactly 'key'
    ("openai", "GET", "/v1/models", {"x-goog-api-client": "genai-py"}, None),
    # rule 1: anthropic-version header or a /v1/messages path
    ("anthropic", "POST", "/v1/messages", {}, b'{"model":"m","messages":[]}'),
    ("anthropic", "POST", "/v1/messages/count_tokens", {}, b'{"model":"m","messages":[]}'),
    ("anthropic", "GET", "/v1/messages/batches?limit=2", {}, None),
    ("anthropic", "GET", "/v1/models", {"anthropic-version": "2023-06-01"}, None),
    ("anthropic", "POST", "/v1/files", {"anthropic-version": "2023-06-01"}, b"not multipart"),
    ("anthropic", "POST", "/v1/chat/completions", {"anthropic-version": "2023-06-01"}, b"{}"),
    ("anthropic", "GET", "/v1beta/models", {"anthropic-version": "2023-06-01"}, None),  # rule 1 wins over 2
    ("anthropic", "POST", "/v1/messages?key=abc", {"x-goog-api-key": "g"}, b'{"messages":[]}'),
    # rule 2: gemini
    ("gemini", "GET", "/v1beta/models", {}, None),
    ("gemini", "POST", "/v1beta/models/gemini-2.0-flash:generateContent", {}, b'{"contents":[]}'),
    ("gemini", "POST", "/v1beta/models/gemini-2.0-flash:countTokens", {}, b'{"contents":[]}'),
    ("gemini", "POST", "/v1alpha/models/gemini-2.0-flash:generateContent", {}, b'{"contents":[]}'),
    ("gemini", "POST", "/v1/models/gemini-pro:streamGenerateContent?alt=sse", {}, b'{"contents":[]}'),
    ("gemini", "POST", "/upload/v1beta/files", {}, b"bytes"),
    ("gemini", "GET", "/v1/models", {"x-goog-api-key": "g-key"}, None),
    ("gemini", "GET", "/v1/models?key=g-key", {}, None),
    ("gemini", "POST", "/v1/chat/completions?key=", {}, b"{}"),  # an empty 'key' parameter still counts
]


@pytest.mark.parametrize(("expected", "method", "path_qs", "headers", "body"), ROUTES,
                         ids=[f"{e}:{m} {p} {sorted(h)}" for e, m, p, h, _ in ROUTES])
async def test_default_rule_picks_the_upstream(
    routed: Harness, three: dict[str, Recorder], expected: str, method: str, path_qs: str,
    headers: dict[str, str], body: bytes | None,
) -> None:
    resp = await routed.client.request(method, URL(path_qs, encoded=True), data=body, headers=headers)
    assert resp.status == 200, await resp.text()
    assert resp.headers["x-upstream"] == expected
    assert who(three) == [expected]
    [hit] = three[expected].hits
    assert (hit.method, hit.path_qs, hit.body) == (method, path_qs, body or b"")
    assert routed.upstream.received == []  # the shared FakeUpstream is not behind any default here


async def test_each_format_projects_only_on_its_own_upstream(routed: Harness, three: dict[str, Recorder]) -> None:
    data = make_image(color=110)
    aid = await routed.admit(data)
    b64 = base64.b64encode(data).decode()
    chat = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"attachment:{aid}"}}]}]}
    msgs = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": f"attachment:{aid}"}}]}]}
    hdr = {"X-Session-Id": SID}
    assert (await routed.client.post("/v1/chat/completions", json=chat, headers=hdr)).status == 200
    assert (await routed.client.post("/v1/messages", json=msgs, headers=hdr)).status == 200
    openai_part = three["openai"].hits[-1].json()["messages"][0]["content"][0]
    assert openai_part["image_url"]["url"] == f"data:image/png;base64,{b64}"
    anthropic_block = three["anthropic"].hits[-1].json()["messages"][0]["content"][0]
    assert anthropic_block["source"] == {"type": "base64", "media_type": "image/png", "data": b64}
    # an anthropic-version header sends a chat-completions body to anthropic, where it is not a
    # projecting path: it passes through unprojected and nothing is read
    reads = routed.store.total
    raw = msgspec.json.encode(chat)
    resp = await routed.client.post("/v1/chat/completions", data=raw,
                                    headers={**hdr, "anthropic-version": "2023-06-01", "Content-Type": "application/json"})
    assert resp.status == 200 and resp.headers["x-upstream"] == "anthropic"
    assert three["anthropic"].hits[-1].body == raw
    assert routed.store.total == reads


# --- named upstreams ------------------------------------------------------------------------------

@pytest.fixture
async def deepseek(aiohttp_server: Any) -> Recorder:
    return await recorder(aiohttp_server, "deepseek")


@pytest.fixture
async def named(make_harness: MakeHarness, deepseek: Recorder) -> Harness:
    return await make_harness(**{"upstreams.deepseek": {"format": "openai", "url": deepseek.url}})


async def test_named_upstream_projects_with_the_prefix_removed(named: Harness, deepseek: Recorder) -> None:
    data = make_image(color=111)
    aid = await named.admit(data, name="shot.png")
    gone = ref_id(make_image(color=112))
    body = {"model": "deepseek-chat", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"attachment:{aid}", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": f"attachment:{gone}?name=old.png"}}]}]}
    resp = await named.client.post("/u/deepseek/v1/chat/completions?trace=1", json=body,
                                   headers={"X-Session-Id": SID, "Authorization": "Bearer sk-ds"})
    assert resp.status == 200
    assert (await resp.json())["object"] == "chat.completion"
    [hit] = deepseek.hits
    assert hit.method == "POST" and hit.path_qs == "/v1/chat/completions?trace=1"
    assert hit.headers["authorization"] == "Bearer sk-ds"
    assert "x-session-id" not in hit.headers
    parts = hit.json()["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "look"}
    assert parts[1] == {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(data).decode(), "detail": "low"}}
    assert parts[2] == {"type": "text", "text": f'[image unavailable: not_found; "old.png" ({gone[:15]})]'}
    assert named.upstream.received == []  # the default openai/anthropic fake saw nothing
    events = await named.events(SID)
    assert [(e["type"], e["data"]["attachment_id"]) for e in events] == [("attachment/quarantine", gone)]


async def test_named_upstream_passes_other_paths_through(named: Harness, deepseek: Recorder) -> None:
    aid = await named.admit(make_image(color=113))
    cases = [
        ("GET", "/v1/models?limit=5&limit=6", None),
        ("POST", "/v1/embeddings", b'{"input": "attachment:' + aid.encode() + b'"}'),
        ("DELETE", "/v1/files/file%2Dabc%20x", None),
        ("GET", "/", None),
    ]
    for method, path_qs, body in cases:
        resp = await named.client.request(method, URL("/u/deepseek" + path_qs, encoded=True), data=body)
        assert resp.status == 200, path_qs
        assert resp.headers["x-upstream"] == "deepseek"
        hit = deepseek.hits[-1]
        assert (hit.method, hit.path_qs, hit.body) == (method, path_qs, body or b"")
    assert len(deepseek.hits) == len(cases)
    assert named.store.total == 0
    assert named.upstream.received == []


async def test_named_upstream_url_with_a_base_path(make_harness: MakeHarness, deepseek: Recorder) -> None:
    harness = await make_harness(**{"upstreams.ds": {"format": "openai", "url": deepseek.url + "/api/ds/"}})
    resp = await harness.client.get(URL("/u/ds/v1/models?x=%2F", encoded=True))
    assert resp.status == 200
    assert deepseek.hits[-1].path_qs == "/api/ds/v1/models?x=%2F"


async def test_named_upstreams_of_each_format_project_in_their_format(
    make_harness: MakeHarness, three: dict[str, Recorder]
) -> None:
    harness = await make_harness(**{
        "upstreams.claude": {"format": "anthropic", "url": three["anthropic"].url},
        "upstreams.oai": {"format": "openai", "url": three["openai"].url},
    })
    data = make_image(color=114)
    aid = await harness.admit(data)
    b64 = base64.b64encode(data).decode()
    msgs = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": aid}}]}]}
    resp = await harness.client.post("/u/claude/v1/messages", json=msgs, headers={"X-Session-Id": SID})
    assert resp.status == 200 and (await resp.json())["type"] == "message"
    hit = three["anthropic"].hits[-1]
    assert hit.path_qs == "/v1/messages"
    assert hit.json()["messages"][0]["content"][0]["source"] == {"type": "base64", "media_type": "image/png", "data": b64}
    # a named upstream's format decides, not the path: /v1/messages on an openai-format upstream is
    # just another pass-through path there (and no anthropic-version routing happens under /u/)
    raw = msgspec.json.encode(msgs)
    resp = await harness.client.post("/u/oai/v1/messages", data=raw,
                                     headers={"anthropic-version": "2023-06-01", "Content-Type": "application/json"})
    assert resp.status == 200
    assert three["openai"].hits[-1].path_qs == "/v1/messages" and three["openai"].hits[-1].body == raw


@pytest.mark.parametrize(("method", "path", "shape"), [
    ("GET", "/u/nope/v1/models", "openai"), ("POST", "/u/nope/v1/chat/completions", "openai"),
    ("POST", "/u/nope/v1/messages", "anthropic"), ("POST", "/u/nope/v1beta/models/g:generateContent", "gemini")])
async def test_unknown_named_upstream_is_a_404_in_the_shape_the_request_speaks(
        named: Harness, method: str, path: str, shape: str) -> None:
    """The request's own format decides the error's shape, never a configured upstream's: a stranger
    cannot tell from it which names exist or what format they have."""
    resp = await named.client.request(method, path, json={"model": "m", "messages": []})
    assert resp.status == 404
    assert resp.headers["x-projectionist-error-code"] == "UNKNOWN_UPSTREAM"
    payload = await resp.json()
    if shape == "openai":
        assert set(payload) == {"error"}
        error = payload["error"]
        assert error["code"] == "UNKNOWN_UPSTREAM" and error["type"] == "not_found_error" and error["param"] is None
        assert "nope" in error["message"]
    elif shape == "anthropic":
        assert payload["type"] == "error" and payload["error"]["details"] == {"error_code": "UNKNOWN_UPSTREAM"}
    else:
        assert payload["error"]["code"] == 404 and payload["error"]["status"] == "NOT_FOUND"
    assert named.upstream.received == []


async def test_openai_sdk_against_a_named_upstream(named: Harness, deepseek: Recorder) -> None:
    data = make_image(color=115)
    aid = await named.admit(data)
    async with openai.AsyncOpenAI(base_url=str(named.client.make_url("/u/deepseek/v1")), api_key="sk-ds",
                                  default_headers={"X-Session-Id": SID}, max_retries=0) as client:
        completion = await client.chat.completions.create(model="deepseek-chat", messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": f"attachment:{aid}"}}]}])
        assert completion.choices[0].message.content == "Hello from the fake upstream."
        models = await client.models.list()
        assert [m.id async for m in models] == ["deepseek-chat"]
    chat, listing = deepseek.hits
    assert chat.path_qs == "/v1/chat/completions" and chat.headers["authorization"] == "Bearer sk-ds"
    assert chat.json()["messages"][0]["content"][1]["image_url"]["url"] == (
        "data:image/png;base64," + base64.b64encode(data).decode())
    assert (listing.method, listing.path_qs) == ("GET", "/v1/models")
    async with openai.AsyncOpenAI(base_url=str(named.client.make_url("/u/nope/v1")), api_key="k", max_retries=0) as bad:
        with pytest.raises(openai.NotFoundError) as caught:
            await bad.models.list()
    assert caught.value.code == "UNKNOWN_UPSTREAM"


# --- --upstream NAME=[FORMAT:]URL -----------------------------------------------------------------

@pytest.mark.parametrize(("spec", "parsed"), [
    ("openai=http://127.0.0.1:9000", ("openai", None, "http://127.0.0.1:9000")),
    ("anthropic=https://gateway.example/anthropic/", ("anthropic", None, "https://gateway.example/anthropic/")),
    ("deepseek=openai:https://api.deepseek.com", ("deepseek", "openai", "https://api.deepseek.com")),
    ("claude2=anthropic:http://10.0.0.2:8080/v1beta", ("claude2", "anthropic", "http://10.0.0.2:8080/v1beta")),
    ("vertex=gemini:https://x.example", ("vertex", "gemini", "https://x.example")),
    ("a.b-c_d=openai:http://h", ("a.b-c_d", "openai", "http://h")),
])
def test_parse_upstream_spec_valid(spec: str, parsed: tuple[str, str | None, str]) -> None:
    assert parse_upstream_spec(spec) == parsed


@pytest.mark.parametrize("spec", [
    "deepseek=mistral:https://api.mistral.ai",   # unknown format
    "deepseek=OpenAI:https://h",                  # formats are lower-case names
    "deepseek",                                   # no '='
    "=openai:http://h",                           # no name
    "deepseek=",                                  # nothing after '='
    "deepseek=openai:",                           # format without a URL
    "deepseek=openai:ftp://h",                    # not http(s)
    "deepseek=api.deepseek.com",                  # no scheme
])
def test_parse_upstream_spec_invalid(spec: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_upstream_spec(spec)
    assert caught.value.code == "INVALID_CONFIG"
    assert caught.value.status == 400


def base_config() -> Config:
    return load_config(None, **{"upstreams.openai": {"format": "openai", "url": "https://api.openai.com",
                                                     "api_key_env": "OAI_KEY", "read_timeout": 12.5}})


def test_with_upstreams_declares_a_new_named_upstream() -> None:
    config = with_upstreams(base_config(), [parse_upstream_spec("deepseek=openai:https://api.deepseek.com/")])
    assert config.upstreams["deepseek"] == UpstreamConfig("openai", "https://api.deepseek.com")
    assert set(config.upstreams) == {"openai", "anthropic", "gemini", "deepseek"}


def test_with_upstreams_new_name_needs_a_format() -> None:
    with pytest.raises(InvalidRequest) as caught:
        with_upstreams(base_config(), [parse_upstream_spec("deepseek=https://api.deepseek.com")])
    assert caught.value.code == "INVALID_CONFIG" and "deepseek" in caught.value.message


def test_with_upstreams_overrides_an_existing_one_keeping_its_other_settings() -> None:
    config = with_upstreams(base_config(), [parse_upstream_spec("openai=http://127.0.0.1:9000/")])
    up = config.upstreams["openai"]
    assert (up.format, up.url, up.api_key_env, up.read_timeout) == ("openai", "http://127.0.0.1:9000", "OAI_KEY", 12.5)
    # a format given for a known name changes it; the rest is kept
    config = with_upstreams(config, [parse_upstream_spec("openai=anthropic:http://127.0.0.1:9001")])
    up = config.upstreams["openai"]
    assert (up.format, up.url, up.api_key_env) == ("anthropic", "http://127.0.0.1:9001", "OAI_KEY")
    # later declarations win, and the input config is not modified
    base = base_config()
    config = with_upstreams(base, [("deepseek", "openai", "http://a"), ("deepseek", None, "http://b")])
    assert config.upstreams["deepseek"] == UpstreamConfig("openai", "http://b")
    assert "deepseek" not in base.upstreams


async def test_declared_upstream_is_routable(make_config: Callable[..., Config], make_harness: MakeHarness,
                                             deepseek: Recorder) -> None:
    config = with_upstreams(make_config(), [parse_upstream_spec(f"ds=openai:{deepseek.url}")])
    harness = await make_harness(config)
    resp = await harness.client.get("/u/ds/v1/models")
    assert resp.status == 200 and resp.headers["x-upstream"] == "deepseek"
    assert deepseek.hits[-1].path_qs == "/v1/models"
