"""A new format is one adapter module and one registry entry: the toy format (``tests.toy_format``),
registered by the one line a shipped format has in ``adapters.registry.MODULES``, runs through the
proxy end to end. Its config is accepted, its requests are routed to its upstream by its hints,
its attachment references are projected into its image slot, its upstream's signature over the
body is made by its ``sign`` (and checked by the fake upstream), its Files API and its WebSocket
routes are its facts', and the spans carry its tracing names. Any list of formats left in
``proxy/`` fails one of these."""

from __future__ import annotations

import base64
import dataclasses
import re
import types
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec
import pytest
from aiohttp import FormData, web
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from projectionist.adapters import registry
from projectionist.adapters.facts import Socket
from projectionist.policy.errors import InvalidRequest
from projectionist.proxy.call import websocket
from projectionist.proxy.config import Config, load_config
from projectionist.proxy.edge.routing import format_spoken
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.observe.tracing import Tracing
from tests import toy_format
from tests.conftest import Harness
from tests.imaging import make_image

MakeHarness = Callable[..., Awaitable[Harness]]
KEY = "toy-upstream-secret"


@pytest.fixture
def toy() -> Iterator[None]:
    """The toy format registered as a shipped one is: one more entry among the registry's modules."""
    registry.index((*registry.MODULES, toy_format))
    yield
    registry.index(registry.MODULES)


class ToyUpstream:
    """The toy format's provider: it answers a generation whose ``x-toy-signature`` is the
    HMAC of its method, URL and body under ``KEY``, and 401 to any other."""

    def __init__(self) -> None:
        self.url = ""
        self.received: list[tuple[str, dict[str, str], bytes]] = []

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.append((request.path_qs, dict(request.headers), body))
        expected = toy_format.sig(KEY, request.method, self.url + request.path_qs, body)
        if request.headers.get(toy_format.SIGNATURE) != expected:
            return web.json_response({"toy_error": {"code": "bad_signature"}}, status=401)
        return web.json_response({"id": "toy-1", "output": "seen", "model": request.match_info["model"],
                                  "usage": {"input_tokens": 3, "output_tokens": 2}})


@pytest.fixture
async def toy_upstream(aiohttp_server: Any) -> ToyUpstream:
    fake = ToyUpstream()
    app = web.Application()
    app.router.add_post("/toy/models/{model}/generate", fake.generate)
    server = await aiohttp_server(app)
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


def toy_config(make_config: Callable[..., Config], url: str) -> Config:
    return make_config(**{"upstreams.toy": {"format": "toy", "url": url, "api_key": KEY}})


def test_a_config_names_the_toy_format_once_it_is_registered_and_no_sooner(toy: None) -> None:
    config = load_config(None, **{"upstreams.toy": {"format": "toy", "url": "https://toy.example"}})
    assert config.upstreams["toy"].format == "toy"
    assert set(config.upstreams) == {"openai", "anthropic", "gemini", "toy"}  # the toy has no default upstream
    with pytest.raises(InvalidRequest) as unknown:
        load_config(None, **{"upstreams.x": {"format": "toyy", "url": "https://toy.example"}})
    assert unknown.value.message == ("invalid configuration: `upstreams.<name>.format`: Invalid enum value 'toyy'; "
                                     "valid values: 'openai', 'anthropic', 'gemini', 'toy'")
    registry.index(registry.MODULES)  # unregistered (the fixture's own teardown does the same)
    with pytest.raises(InvalidRequest) as refused:
        load_config(None, **{"upstreams.toy": {"format": "toy", "url": "https://toy.example"}})
    assert "Invalid enum value 'toy'; valid values: 'openai', 'anthropic', 'gemini'" in refused.value.message


def test_a_request_under_its_prefix_speaks_the_toy_format(toy: None) -> None:
    empty: Any = {}
    assert format_spoken("/toy/models/m1/generate", empty, empty) == "toy"
    assert format_spoken("/v1/chat/completions", empty, empty) == "openai"  # the others' hints as they were
    assert format_spoken("/v1/messages", empty, empty) == "anthropic"


async def test_a_toy_call_is_projected_signed_and_traced_by_its_facts(
        toy: None, make_harness: MakeHarness, make_config: Callable[..., Config], toy_upstream: ToyUpstream) -> None:
    harness = await make_harness(toy_config(make_config, toy_upstream.url))
    exporter = InMemorySpanExporter()
    tracing = harness.app[SERVICES].tracing = Tracing("http://127.0.0.1:9", "toy-test", exporter=exporter)
    image = make_image(color=7)
    aid = await harness.admit(image)
    body = {"inputs": [{"text": "what is this?"}, {"image": f"attachment:{aid}"}]}
    # no /u/toy/: its hints (a path under /toy/) route it to the upstream named after the format
    resp = await harness.client.post("/toy/models/m1/generate", json=body,
                                     headers={"X-Session-Id": "toy-1", "x-toy-key": "client-own-key"})
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["output"] == "seen"

    [(path, headers, sent)] = toy_upstream.received
    assert path == "/toy/models/m1/generate"
    # the attachment reference is the toy's image slot, inlined; the text part as it came
    assert msgspec.json.decode(sent) == {"inputs": [
        {"text": "what is this?"},
        {"image": {"media_type": "image/png", "base64": base64.b64encode(image).decode()}}]}
    # signed by its sign() over the bytes that went; the client's own key never travels
    assert headers[toy_format.SIGNATURE] == toy_format.sig(KEY, "POST", toy_upstream.url + path, sent)
    assert "x-toy-key" not in {name.lower() for name in headers}

    tracing.provider.force_flush()
    [span] = [s for s in exporter.get_finished_spans() if s.name != "projection"]
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.provider.name"] == attributes["gen_ai.system"] == "toy.example"
    assert attributes["gen_ai.operation.name"] == "toy_generate"
    assert attributes["gen_ai.request.model"] == "m1"  # read off the path: CallFacts.model_path
    assert attributes["projectionist.route"] == "toy" and attributes["projectionist.upstream"] == "toy"
    assert span.name == "toy_generate m1"


async def test_a_toy_call_whose_image_is_gone_gets_the_toy_placeholder_and_is_still_signed(
        toy: None, make_harness: MakeHarness, make_config: Callable[..., Config], toy_upstream: ToyUpstream) -> None:
    harness = await make_harness(toy_config(make_config, toy_upstream.url))
    aid = await harness.admit(make_image(color=8))
    await harness.remove(aid)
    body = {"inputs": [{"image": f"attachment:{aid}"}]}
    resp = await harness.client.post("/u/toy/toy/models/m2/generate", json=body, headers={"X-Session-Id": "toy-2"})
    assert resp.status == 200, await resp.text()
    [(_, _, sent)] = toy_upstream.received
    [part] = msgspec.json.decode(sent)["inputs"]
    assert list(part) == ["text"] and aid[:15] in part["text"]


async def test_an_image_uploaded_to_the_toy_files_api_becomes_an_attachment_in_its_shape(
        toy: None, make_harness: MakeHarness, make_config: Callable[..., Config], toy_upstream: ToyUpstream) -> None:
    harness = await make_harness(toy_config(make_config, toy_upstream.url))
    form = FormData()
    form.add_field("file", make_image(color=9), filename="shot.png", content_type="image/png")
    resp = await harness.client.post("/u/toy/v1/files", data=form)
    assert resp.status == 200, await resp.text()
    found = await resp.json()
    assert set(found) == {"toy_file", "name", "media_type", "size"} and found["toy_file"].startswith("sha256:")
    assert toy_upstream.received == []  # admitted here: the upstream saw nothing


def test_the_websocket_routes_are_the_formats_facts(toy: None) -> None:
    assert websocket.serves("toy", "/toy/live") is None  # the toy declares none
    live = types.SimpleNamespace(**{k: getattr(toy_format, k) for k in dir(toy_format) if not k.startswith("__")})
    live.NAME = live.FORMAT = "toylive"
    live.FACTS = dataclasses.replace(toy_format.FACTS, name="toylive", spoken=None, signs_request=False,
                                     sockets=(Socket(re.compile(r"/toy/live"), "realtime"),))
    registry.index((*registry.MODULES, toy_format, live))  # type: ignore[arg-type]
    assert websocket.serves("toylive", "/toy/live") == "realtime"
    assert websocket.serves("openai", "/v1/realtime") == "realtime"


def test_the_registry_refuses_a_format_that_signs_requests_and_has_a_websocket(toy: None) -> None:
    signing = types.SimpleNamespace(**vars(toy_format))
    signing.FACTS = dataclasses.replace(toy_format.FACTS, sockets=(Socket(re.compile(r"/toy/live"), "realtime"),))
    with pytest.raises(ValueError, match="signs each request has no WebSocket"):
        registry.index((*registry.MODULES, signing))  # type: ignore[arg-type]
    assert "toy" in registry.FORMATS  # a refused index leaves the tables as they were
