"""Image URLs the provider fetches itself, end to end: a fake provider answers its real "could not
download / fetch" message for a URL image (``Error while downloading ...``, ``Timeout while
downloading ...``, ``...image.source.url: Unable to download the file...``, ``Cannot fetch content
from the provided URL.``); the proxy records one ``attachment/quarantine`` (``url``) for that URL,
sends the call once more with its placeholder, and the client gets a 200; later requests of the
session carry the placeholder and the provider never sees the URL again. Also: concurrent
requests and a second replica make one transition, an answer that is not about a URL is not
taken for one, the official SDKs, a URL at the proxy itself or at a private address, sessionless
calls, the log keeping no URL, and replay. The adapters and the policy alone:
``tests/adapters/test_unfetched.py``, ``tests/policy/test_url_images.py``."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anthropic
import msgspec
import openai
import pytest
from aiohttp import web
from google import genai
from google.genai import types
from structlog.testing import capture_logs

from projectionist.policy.linked import url_id
from projectionist.proxy.call.replay import rebuild
from projectionist.proxy.inbound.services import SERVICES
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import ADMIN, Harness
from tests.fakes import FakeUpstream
from tests.imaging import make_image

# google-genai subclasses aiohttp.ClientSession, which aiohttp deprecates (not our concern).
pytestmark = pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")

MakeHarness = Callable[..., Awaitable[Harness]]
SECRET = "a1b2c3d4e5f60718"
GONE = ("https://bucket.s3.amazonaws.com/u/7/cat.png?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=300"
        f"&X-Amz-Signature={SECRET}")
GOOD = "https://cdn.example/photos/dog.jpg"


# --- the fake provider's answers: what each API says when it could not fetch a URL -----------

def _strings(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, (*path, index))
    elif isinstance(node, str):
        yield path, node


def openai_download(url: str, path: tuple[Any, ...]) -> web.Response:
    """Chat Completions (openai/openai-python#2790): the message quotes the URL."""
    return web.json_response({"error": {"message": f"Error while downloading {url}.", "type": "invalid_request_error",
                                        "param": None, "code": "invalid_image_url"}}, status=400)


def responses_timeout(url: str, path: tuple[Any, ...]) -> web.Response:
    """Responses (vercel/ai#8857): a timeout, ``param: "url"``."""
    return web.json_response({"error": {"code": "invalid_value", "param": "url", "type": "invalid_request_error",
                                        "message": f"Timeout while downloading {url}"}}, status=400)


def anthropic_download(url: str, path: tuple[Any, ...]) -> web.Response:
    """Messages: the message opens with the block's path."""
    block = ".".join(str(step) for step in path[:path.index("source")])
    return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message":
                              f"{block}.image.source.url: Unable to download the file. Please verify the URL and "
                              "try again."}, "request_id": "req_fake"}, status=400)


def gemini_unsupported(url: str, path: tuple[Any, ...]) -> web.Response:
    """Gemini (BoundaryML/baml#1548): the message quotes the URI."""
    return web.json_response({"error": {"code": 400, "message": f"Invalid or unsupported file uri: {url}",
                                        "status": "INVALID_ARGUMENT"}}, status=400)


def gemini_cannot_fetch(url: str, path: tuple[Any, ...]) -> web.Response:
    """Gemini (googleapis/js-genai#1385): names neither the URL nor the part."""
    return web.json_response({"error": {"code": 400, "message": "Cannot fetch content from the provided URL.",
                                        "status": "INVALID_ARGUMENT"}}, status=400)


class Refusing:
    """The fake upstream's script: a request that carries one of ``dead`` is answered with
    ``answer`` (counted in ``refusals``); every other request goes to the fake's own routes."""

    def __init__(self, upstream: FakeUpstream, dead: set[str],
                 answer: Callable[[str, tuple[Any, ...]], web.Response]) -> None:
        self.dead, self.answer, self.refusals = dead, answer, 0
        upstream.script = self

    async def __call__(self, request: web.Request, doc: Any) -> web.StreamResponse | None:
        hit = next(((path, value) for path, value in _strings(doc) if value in self.dead), None)
        if hit is None:
            return None
        self.refusals += 1
        return self.answer(hit[1], hit[0])


# --- one request per format, with image URLs where its provider fetches them ------------------

def chat(*urls: str) -> dict[str, Any]:
    parts: list[Any] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": url, "detail": "low"}} for url in urls]
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def responses(*urls: str) -> dict[str, Any]:
    parts: list[Any] = [{"type": "input_text", "text": "look"}]
    parts += [{"type": "input_image", "image_url": url, "detail": "auto"} for url in urls]
    return {"model": "m", "input": [{"role": "user", "content": parts}]}


def messages(*urls: str) -> dict[str, Any]:
    blocks: list[Any] = [{"type": "image", "source": {"type": "url", "url": url}} for url in urls]
    return {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "first turn"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": [*blocks, {"type": "text", "text": "look"}]}]}


def gemini(*urls: str) -> dict[str, Any]:
    parts: list[Any] = [{"text": "look"}]
    parts += [{"file_data": {"file_uri": url, "mime_type": "image/jpeg"}} for url in urls]
    return {"contents": [{"role": "user", "parts": parts}]}


#: format -> (path, body, the provider's answer, what it says of the URL)
FORMATS: dict[str, tuple[str, Callable[..., dict[str, Any]], Callable[[str, tuple[Any, ...]], web.Response], str]] = {
    "chat": ("/v1/chat/completions", chat, openai_download, "not_found"),
    "responses": ("/v1/responses", responses, responses_timeout, "read_failed"),
    "messages": ("/v1/messages", messages, anthropic_download, "not_found"),
    "gemini": ("/v1beta/models/g:generateContent", gemini, gemini_unsupported, "not_found"),
}


@pytest.fixture
async def proxy(make_harness: MakeHarness, upstream: FakeUpstream) -> Harness:
    return await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})


async def post(harness: Harness, path: str, body: dict[str, Any], session: str | None = "u") -> Any:
    headers = {"X-Session-Id": session} if session else {}
    return await harness.client.post(path, json=body, headers=headers)


def urls_in(body: bytes) -> list[str]:
    return [value for _, value in _strings(msgspec.json.decode(body)) if value.startswith("http")]


def placeholders(body: bytes) -> list[str]:
    return [value for _, value in _strings(msgspec.json.decode(body)) if value.startswith("[image unavailable")]


def url_quarantines(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "attachment/quarantine" and e["data"].get("url")]


def placeholder(url: str, failure: str, name: str | None = "cat.png") -> str:
    shown = f'; "{name}"' if name else ""
    return f"[image unavailable: {failure}{shown} ({url_id(url)[:15]})]"


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_url_the_provider_cannot_fetch_is_quarantined_and_the_call_sent_once_more(
        proxy: Harness, upstream: FakeUpstream, fmt: str) -> None:
    path, body, answer, failure = FORMATS[fmt]
    refusing = Refusing(upstream, {GONE}, answer)
    before = len(upstream.received)
    resp = await post(proxy, path, body(GOOD, GONE))
    assert resp.status == 200, await resp.text()
    first, second = upstream.received[before:]
    assert urls_in(first.body) == [GOOD, GONE]
    assert urls_in(second.body) == [GOOD]  # the other URL image goes as it came
    assert placeholders(second.body) == [placeholder(GONE, failure)]
    [quarantine] = url_quarantines(await proxy.events("u"))
    assert quarantine == {"attachment_id": url_id(GONE), "failure": failure, "retryable": failure == "read_failed",
                          "name": "cat.png", "url": True, "suspects": 1}
    # later requests of the session replace the URL without asking the provider
    for _ in range(2):
        before = len(upstream.received)
        again = await post(proxy, path, body(GOOD, GONE))
        assert again.status == 200, await again.text()
        [sent] = upstream.received[before:]
        assert urls_in(sent.body) == [GOOD] and SECRET.encode() not in sent.body
        assert placeholders(sent.body) == [placeholder(GONE, failure)]
    assert refusing.refusals == 1
    assert len(url_quarantines(await proxy.events("u"))) == 1


async def test_a_streamed_call_is_sent_once_more_before_its_first_byte(proxy: Harness, upstream: FakeUpstream) -> None:
    refusing = Refusing(upstream, {GONE}, openai_download)
    resp = await post(proxy, "/v1/chat/completions", {**chat(GONE), "stream": True})
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    assert (await resp.text()).rstrip().endswith("data: [DONE]")
    assert refusing.refusals == 1 and placeholders(upstream.last.body) == [placeholder(GONE, "not_found")]


async def test_concurrent_requests_refused_for_one_url_record_one_transition(
        proxy: Harness, upstream: FakeUpstream) -> None:
    Refusing(upstream, {GONE}, openai_download)
    answers = await asyncio.gather(*(post(proxy, "/v1/chat/completions", chat(GOOD, GONE), "c") for _ in range(8)))
    assert [a.status for a in answers] == [200] * 8
    assert [q["attachment_id"] for q in url_quarantines(await proxy.events("c"))] == [url_id(GONE)]


async def test_two_replicas_refused_for_one_url_record_one_transition(
        make_harness: MakeHarness, upstream: FakeUpstream) -> None:
    a, b = await make_harness(), await make_harness()  # two processes' apps on one store and one log
    refusing = Refusing(upstream, {GONE}, anthropic_download)
    answers = await asyncio.gather(*(post((a, b)[i % 2], "/v1/messages", messages(GONE), "r") for i in range(10)))
    assert [r.status for r in answers] == [200] * 10
    assert [q["attachment_id"] for q in url_quarantines(await a.events("r"))] == [url_id(GONE)]
    assert refusing.refusals <= 10  # each client request cost at most one extra call
    refused = refusing.refusals
    for replica in (a, b):  # each replica now sends the placeholder without asking
        assert (await post(replica, "/v1/messages", messages(GONE), "r")).status == 200
        assert placeholders(upstream.last.body) == [placeholder(GONE, "not_found")]
    assert refusing.refusals == refused


async def test_an_answer_that_names_no_url_is_put_down_to_the_calls_url_images(
        proxy: Harness, upstream: FakeUpstream) -> None:
    refusing = Refusing(upstream, {GONE}, gemini_cannot_fetch)
    path = "/v1beta/models/g:generateContent"
    assert (await post(proxy, path, gemini(GONE), "g1")).status == 200  # one URL image: it is that one
    assert placeholders(upstream.last.body) == [placeholder(GONE, "read_failed")]
    [one] = url_quarantines(await proxy.events("g1"))
    assert (one["attachment_id"], one["retryable"], one["suspects"]) == (url_id(GONE), True, 1)
    assert (await post(proxy, path, gemini(GOOD, GONE), "g2")).status == 200  # two: each is a suspect
    assert [(q["attachment_id"], q["suspects"]) for q in url_quarantines(await proxy.events("g2"))] == [
        (url_id(GOOD), 2), (url_id(GONE), 2)]
    assert urls_in(upstream.last.body) == [] and refusing.refusals == 2


async def test_a_call_refused_again_after_its_resend_returns_the_providers_error(
        proxy: Harness, upstream: FakeUpstream) -> None:
    other = "https://bucket.s3.amazonaws.com/u/7/bird.webp?X-Amz-Signature=ff00"
    refusing = Refusing(upstream, {GONE, other}, openai_download)
    before = len(upstream.received)
    resp = await post(proxy, "/v1/chat/completions", chat(GONE, other), "twice")
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_image_url"
    assert len(upstream.received) == before + 2 and refusing.refusals == 2  # one re-send, no loop
    # the next request gets the first URL's placeholder and is rescued from the second in turn
    assert (await post(proxy, "/v1/chat/completions", chat(GONE, other), "twice")).status == 200
    assert len(url_quarantines(await proxy.events("twice"))) == 2 and urls_in(upstream.last.body) == []


async def test_a_resigned_url_is_another_url_tried_anew(proxy: Harness, upstream: FakeUpstream) -> None:
    Refusing(upstream, {GONE}, openai_download)
    assert (await post(proxy, "/v1/chat/completions", chat(GONE), "sign")).status == 200
    fresh = GONE.replace(SECRET, "0f0f0f0f")
    assert (await post(proxy, "/v1/chat/completions", chat(fresh), "sign")).status == 200
    assert urls_in(upstream.last.body) == [fresh]


async def test_a_urls_quarantine_cannot_be_recovered_there_is_nothing_to_verify(
        proxy: Harness, upstream: FakeUpstream) -> None:
    Refusing(upstream, {GONE}, openai_download)
    assert (await post(proxy, "/v1/chat/completions", chat(GONE), "rec")).status == 200
    view = await (await proxy.client.get("/admin/sessions/rec/quarantine", headers=ADMIN)).json()
    [held] = view["quarantined"]
    assert (held["attachment_id"], held["failure"], held["url"]) == (url_id(GONE), "not_found", True)
    before = await proxy.events("rec")
    resp = await proxy.client.post(f"/admin/sessions/rec/attachments/{url_id(GONE)}/recover", headers=ADMIN)
    assert resp.status == 409 and (await resp.json())["error"]["code"] == "ATTACHMENT_NOT_FOUND"
    assert await proxy.events("rec") == before  # nothing appended: the placeholder stays
    assert proxy.store.reads[url_id(GONE)] == 1  # the recovery's own read, the only one ever made


def dimensions_refusal(url: str, path: tuple[Any, ...]) -> web.Response:
    """A refusal of what the provider fetched (anthropics/claude-code#4778's answer, at a URL's block)."""
    block = ".".join(str(step) for step in path[:path.index("source")])
    return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message":
                              f"{block}.image.source.url: At least one of the image dimensions exceed max allowed "
                              "size: 8000 pixels"}}, status=400)


async def test_a_named_refusal_of_a_url_images_content_rejects_that_url_for_its_format(
        proxy: Harness, upstream: FakeUpstream) -> None:
    refusing = Refusing(upstream, {GONE}, dimensions_refusal)
    for _ in range(2):
        assert (await post(proxy, "/v1/messages", messages(GOOD, GONE), "dim")).status == 200
        assert urls_in(upstream.last.body) == [GOOD]
        assert placeholders(upstream.last.body) == [placeholder(GONE, "rejected")]
    assert refusing.refusals == 1
    [rejected] = [e["data"] for e in await proxy.events("dim") if e["type"] == "attachment/rejected"]
    assert (rejected["attachment_id"], rejected["format"], rejected["name"]) == (url_id(GONE), "anthropic", "cat.png")
    refusing.dead.clear()  # another format's upstream takes it: the rejection is Anthropic's alone
    assert (await post(proxy, "/v1/chat/completions", chat(GONE), "dim")).status == 200
    assert urls_in(upstream.last.body) == [GONE]


# --- answers that are not about a URL ---------------------------------------------------------

def content_refusal(url: str, path: tuple[Any, ...]) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                              "message": "Could not process image"}}, status=400)


def document_download(url: str, path: tuple[Any, ...]) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message":
                              "messages.0.content.0.document.source.url: Unable to download the file. Please verify "
                              "the URL and try again."}}, status=400)


@pytest.mark.parametrize("answer", [content_refusal, document_download], ids=["content", "another-block"])
async def test_an_answer_not_about_a_url_image_is_not_taken_for_one(
        proxy: Harness, upstream: FakeUpstream, answer: Callable[[str, tuple[Any, ...]], web.Response]) -> None:
    pdf = "https://docs.example/report.pdf"
    refusing = Refusing(upstream, {pdf}, answer)
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": pdf}},
        {"type": "image", "source": {"type": "url", "url": GOOD}}, {"type": "text", "text": "look"}]}]}
    before = len(upstream.received)
    resp = await post(proxy, "/v1/messages", body, "n")
    assert resp.status == 400  # the provider's own answer, unchanged
    assert (await resp.json())["error"]["type"] == "invalid_request_error"
    assert len(upstream.received) == before + 1 and refusing.refusals == 1  # no re-send
    assert await proxy.events("n") == []


async def test_a_download_failure_in_a_call_without_url_images_is_left_alone(
        proxy: Harness, upstream: FakeUpstream) -> None:
    data = make_image(color=5)
    inlined = "data:image/png;base64," + base64.b64encode(data).decode()
    async def answer(request: web.Request, doc: Any) -> web.StreamResponse | None:
        return openai_download(GONE, ())
    upstream.script = answer
    resp = await post(proxy, "/v1/chat/completions", chat(inlined), "i")
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_image_url"
    assert upstream.calls == 1  # no re-send
    state = [e for e in await proxy.events("i") if e["type"] in ("attachment/quarantine", "attachment/rejected")]
    assert state == []  # the image the client inlined is not blamed for a download


async def test_with_url_images_off_the_providers_error_goes_back(make_harness: MakeHarness,
                                                                 upstream: FakeUpstream) -> None:
    harness = await make_harness(**{"policy.url_images": False})
    refusing = Refusing(upstream, {GONE}, openai_download)
    resp = await post(harness, "/v1/chat/completions", chat(GONE), "off")
    assert resp.status == 400 and refusing.refusals == 1
    assert await harness.events("off") == []


# --- the official SDKs, unmodified ------------------------------------------------------------

async def test_the_openai_sdk_sees_one_successful_answer_every_turn(proxy: Harness, upstream: FakeUpstream) -> None:
    refusing = Refusing(upstream, {GONE}, openai_download)
    async with openai.AsyncOpenAI(base_url=str(proxy.client.make_url("/v1")), api_key="sk-client",
                                  default_headers={"X-Session-Id": "sdk-o"}) as client:
        for _ in range(2):
            completion = await client.chat.completions.create(model="m", messages=chat(GONE)["messages"])
            assert completion.choices[0].message.content == "Hello from the fake upstream."
    assert refusing.refusals == 1 and placeholders(upstream.last.body) == [placeholder(GONE, "not_found")]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_anthropic_sdk_sees_one_successful_answer(proxy: Harness, upstream: FakeUpstream,
                                                            stream: bool) -> None:
    refusing = Refusing(upstream, {GONE}, anthropic_download)
    async with anthropic.AsyncAnthropic(base_url=str(proxy.client.make_url("")), api_key="sk-ant-client",
                                        default_headers={"X-Session-Id": "sdk-a"}) as client:
        turns = messages(GONE)["messages"]
        if stream:
            async with client.messages.stream(model="m", max_tokens=8, messages=turns) as s:
                assert "".join([t async for t in s.text_stream]) == "tok0 tok1 tok2 tok3 tok4 "
        else:
            message = await client.messages.create(model="m", max_tokens=8, messages=turns)
            assert message.content[0].text == "Hello from the fake upstream."  # type: ignore[union-attr]
    assert refusing.refusals == 1
    blocks = upstream.last.json()["messages"][2]["content"]
    assert blocks[0] == {"type": "text", "text": placeholder(GONE, "not_found")}


async def test_the_google_genai_sdk_sees_one_successful_answer(proxy: Harness, upstream: FakeUpstream) -> None:
    refusing = Refusing(upstream, {GONE}, gemini_cannot_fetch)
    options = types.HttpOptions(base_url=str(proxy.client.make_url("")), api_version="v1beta",
                                headers={"X-Session-Id": "sdk-g"})
    client = genai.Client(api_key="g-key", http_options=options).aio
    contents = [types.Content(role="user", parts=[types.Part.from_text(text="look"),
                                                  types.Part.from_uri(file_uri=GONE, mime_type="image/png")])]
    for _ in range(2):
        response = await client.models.generate_content(model="gemini-2.0-flash", contents=contents)
        assert response.text == "Hello from the fake Gemini upstream."
    assert refusing.refusals == 1
    assert upstream.last.json()["contents"][0]["parts"][1] == {"text": placeholder(GONE, "read_failed")}


# --- bad input: a URL at the proxy itself or at a private address -----------------------------

BAD_URLS = {
    "the-proxy-itself": "http://127.0.0.1:8787/v1/chat/completions",  # the proxy's public URL, no reference
    "the-proxys-listener": "",  # the test server's own address (filled in by the test)
    "loopback": "",  # a listener on 127.0.0.1 that would answer (filled in by the test)
    "link-local": "http://169.254.169.254/latest/meta-data/iam.png",
    "private": "http://10.0.0.7/cat.png",
}


@pytest.mark.parametrize("where", BAD_URLS)
async def test_a_url_at_the_proxy_itself_or_a_private_address_is_quarantined_never_fetched(
        proxy: Harness, upstream: FakeUpstream, aiohttp_server: Any, where: str) -> None:
    hits: list[str] = []

    async def bait(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(body=make_image(color=9), content_type="image/png")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", bait)
    url = {"the-proxys-listener": str(proxy.client.make_url("/admin/x.png")),
           "loopback": str((await aiohttp_server(app)).make_url("/internal/secret.png"))}.get(where) or BAD_URLS[where]
    refusing = Refusing(upstream, {url}, openai_download)  # the provider cannot reach it either
    for _ in range(2):
        resp = await post(proxy, "/v1/chat/completions", chat(url), f"bad-{where}")
        assert resp.status == 200, await resp.text()
    assert refusing.refusals == 1 and urls_in(upstream.last.body) == []
    assert [q["attachment_id"] for q in url_quarantines(await proxy.events(f"bad-{where}"))] == [url_id(url)]
    assert hits == []  # the proxy fetches no URL


async def test_several_dead_urls_in_one_call_are_rescued_one_answer_at_a_time(
        proxy: Harness, upstream: FakeUpstream) -> None:
    urls = [f"http://10.0.0.{i}/cat.png" for i in range(1, 4)]
    refusing = Refusing(upstream, set(urls), openai_download)  # each answer quotes the first it met
    statuses = [(await post(proxy, "/v1/chat/completions", chat(*urls), "many")).status for _ in range(3)]
    assert statuses == [400, 400, 200]  # one re-send per call: a second refusal goes back, never a loop
    assert {q["attachment_id"] for q in url_quarantines(await proxy.events("many"))} == {url_id(u) for u in urls}
    # each call: a refusal recorded, and a re-send refused for the next URL (the last one succeeds)
    assert refusing.refusals == 2 + 2 + 1 and urls_in(upstream.last.body) == []


async def test_a_malformed_reference_under_the_proxys_own_url_is_the_clients_error(proxy: Harness) -> None:
    own = "http://127.0.0.1:8787/v1/attachments/sha256:nothex"  # under the (default) public URL: a reference
    resp = await post(proxy, "/v1/chat/completions", chat(own), "bad-ref")
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "INVALID_ATTACHMENT_REF"


# --- sessions nobody named, and what the log keeps ----------------------------------------------

async def test_a_call_that_names_no_session_is_rescued_in_its_derived_session(
        proxy: Harness, upstream: FakeUpstream) -> None:
    refusing = Refusing(upstream, {GONE}, openai_download)
    assert (await post(proxy, "/v1/chat/completions", chat(GONE), None)).status == 200
    assert (await post(proxy, "/v1/chat/completions", chat(GONE), None)).status == 200  # the same derived session
    assert refusing.refusals == 1 and placeholders(upstream.last.body) == [placeholder(GONE, "not_found")]
    listed = await (await proxy.client.get("/admin/sessions", headers=ADMIN)).json()
    [derived] = [s["session"] for s in listed["sessions"]]
    assert derived.startswith("derived:")


async def test_without_any_session_the_providers_error_goes_back(make_harness: MakeHarness,
                                                                 upstream: FakeUpstream) -> None:
    harness = await make_harness(**{"server.client_sessions": False})
    refusing = Refusing(upstream, {GONE}, openai_download)
    resp = await post(harness, "/v1/chat/completions", chat(GONE), None)
    assert resp.status == 400 and refusing.refusals == 1


async def test_the_log_and_the_log_lines_keep_no_url(make_harness: MakeHarness, upstream: FakeUpstream) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    Refusing(upstream, {GONE}, openai_download)
    with capture_logs() as lines:
        assert (await post(harness, "/v1/chat/completions", chat(GONE), "quiet")).status == 200
        assert (await post(harness, "/v1/chat/completions", chat(GONE), "quiet")).status == 200
    await harness.app[SERVICES].recording.drain()
    logged = msgspec.json.encode(await harness.events("quiet")).decode()
    assert "attachment/quarantine" in logged and "request/recorded" in logged
    for text in (logged, repr(lines)):
        assert SECRET not in text and "bucket.s3.amazonaws.com" not in text
    fields = [line for line in lines if line.get("unfetched")]
    assert [(f["unfetched"], f["url_suspects"]) for f in fields] == [("resent", 1)]
    metrics = await (await harness.client.get("/metrics")).text()
    assert 'projectionist_unfetched_images_total{outcome="resent"} 1.0' in metrics


async def test_replay_rebuilds_both_calls_byte_for_byte(make_harness: MakeHarness, upstream: FakeUpstream) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    Refusing(upstream, {GONE}, openai_download)
    before = len(upstream.received)
    resp = await post(harness, "/v1/chat/completions", chat(GOOD, GONE), "replay")
    assert resp.status == 200
    refused, resent = upstream.received[before:]
    request_id = resp.headers["x-projectionist-request-id"]
    services = harness.app[SERVICES]
    await services.recording.drain()
    calls = {e["data"]["request_id"]: e for e in await harness.events("replay") if e["type"] == "request/recorded"}
    for rid, sent in ((request_id, refused), (f"{request_id}.2", resent)):
        rebuilt = await rebuild(services.log, services.store, "replay", calls[rid]["seq"])
        assert rebuilt.matches and rebuilt.body == sent.body, rid
    refs = calls[f"{request_id}.2"]["data"]["refs"]
    assert refs == [{"path": "/messages/0/content/2", "attachment_id": url_id(GONE), "outcome": "placeholder",
                     "failure": "not_found"}]
