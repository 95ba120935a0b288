"""Images a client inlines itself (base64) have an identity: the sha256 of their bytes.

A ``data:`` URL (Chat, Responses), an Anthropic ``base64`` source (tool results too) or a Gemini
``inline_data`` / ``inlineData`` part is known by the id an ``attachment:`` reference to the same
bytes would have. When the provider refuses one, the proxy records ``attachment/rejected`` for
that upstream format, re-sends the call once with the placeholder in its place, and every later
request of the session that still carries those bytes gets the placeholder before the provider
is called. A request that names no session gets its client's own, or one derived from its
opening. Each test drives the proxy over HTTP in front of the fake upstream (``tests.refusing``
refuses chosen bytes in each provider's real error shape) and reads the upstream's side, the
session log, ``/metrics`` and the request log line. The tests on the session log run on both
backends (SQLite + filesystem, PostgreSQL + SeaweedFS); the others on the embedded one.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import os
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import msgspec
import pytest
from aiohttp import ClientResponse, web
from structlog.testing import capture_logs

from projectionist.proxy.config import Config
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.call.replay import rebuild
from tests.calls import recorded_calls
from tests.backends import BACKENDS
from tests.conftest import ADMIN, Harness
from tests.fakes import FakeUpstream, Received
from tests.imaging import dimensions, make_image, noise_image, ref_id
from tests.proxy.observe.test_metrics import scrape
from tests.refusing import OPENAI_MESSAGE, Script, inlined
from tests.system.refusals.hostile import chat_body

MakeHarness = Callable[..., Awaitable[Harness]]
Json = dict[str, Any]

#: The tests that are about the session log run on both backends.
on_both = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
RECORDING: Json = {"record.mode": "metadata"}
MiB = 1024 * 1024
REJECTIONS = "projectionist_image_rejections_total"


# --- bodies and readings -----------------------------------------------------------------------

def png(color: int, width: int = 4, height: int = 3) -> bytes:
    return make_image(width, height, color=color)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"


def placeholder(aid: str) -> str:
    return f"[image unavailable: rejected ({aid[:15]})]"


def responses_body(*urls: str) -> Json:
    parts: list[Json] = [{"type": "input_text", "text": "look"}]
    parts += [{"type": "input_image", "image_url": u} for u in urls]
    return {"model": "m", "input": [{"role": "user", "content": parts}]}


def anthropic_block(data: bytes, media_type: str = "image/png") -> Json:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64(data)}}


def anthropic_body(*blocks: Json, system: str | None = None) -> Json:
    body: Json = {"model": "m", "max_tokens": 10,
                  "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, *blocks]}]}
    if system is not None:
        body["system"] = system
    return body


def anthropic_tool_result_body(data: bytes) -> Json:
    """A screenshot coming back from a tool, as agents send it (the image is in the third message)."""
    return {"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "take a screenshot"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [anthropic_block(data)]}]}]}


def gemini_body(data: bytes, camel: bool = False) -> Json:
    part = ({"inlineData": {"mimeType": "image/png", "data": b64(data)}} if camel
            else {"inline_data": {"mime_type": "image/png", "data": b64(data)}})
    return {"contents": [{"role": "user", "parts": [{"text": "look"}, part]}]}


def chat_bare_url_body(data: bytes) -> Json:
    """``image_url`` as a bare string, as some clients send it."""
    body = chat_body()
    body["messages"][0]["content"].append({"type": "image_url", "image_url": data_url(data)})
    return body


def screenshot_body(data: bytes) -> Json:
    """A computer-use screenshot coming back in a Responses ``computer_call_output``."""
    return {"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "computer_call", "call_id": "c1", "action": {"type": "screenshot"}},
        {"type": "computer_call_output", "call_id": "c1",
         "output": {"type": "computer_screenshot", "image_url": data_url(data)}}]}


def prompt_variables_body(data: bytes) -> Json:
    """A Responses prompt template whose variable is an image."""
    return {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "look"}]}],
            "prompt": {"id": "pmpt_1", "variables": {"shot": {"type": "input_image", "image_url": data_url(data)}}}}


def gemini_two(first: bytes, second: bytes) -> Json:
    return {"contents": [{"role": "user", "parts": [{"text": "look"}] + [
        {"inline_data": {"mime_type": "image/png", "data": b64(d)}} for d in (first, second)]}]}


def next_turn(shape: str, body: Json) -> Json:
    """``body`` one turn later: the assistant's answer and a new user message appended (the
    history, the image with it, is re-sent as agents do)."""
    later: Json = json.loads(json.dumps(body))
    if shape.startswith("chat"):
        later["messages"] += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and now?"}]
    elif shape.startswith("responses"):
        later["input"] += [{"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                           {"role": "user", "content": [{"type": "input_text", "text": "and now?"}]}]
    elif shape.startswith("gemini"):
        later["contents"] += [{"role": "model", "parts": [{"text": "ok"}]}, {"role": "user", "parts": [{"text": "and now?"}]}]
    else:
        later["messages"] += [{"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
                              {"role": "user", "content": [{"type": "text", "text": "and now?"}]}]
    return later


#: Each wire format's request carrying one inlined image: its route, its body, its upstream format.
SHAPES: dict[str, tuple[str, Callable[[bytes], Json], str]] = {
    "chat": ("/v1/chat/completions", lambda d: chat_body(inline=[data_url(d)]), "openai"),
    "chat-bare-url": ("/v1/chat/completions", chat_bare_url_body, "openai"),
    "responses": ("/v1/responses", lambda d: responses_body(data_url(d)), "openai"),
    "responses-screenshot": ("/v1/responses", screenshot_body, "openai"),
    "responses-prompt-variables": ("/v1/responses", prompt_variables_body, "openai"),
    "anthropic": ("/v1/messages", lambda d: anthropic_body(anthropic_block(d)), "anthropic"),
    "anthropic-tool-result": ("/v1/messages", anthropic_tool_result_body, "anthropic"),
    "gemini": ("/v1beta/models/m:generateContent", gemini_body, "gemini"),
    "gemini-camel": ("/v1beta/models/m:generateContent", lambda d: gemini_body(d, camel=True), "gemini"),
}


def encoded(body: Json) -> bytes:
    return msgspec.json.encode(body)


async def post(harness: Harness, path: str, body: Json | bytes, session: str | None = None,
               headers: dict[str, str] | None = None) -> ClientResponse:
    """``body`` as exact bytes (what the upstream must see byte for byte when nothing changes)."""
    sent = body if isinstance(body, bytes) else encoded(body)
    all_headers = {"Content-Type": "application/json", **({"X-Session-Id": session} if session else {}), **(headers or {})}
    return await harness.client.post(path, data=sent, headers=all_headers)


def rejected(events: list[Json]) -> list[tuple[str, str]]:
    """(attachment id, format) of every ``attachment/rejected`` event, in log order."""
    return [(e["data"]["attachment_id"], e["data"]["format"]) for e in events if e["type"] == "attachment/rejected"]


def attachment_events(events: list[Json]) -> list[Json]:
    return [e for e in events if e["type"].startswith("attachment/")]


def ids_in(received: Received) -> list[str]:
    """The ids of the images an upstream call carried inline, in document order."""
    return [aid for _, aid in inlined(received.json())]


def aid_absent(received: Received, data: bytes) -> bool:
    """Whether an upstream call carried neither the bytes nor their base64."""
    return b64(data).encode() not in received.body and ref_id(data) not in ids_in(received)


async def sessions_listed(harness: Harness) -> list[str]:
    """The conversations the log holds (not the tenant's refusals, ``~refusals``, nor its
    conversations index, ``~conversations``, listed too)."""
    resp = await harness.client.get("/admin/sessions", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    return [s["session"] for s in (await resp.json())["sessions"]
            if not s["session"].startswith(("~refusals", "~conversations"))]


def request_lines(logs: Sequence[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry.get("event") == "request"]


def openai_refusal(param: str | None) -> bytes:
    return encoded({"error": {"message": OPENAI_MESSAGE, "type": "invalid_request_error", "param": param,
                              "code": "invalid_image_format"}})


def refuse_while(aid: str, answer: bytes, *, compress: bool = False) -> Script:
    """A script: every call that still inlines the bytes of ``aid`` gets ``answer`` (a 400),
    gzip-compressed when ``compress`` and the call accepts gzip."""

    async def script(request: web.Request, doc: Any) -> web.StreamResponse | None:
        if doc is None or aid not in {found for _, found in inlined(doc)}:
            return None
        if compress and "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=gzip.compress(answer), status=400,
                                headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        return web.Response(body=answer, status=400, content_type="application/json")

    return script


async def admitted_in_time(harness: Harness, aid: str, seconds: float = 5.0) -> ClientResponse:
    """``GET /v1/attachments/<aid>`` once the background admission of refused bytes ran (polled)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        resp = await harness.client.get(f"/v1/attachments/{aid}")
        if resp.status == 200 or loop.time() > deadline:
            return resp
        await asyncio.sleep(0.02)


async def background_settled(harness: Harness, seconds: float = 5.0) -> None:
    """Wait (bounded) until the proxy's background work (admissions of refused bytes) has ended."""
    tasks: set[asyncio.Task[Any]] = getattr(harness.app[SERVICES], "_tasks", set())
    if tasks:
        await asyncio.wait_for(asyncio.gather(*list(tasks), return_exceptions=True), seconds)


@pytest.fixture
def with_gemini(upstream: FakeUpstream) -> Json:
    """Config overrides that add a Gemini upstream on the fake."""
    return {"upstreams.gemini": {"format": "gemini", "url": upstream.url}}


# --- 1. bad input ------------------------------------------------------------------------------------

async def test_malformed_base64_passes_through_byte_for_byte_and_records_nothing(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    url = "data:image/png;base64," + "@@not*base64!!" * 8
    raw = encoded(chat_body(inline=[url]))
    resp = await post(harness, "/v1/chat/completions", raw, session="m64")
    assert resp.status == 200, await resp.text()
    assert harness.upstream.last.body == raw
    await harness.app[SERVICES].recording.drain()
    assert attachment_events(await harness.events("m64")) == []
    # and without a session: no identity, so nothing derived either
    resp = await post(harness, "/v1/chat/completions", raw)
    assert resp.status == 200 and harness.upstream.last.body == raw
    assert await sessions_listed(harness) == ["m64"]


async def test_an_unnamed_refusal_next_to_malformed_base64_quarantines_no_healthy_image(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    healthy = png(1)
    malformed = "data:image/png;base64," + "not base64 at all " * 4
    answer = openai_refusal(None)

    async def refuse_all(request: web.Request, doc: Any) -> web.StreamResponse:
        return web.Response(body=answer, status=400, content_type="application/json")

    harness.upstream.script = refuse_all
    raw = encoded(chat_body(inline=[malformed, data_url(healthy)]))
    resp = await post(harness, "/v1/chat/completions", raw, session="mix")
    assert resp.status == 400 and await resp.read() == answer  # the provider's error, as it came
    assert harness.upstream.calls == 1 and harness.upstream.last.body == raw  # no re-send
    assert attachment_events(await harness.events("mix")) == []


async def test_a_lying_media_type_keeps_the_identity_of_the_bytes(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(2)
    aid = ref_id(data)
    raw = encoded(chat_body(inline=[data_url(data, "image/jpeg")]))  # PNG bytes labelled JPEG
    assert (await post(harness, "/v1/chat/completions", raw, session="lie")).status == 200
    # fitted: the same bytes go under the type they are, and nothing else changes
    assert harness.upstream.last.body == encoded(chat_body(inline=[data_url(data, "image/png")]))
    harness.upstream.refused[aid] = False
    # another session, where the upstream accepted only the other image before
    assert (await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(png(3))]), session="lie2")).status == 200
    other = encoded(chat_body(inline=[data_url(png(3)), data_url(data, "image/jpeg")]))
    resp = await post(harness, "/v1/chat/completions", other, session="lie2")
    assert resp.status == 200, await resp.text()
    assert rejected(await harness.events("lie2")) == [(aid, "openai")]
    assert ids_in(harness.upstream.last) == [ref_id(png(3))]
    assert placeholder(aid) in harness.upstream.last.body.decode()
    served = await admitted_in_time(harness, aid)  # admitted as what its bytes are
    assert served.status == 200 and await served.read() == data
    assert served.headers["Content-Type"].startswith("image/png")


def anthropic_refusal(message: str) -> bytes:
    return encoded({"type": "error", "error": {"type": "invalid_request_error", "message": message},
                    "request_id": "req_fake"})


async def test_anthropic_refusing_a_lying_media_type_quarantines_the_bytes(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(7)
    aid = ref_id(data)
    harness.upstream.script = refuse_while(aid, anthropic_refusal(
        "messages.0.content.1.image.source.base64.data: The image was specified using the image/jpeg media type, "
        "but the image appears to be image/png"))
    resp = await post(harness, "/v1/messages", anthropic_body(anthropic_block(data, "image/jpeg")), session="lie-a")
    assert resp.status == 200, await resp.text()
    assert rejected(await harness.events("lie-a")) == [(aid, "anthropic")]
    assert harness.upstream.last.json()["messages"][0]["content"][1] == {"type": "text", "text": placeholder(aid)}
    # identity is by bytes: the same bytes under their true label are held too
    before = len(harness.upstream.received)
    resp = await post(harness, "/v1/messages", anthropic_body(anthropic_block(data, "image/png")), session="lie-a")
    assert resp.status == 200
    [sent] = harness.upstream.received[before:]
    assert aid_absent(sent, data) and placeholder(aid) in sent.body.decode()


async def test_an_inlined_screenshot_over_5_mb_in_a_tool_result_is_rescued(make_harness: MakeHarness) -> None:
    """An upstream of this format that takes 5 MB per image (Bedrock, Vertex AI: less than the API's
    documented 10 MB): its refusal teaches the limit, and the screenshot goes as a variant under
    it, on this call and every later one, rather than being lost to a placeholder."""
    harness = await make_harness(**RECORDING)
    data = noise_image(1500, 1300)  # about 5.6 MiB of PNG, 7.5 MiB of base64
    aid = ref_id(data)
    size = len(b64(data))

    async def five_mb(request: web.Request, doc: Any) -> web.StreamResponse | None:
        sent = [aid for _, aid in inlined(doc)]
        over = [b for b in sent if b == aid]
        if over:
            message = (f"messages.2.content.0.tool_result.content.0.image.source.base64: image exceeds 5 MB maximum: "
                       f"{size} bytes > 5242880 bytes")
            return web.Response(body=anthropic_refusal(message), status=400, content_type="application/json")
        return None

    harness.upstream.script = five_mb
    body = anthropic_tool_result_body(data)
    resp = await post(harness, "/v1/messages", body, session="five")
    assert resp.status == 200, await resp.text()
    events = await harness.events("five")
    assert rejected(events) == []  # the image itself is not refused: the limit is learnt
    [rule] = [e["data"] for e in events if e["type"] == "upstream/learnt"]
    assert rule == {"upstream": "anthropic", "model": "m", "rule": "image_bytes", "bytes": 5242880 * 3 // 4,
                    "message_digest": rule["message_digest"]}
    source = harness.upstream.last.json()["messages"][2]["content"][0]["content"][0]["source"]
    variant = base64.b64decode(source["data"])
    assert len(source["data"]) <= 5242880 and variant != data and dimensions(variant)[0] < 1500
    assert [e["data"]["attachment_id"] for e in events if e["type"] == "attachment/variant"] == [aid]
    before = len(harness.upstream.received)
    assert (await post(harness, "/v1/messages", next_turn("anthropic", body), session="five")).status == 200
    [sent] = harness.upstream.received[before:]  # the next turn: one call, the same variant
    assert sent.json()["messages"][2]["content"][0]["content"][0]["source"] == source


def big_blob() -> bytes:
    """~20 MB behind a PNG signature: an identity by bytes needs no decodable image."""
    return b"\x89PNG\r\n\x1a\n" + os.urandom(20 * MiB)


@pytest.mark.parametrize("route", ["chat", "anthropic"])
async def test_an_inlined_image_over_the_body_limit_is_a_413_in_the_clients_shape(make_harness: MakeHarness,
                                                                                route: str) -> None:
    harness = await make_harness(**RECORDING, **{"server.client_max_size": 16 * MiB})
    path, shape, _ = SHAPES[route]
    resp = await post(harness, path, shape(big_blob()), session="big")
    assert resp.status == 413, await resp.text()
    assert resp.headers["x-projectionist-error-code"] == "PAYLOAD_TOO_LARGE"
    body = await resp.json()
    if route == "anthropic":
        assert body["type"] == "error" and body["error"]["details"]["error_code"] == "PAYLOAD_TOO_LARGE"
    else:
        assert body["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert harness.upstream.received == []
    assert await harness.events("big") == []


async def test_a_gzip_body_whose_inlined_image_inflates_past_the_limit_is_a_413(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING, **{"server.client_max_size": 16 * MiB})
    image = b"\x89PNG\r\n\x1a\n" + bytes(20 * MiB)  # compresses to a few tens of kB
    packed = gzip.compress(encoded(chat_body(inline=[data_url(image)])))
    assert len(packed) < MiB
    resp = await post(harness, "/v1/chat/completions", packed, session="bomb", headers={"Content-Encoding": "gzip"})
    assert resp.status == 413, await resp.text()
    assert (await resp.json())["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert harness.upstream.received == []


async def test_an_inlined_image_under_a_raised_body_limit_passes(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING, **{"server.client_max_size": 48 * MiB})
    blob = big_blob()
    raw = encoded(chat_body(inline=[data_url(blob)]))
    assert len(raw) > 26 * MiB
    resp = await post(harness, "/v1/chat/completions", raw, session="big-ok")
    assert resp.status == 200, await resp.text()
    # read whole, and its bytes are no image: its placeholder goes, and no refused round trip
    assert len(harness.upstream.received) == 1 and len(harness.upstream.last.body) < 4096
    assert "[image unavailable: corrupt (sha256:" in harness.upstream.last.body.decode()
    [event] = attachment_events(await harness.events("big-ok"))
    assert event["data"] == {"attachment_id": ref_id(blob), "failure": "corrupt", "retryable": False, "inline": True}


def many_images(count: int) -> list[bytes]:
    return [png(i % 256, width=4 + i // 256) for i in range(count)]


async def test_500_inlined_images_pass_and_a_refusal_by_place_quarantines_exactly_one(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    images = many_images(500)
    assert len({ref_id(i) for i in images}) == 500
    raw = encoded(chat_body(inline=[data_url(i) for i in images]))
    assert (await post(harness, "/v1/chat/completions", raw, session="many")).status == 200
    assert harness.upstream.last.body == raw
    target = 317  # content[0] is the text part
    bad = ref_id(images[target])
    harness.upstream.script = refuse_while(bad, openai_refusal(f"messages[0].content[{target + 1}].image_url"))
    before = len(harness.upstream.received)
    resp = await post(harness, "/v1/chat/completions", raw, session="many2")
    assert resp.status == 200, await resp.text()
    refused, resent = harness.upstream.received[before:]
    assert rejected(await harness.events("many2")) == [(bad, "openai")]
    assert ids_in(resent) == [ref_id(i) for n, i in enumerate(images) if n != target]
    assert resent.json()["messages"][0]["content"][target + 1] == {"type": "text", "text": placeholder(bad)}
    assert ids_in(refused) == [ref_id(i) for i in images]


@on_both
async def test_the_same_bytes_under_two_media_types_are_one_image(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(4)
    aid = ref_id(data)
    harness.upstream.refused[aid] = False
    both = chat_body(inline=[data_url(data, "image/png"), data_url(data, "image/webp")])
    resp = await post(harness, "/v1/chat/completions", both, session="two-types")
    assert resp.status == 200, await resp.text()
    assert rejected(await harness.events("two-types")) == [(aid, "openai")]
    parts = harness.upstream.last.json()["messages"][0]["content"]
    assert parts[1:] == [{"type": "text", "text": placeholder(aid)}] * 2
    # across requests: refused under one label, held under another, before the provider is called
    assert (await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]), session="across")).status == 200
    before = len(harness.upstream.received)
    resp = await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data, "image/gif")]), session="across")
    assert resp.status == 200
    [sent] = harness.upstream.received[before:]
    assert ids_in(sent) == [] and placeholder(aid) in sent.body.decode()
    assert rejected(await harness.events("across")) == [(aid, "openai")]


async def test_a_refusal_naming_a_text_part_goes_back_unchanged_openai(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(5)
    answer = openai_refusal("messages[0].content[0].image_url")  # content[0] is the text "look"
    harness.upstream.script = refuse_while(ref_id(data), answer)
    resp = await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]), session="txt")
    assert resp.status == 400 and await resp.read() == answer
    assert harness.upstream.calls == 1
    assert attachment_events(await harness.events("txt")) == []


async def test_a_refusal_naming_a_text_block_goes_back_unchanged_anthropic(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(6)
    answer = encoded({"type": "error", "error": {"type": "invalid_request_error",
                                                 "message": "messages.0.content.0.image.source.base64: Could not process image"}})
    harness.upstream.script = refuse_while(ref_id(data), answer)
    resp = await post(harness, "/v1/messages", anthropic_body(anthropic_block(data)), session="txt-a")
    assert resp.status == 400 and await resp.read() == answer
    assert harness.upstream.calls == 1
    assert attachment_events(await harness.events("txt-a")) == []


GEMINI_NAMED = "Invalid value at 'contents[0].parts[2].inline_data.data' (TYPE_BYTES), Base64 decoding failed"


@pytest.mark.parametrize("shape", ["chat", "responses", "anthropic", "gemini"])
async def test_a_refusal_naming_the_place_quarantines_that_image_only(make_harness: MakeHarness, with_gemini: Json,
                                                                     shape: str) -> None:
    harness = await make_harness(**RECORDING, **with_gemini)
    first, second = png(30), png(31)
    bad = ref_id(second)
    if shape == "chat":
        path, body = "/v1/chat/completions", chat_body(inline=[data_url(first), data_url(second)])
        harness.upstream.script = refuse_while(bad, openai_refusal("messages[0].content[2].image_url"))
    elif shape == "responses":
        path, body = "/v1/responses", responses_body(data_url(first), data_url(second))
        harness.upstream.script = refuse_while(bad, openai_refusal("input[0].content[2].image_url"))
    elif shape == "anthropic":
        path, body = "/v1/messages", anthropic_body(anthropic_block(first), anthropic_block(second))
        harness.upstream.refused[bad] = True  # "messages.0.content.2.image.source.base64: ..."
    else:
        path, body = "/v1beta/models/m:generateContent", gemini_two(first, second)
        harness.upstream.script = refuse_while(bad, encoded({"error": {"code": 400, "message": GEMINI_NAMED,
                                                                       "status": "INVALID_ARGUMENT"}}))
    before = len(harness.upstream.received)
    resp = await post(harness, path, body, session=f"named-{shape}")
    assert resp.status == 200, await resp.text()
    refused, resent = harness.upstream.received[before:]
    assert ids_in(refused) == [ref_id(first), bad]
    assert ids_in(resent) == [ref_id(first)]  # both new to the session: the place decides
    assert placeholder(bad) in resent.body.decode()
    assert rejected(await harness.events(f"named-{shape}")) == [(bad, SHAPES[shape][2])]


# --- 2. later requests ----------------------------------------------------------------------------

@pytest.mark.parametrize("named", [True, False], ids=["x-session-id", "derived"])
@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_refused_inlined_image_is_a_placeholder_on_every_later_request(
        make_harness: MakeHarness, with_gemini: Json, shape: str, named: bool) -> None:
    harness = await make_harness(**RECORDING, **with_gemini)
    path, body_of, upstream_format = SHAPES[shape]
    data = png(40 + list(SHAPES).index(shape))
    aid = ref_id(data)
    session = f"later-{shape}" if named else None
    harness.upstream.refused[aid] = shape == "anthropic-tool-result"  # that one names its place
    first = body_of(data)
    with capture_logs() as logs:
        resp = await post(harness, path, first, session=session)
    assert resp.status == 200, await resp.text()
    assert harness.upstream.refusals == 1
    [line] = request_lines(logs)
    sid = line["session"]
    if named:
        assert sid == session
    else:
        assert sid.startswith("derived:") and line["session_source"] == "derived"
    assert rejected(await harness.events(sid)) == [(aid, upstream_format)]
    # the next turn re-sends the history: one call, the placeholder, never the bytes
    before = len(harness.upstream.received)
    resp = await post(harness, path, next_turn(shape, first), session=session)
    assert resp.status == 200, await resp.text()
    [sent] = harness.upstream.received[before:]
    assert b64(data).encode() not in sent.body
    assert placeholder(aid) in sent.body.decode()
    assert aid not in ids_in(sent)  # (a screenshot slot holds a blank image instead)
    assert harness.upstream.refusals == 1
    assert len(rejected(await harness.events(sid))) == 1


def two_screenshots(first: bytes, second: bytes) -> Json:
    body = screenshot_body(first)
    body["input"] += [{"type": "computer_call", "call_id": "c2", "action": {"type": "screenshot"}},
                      {"type": "computer_call_output", "call_id": "c2",
                       "output": {"type": "computer_screenshot", "image_url": data_url(second)}}]
    return body


async def test_a_second_refused_screenshot_of_a_session_is_rescued_too(make_harness: MakeHarness) -> None:
    """A computer-use session whose first screenshot was refused: the proxy sends a blank image in
    that slot from then on. That blank is the proxy's own, not an image of unknown origin, so the
    next refused screenshot must still be attributed and rescued, not go back as a 400 on every turn."""
    harness = await make_harness(**RECORDING)
    first, second = png(63), png(64)
    harness.upstream.refused[ref_id(first)] = False
    assert (await post(harness, "/v1/responses", screenshot_body(first), session="cu")).status == 200
    harness.upstream.refused[ref_id(second)] = False
    with capture_logs() as logs:
        resp = await post(harness, "/v1/responses", two_screenshots(first, second), session="cu")
    [line] = request_lines(logs)
    assert resp.status == 200, (f"the second refused screenshot went back as a {resp.status} "
                                f"(rejection={line.get('rejection')!r}): body.foreign() counts the blank "
                                "image the proxy put in the first screenshot's slot as an image without identity")
    assert rejected(await harness.events("cu")) == [(ref_id(first), "openai"), (ref_id(second), "openai")]


@on_both
async def test_an_inlined_image_the_upstream_accepted_before_is_never_quarantined(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    seen, new = png(61), png(62)
    assert (await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(seen)]), session="acc")).status == 200
    harness.upstream.refused[ref_id(new)] = False
    before = len(harness.upstream.received)
    resp = await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(seen), data_url(new)]), session="acc")
    assert resp.status == 200, await resp.text()
    refused, resent = harness.upstream.received[before:]
    assert rejected(await harness.events("acc")) == [(ref_id(new), "openai")]  # only the new one is a suspect
    assert ids_in(resent) == [ref_id(seen)]
    # the upstream now refuses the image it took before: not that image's fault, the error goes back
    harness.upstream.refused[ref_id(seen)] = False
    before = len(harness.upstream.received)
    resp = await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(seen)]), session="acc")
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_image_format"
    assert len(harness.upstream.received) == before + 1
    assert rejected(await harness.events("acc")) == [(ref_id(new), "openai")]


async def test_base64_with_json_escaped_slashes_has_the_same_identity(make_harness: MakeHarness) -> None:
    """Some JSON encoders (PHP's, some Java ones) write every ``/`` as ``\\/``, base64's too."""
    harness = await make_harness(**RECORDING)
    data = next(png(c) for c in range(66, 200) if "/" in b64(png(c)))
    aid = ref_id(data)
    raw = encoded(chat_body(inline=[data_url(data)])).replace(b"/", b"\\/")
    assert b"\\/" in raw
    harness.upstream.refused[aid] = False
    assert (await post(harness, "/v1/chat/completions", raw, session="esc")).status == 200
    assert rejected(await harness.events("esc")) == [(aid, "openai")]
    before = len(harness.upstream.received)
    assert (await post(harness, "/v1/chat/completions", raw, session="esc")).status == 200
    [sent] = harness.upstream.received[before:]
    assert aid not in ids_in(sent) and placeholder(aid) in sent.json()["messages"][0]["content"][1]["text"]


async def test_a_rejection_holds_for_its_upstream_format_only(make_harness: MakeHarness, with_gemini: Json) -> None:
    harness = await make_harness(**RECORDING, **with_gemini)
    data = png(60)
    aid = ref_id(data)
    harness.upstream.refused[aid] = False
    assert (await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]), session="fmt")).status == 200
    assert rejected(await harness.events("fmt")) == [(aid, "openai")]
    harness.upstream.refused.clear()
    for path, body in (("/v1/messages", anthropic_body(anthropic_block(data))),
                       ("/v1beta/models/m:generateContent", gemini_body(data))):
        resp = await post(harness, path, body, session="fmt")
        assert resp.status == 200, await resp.text()
        assert ids_in(harness.upstream.last) == [aid], path  # another provider still gets the image
    # while the format that refused it (Responses speaks it too) still gets the placeholder
    assert (await post(harness, "/v1/responses", responses_body(data_url(data)), session="fmt")).status == 200
    assert ids_in(harness.upstream.last) == []
    assert harness.upstream.last.json()["input"][0]["content"][1] == {"type": "input_text", "text": placeholder(aid)}


@pytest.mark.parametrize("shape", ["chat", "anthropic"])
async def test_a_streamed_call_is_rescued_before_its_first_byte(make_harness: MakeHarness, shape: str) -> None:
    harness = await make_harness(**RECORDING)
    path, body_of, upstream_format = SHAPES[shape]
    data = png(65)
    harness.upstream.refused[ref_id(data)] = False
    resp = await post(harness, path, {**body_of(data), "stream": True}, session=f"sse-{shape}")
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    text = await resp.text()
    assert "tok1" in text and "error" not in text
    assert rejected(await harness.events(f"sse-{shape}")) == [(ref_id(data), upstream_format)]
    assert aid_absent(harness.upstream.last, data)


# --- 3. restart, fork, replay -------------------------------------------------------------------

@on_both
async def test_restart_and_fork_send_the_same_bytes(make_harness: MakeHarness, make_config: Callable[..., Config]) -> None:
    harness = await make_harness(make_config(**RECORDING))
    data, good = png(70), png(71)
    harness.upstream.refused[ref_id(data)] = False
    body = chat_body(inline=[data_url(good), data_url(data)])
    with capture_logs() as logs:
        assert (await post(harness, "/v1/chat/completions", body)).status == 200
    [line] = request_lines(logs)
    derived = line["session"]
    assert derived.startswith("derived:")
    resent = harness.upstream.last.body
    assert ids_in(harness.upstream.last) == []  # an unnamed refusal: both were new to the session
    both = sorted([(ref_id(good), "openai"), (ref_id(data), "openai")])
    assert sorted(rejected(await harness.events(derived))) == both
    harness.upstream.refused.clear()  # the upstream would take it now: the log decides
    restarted = await make_harness(make_config(**RECORDING))  # a second process on the same data
    with capture_logs() as logs:
        assert (await post(restarted, "/v1/chat/completions", body)).status == 200
    assert [line["session"] for line in request_lines(logs)] == [derived]  # the same derived session
    assert restarted.upstream.last.body == resent
    resp = await restarted.client.post(f"/admin/sessions/{derived}/fork", json={"new_session_id": "child"},
                                       headers=ADMIN)
    assert resp.status == 201, await resp.text()
    assert (await post(restarted, "/v1/chat/completions", body, session="child")).status == 200
    assert restarted.upstream.last.body == resent
    assert sorted(rejected(await restarted.events("child"))) == both


async def three_recorded_calls(harness: Harness, session: str) -> tuple[list[tuple[str, Received]], bytes, bytes]:
    """A refused call, its re-send and a later turn of ``session`` (each id with what the upstream
    received), and the two inbound bodies."""
    data, good = png(72), png(73)
    harness.upstream.refused[ref_id(data)] = False
    first = encoded(chat_body(inline=[data_url(good), data_url(data)]))
    second = encoded(next_turn("chat", chat_body(inline=[data_url(good), data_url(data)])))
    before = len(harness.upstream.received)
    resp = await post(harness, "/v1/chat/completions", first, session=session)
    assert resp.status == 200
    refused, resent = harness.upstream.received[before:]
    later = await post(harness, "/v1/chat/completions", second, session=session)
    assert later.status == 200
    request_id, later_id = resp.headers["x-projectionist-request-id"], later.headers["x-projectionist-request-id"]
    await harness.app[SERVICES].recording.drain()
    calls = [(request_id, refused), (f"{request_id}.2", resent), (later_id, harness.upstream.last)]
    return calls, first, second


async def test_replay_in_full_mode_rebuilds_the_refused_the_re_sent_and_the_later_call(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    calls, _, _ = await three_recorded_calls(harness, "rp")
    services = harness.app[SERVICES]
    events = await harness.events("rp")
    records = {e["data"]["request_id"]: e for e in events if e["type"] == "request/recorded"}
    answers = {r["data"]["request_id"]: outcome and outcome["status"] for r, outcome in recorded_calls(events)}
    assert answers == {calls[0][0]: 400, calls[1][0]: 200, calls[2][0]: 200}
    for rid, sent in calls:
        blob = records[rid]["data"]["inbound_blob"]
        assert await services.store.get_blob(blob) is not None, (
            f"{rid}: the record names inbound_blob {blob[:15]}, which the store does not hold (the blob is "
            "stored under the sha256 of the raw body; the record names the body's spliced digest)")
        rebuilt = await rebuild(services.log, services.store, "rp", records[rid]["seq"])
        assert rebuilt.matches, (rid, rebuilt.first_difference, rebuilt.reason)
        assert rebuilt.body == sent.body, rid


async def test_replay_with_the_inbound_body_rebuilds_each_call_byte_for_byte(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    calls, first, second = await three_recorded_calls(harness, "rpm")
    services = harness.app[SERVICES]
    records = {e["data"]["request_id"]: e for e in await harness.events("rpm") if e["type"] == "request/recorded"}
    for (rid, sent), inbound in zip(calls, (first, first, second)):
        rebuilt = await rebuild(services.log, services.store, "rpm", records[rid]["seq"], inbound)
        assert rebuilt.matches, (rid, rebuilt.first_difference, rebuilt.reason)
        assert rebuilt.body == sent.body, rid


# --- 4. recovery --------------------------------------------------------------------------------

@on_both
async def test_a_rejected_inlined_png_can_be_recovered(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(80)
    aid = ref_id(data)
    harness.upstream.refused[aid] = False
    assert (await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]), session="rec")).status == 200
    served = await admitted_in_time(harness, aid)  # the background admission ran
    assert served.status == 200, await served.text()
    assert await served.read() == data
    harness.upstream.refused.clear()
    resp = await harness.client.post(f"/admin/sessions/rec/attachments/{aid}/recover", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["recovered"] is True
    events = await harness.events("rec")
    assert [e["type"] for e in attachment_events(events)] == ["attachment/rejected", "attachment/recovered"]
    assert (await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]), session="rec")).status == 200
    assert ids_in(harness.upstream.last) == [aid]  # the image again


async def test_an_inlined_non_image_cannot_be_recovered(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = b"base64 all right, but no PNG: " * 8
    aid = ref_id(data)
    resp = await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]), session="junk")
    assert resp.status == 200, await resp.text()
    [event] = attachment_events(await harness.events("junk"))  # found before the upstream was asked
    assert event["type"] == "attachment/quarantine" and event["data"]["failure"] == "corrupt"
    assert len(harness.upstream.received) == 1 and ids_in(harness.upstream.last) == []
    await background_settled(harness)
    assert (await harness.client.get(f"/v1/attachments/{aid}")).status == 404  # never admitted
    before = await harness.events("junk")
    resp = await harness.client.post(f"/admin/sessions/junk/attachments/{aid}/recover", headers=ADMIN)
    assert resp.status == 409, await resp.text()
    code = resp.headers.get("x-projectionist-error-code", "")
    assert code.startswith("ATTACHMENT_"), code
    assert await harness.events("junk") == before


# --- 5. concurrency -----------------------------------------------------------------------------

@on_both
async def test_concurrent_requests_with_one_refused_inlined_image_record_one_transition(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(90)
    harness.upstream.refused[ref_id(data)] = False
    body = chat_body(inline=[data_url(data)])
    answers = await asyncio.gather(*(post(harness, "/v1/chat/completions", body, session="c8") for _ in range(8)))
    assert [a.status for a in answers] == [200] * 8
    assert rejected(await harness.events("c8")) == [(ref_id(data), "openai")]


@on_both
async def test_two_replicas_hit_by_one_refused_inlined_image_record_one_transition(
        make_harness: MakeHarness, make_config: Callable[..., Config]) -> None:
    a = await make_harness(make_config(**RECORDING))
    b = await make_harness(make_config(**RECORDING))  # same store, log and settings
    data = png(91)
    a.upstream.refused[ref_id(data)] = False
    body = chat_body(inline=[data_url(data)])
    answers = await asyncio.gather(*(post(replica, "/v1/chat/completions", body, session="rep2")
                                     for _ in range(3) for replica in (a, b)))
    assert [r.status for r in answers] == [200] * 6
    assert rejected(await a.events("rep2")) == [(ref_id(data), "openai")]
    assert rejected(await b.events("rep2")) == [(ref_id(data), "openai")]


# --- 6. operators -------------------------------------------------------------------------------

async def test_metrics_count_a_resent_inline_refusal_and_an_unattributed_one(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(100)
    harness.upstream.refused[ref_id(data)] = False
    assert (await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]), session="m1")).status == 200
    m = await scrape(harness)
    assert m[f'{REJECTIONS}{{outcome="resent"}}'] == 1 and m[f'{REJECTIONS}{{outcome="unattributed"}}'] == 0
    other = png(101)
    harness.upstream.refused[ref_id(other)] = False
    with_url = chat_body(inline=["https://example.invalid/cat.png", data_url(other)])  # no identity for the URL
    resp = await post(harness, "/v1/chat/completions", with_url, session="m2")
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_image_format"
    m = await scrape(harness)
    assert m[f'{REJECTIONS}{{outcome="resent"}}'] == 1 and m[f'{REJECTIONS}{{outcome="unattributed"}}'] == 1
    assert rejected(await harness.events("m2")) == []


async def test_the_request_line_tells_what_became_of_the_clients_images(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data, good = png(102), png(103)
    # the refusal names the place: only ``data`` is quarantined, ``good`` goes on
    harness.upstream.script = refuse_while(ref_id(data), openai_refusal("messages[0].content[2].image_url"))
    body = chat_body(inline=[data_url(good), data_url(data)])
    with capture_logs() as logs:
        assert (await post(harness, "/v1/chat/completions", body)).status == 200
        assert (await post(harness, "/v1/chat/completions", body,
                           headers={"X-Claude-Code-Session-Id": "cc-1"})).status == 200
        assert (await post(harness, "/v1/chat/completions", body, session="plain")).status == 200
    derived, claude, plain = request_lines(logs)
    assert derived["rejection"] == "resent" and derived["session_source"] == "derived"
    assert (derived["client_images"], derived["client_placeholders"]) == (2, 1)
    assert claude["session"] == "claude-code:cc-1" and claude["session_source"] == "claude-code"
    # the same bytes to the same format in another session of the tenant: its placeholder before the
    # call, from the tenant's refusals (``call.refusals``), with no refused round trip
    assert claude.get("tenant_rejected") == 1 and "rejection" not in claude
    assert (claude["client_images"], claude["client_placeholders"]) == (2, 1)
    assert plain["session"] == "plain" and "session_source" not in plain


# --- 7. Accept-Encoding -------------------------------------------------------------------------

@pytest.mark.parametrize("offered,sent", [("zstd, br, gzip", "gzip"), ("br", "identity"),
                                          ("gzip;q=1.0, deflate;q=0.5, br", "gzip;q=1.0, deflate;q=0.5"),
                                          ("br, gzip;q=0, identity;q=0", "identity")])
async def test_the_upstream_is_asked_only_for_codings_the_proxy_reads(make_harness: MakeHarness, offered: str,
                                                                      sent: str) -> None:
    harness = await make_harness()
    for body in (chat_body(), chat_body(inline=[data_url(png(110))])):
        resp = await post(harness, "/v1/chat/completions", body, session="ae", headers={"Accept-Encoding": offered})
        assert resp.status == 200
        accept = [v for k, v in harness.upstream.last.headers.items() if k.lower() == "accept-encoding"]
        assert accept == [sent]


async def test_a_gzip_refusal_of_an_inlined_image_is_read_and_rescued(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(111)
    harness.upstream.script = refuse_while(ref_id(data), openai_refusal(None), compress=True)
    resp = await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]), session="gz",
                      headers={"Accept-Encoding": "zstd, br, gzip"})
    assert resp.status == 200, await resp.text()
    refused = harness.upstream.received[-2]
    assert refused.headers.get("Accept-Encoding") == "gzip"
    assert rejected(await harness.events("gz")) == [(ref_id(data), "openai")]
    assert placeholder(ref_id(data)) in harness.upstream.last.body.decode()


# --- 8. sessions --------------------------------------------------------------------------------

def digest_session(prefix: str, value: str) -> str:
    return prefix + "sha256-" + hashlib.sha256(value.encode()).hexdigest()[:32]


NATIVE: list[tuple[str, dict[str, str], Json, str, str]] = [
    # (id, headers, extra body members of a Responses call, the session, its source)
    ("claude-code-header", {"X-Claude-Code-Session-Id": "cc-9"}, {}, "claude-code:cc-9", "claude-code"),
    ("codex-session-id", {"session-id": "0199a-codex"}, {}, "codex:0199a-codex", "codex"),
    ("codex-session_id", {"session_id": "old-codex"}, {}, "codex:old-codex", "codex"),
    ("conversation", {}, {"conversation": "conv_123"}, "conversation:conv_123", "conversation"),
    ("conversation-object", {}, {"conversation": {"id": "conv_9"}}, "conversation:conv_9", "conversation"),
    # a value apps share between users: scoped by the credentials (none here: the digest of nothing)
    ("prompt-cache-key", {}, {"prompt_cache_key": "pck-1"}, "cache-key:pck-1@" + hashlib.sha256().hexdigest()[:12],
     "cache-key"),
    ("too-long", {"X-Claude-Code-Session-Id": "x" * 300}, {}, digest_session("claude-code:", "x" * 300), "claude-code"),
    ("not-visible-ascii", {"X-Claude-Code-Session-Id": "a b"}, {}, digest_session("claude-code:", "a b"), "claude-code"),
]


@pytest.mark.parametrize("headers,extra,session,source", [n[1:] for n in NATIVE], ids=[n[0] for n in NATIVE])
async def test_a_clients_own_session_signal_names_the_session(make_harness: MakeHarness, headers: dict[str, str],
                                                             extra: Json, session: str, source: str) -> None:
    harness = await make_harness(**RECORDING)
    data = png(124)
    harness.upstream.refused[ref_id(data)] = False
    with capture_logs() as logs:
        resp = await post(harness, "/v1/responses", {**responses_body(data_url(data)), **extra}, headers=headers)
    assert resp.status == 200, await resp.text()  # never an error, whatever the value
    [line] = request_lines(logs)
    assert (line["session"], line["session_source"]) == (session, source)
    assert rejected(await harness.events(session)) == [(ref_id(data), "openai")]


async def test_without_client_sessions_an_inlined_image_refusal_goes_back(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING, **{"server.client_sessions": False})
    data = png(125)
    harness.upstream.refused[ref_id(data)] = False
    resp = await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]),
                      headers={"X-Claude-Code-Session-Id": "ignored"})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_image_format"
    assert harness.upstream.refusals == 1
    assert await sessions_listed(harness) == []


async def test_with_inline_images_off_a_refusal_of_one_goes_back_as_it_came(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING, **{"policy.inline_images": False})
    data = png(126)
    harness.upstream.refused[ref_id(data)] = False
    resp = await post(harness, "/v1/chat/completions", chat_body(inline=[data_url(data)]), session="off")
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_image_format"
    assert attachment_events(await harness.events("off")) == []
    assert (await scrape(harness))[f'{REJECTIONS}{{outcome="resent"}}'] == 0


async def test_x_session_id_wins_over_the_claude_code_header(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(120)
    harness.upstream.refused[ref_id(data)] = False
    resp = await post(harness, "/v1/messages", anthropic_body(anthropic_block(data)), session="mine",
                      headers={"X-Claude-Code-Session-Id": "theirs"})
    assert resp.status == 200, await resp.text()
    assert rejected(await harness.events("mine")) == [(ref_id(data), "anthropic")]
    assert await harness.events("claude-code:theirs") == []


async def test_the_session_path_and_a_client_native_header_never_conflict(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(121)
    harness.upstream.refused[ref_id(data)] = False
    for native in ({"X-Claude-Code-Session-Id": "other"}, {"session-id": "codex-other"}):
        resp = await post(harness, "/s/by-path/v1/chat/completions", chat_body(inline=[data_url(data)]),
                          headers=native)
        assert resp.status == 200, await resp.text()
    assert rejected(await harness.events("by-path")) == [(ref_id(data), "openai")]
    assert sorted(await sessions_listed(harness)) == ["by-path"]


def claude_code_1(session: str) -> str:
    return f"user_{hashlib.sha256(b'device').hexdigest()}_account__session_{session}"


def claude_code_2(session: str) -> str:
    return json.dumps({"device_id": hashlib.sha256(b"device").hexdigest(), "account_uuid": "", "session_id": session})


@pytest.mark.parametrize("user_id", [claude_code_1, claude_code_2], ids=["1.x", "2.x"])
async def test_claude_codes_metadata_user_id_names_its_session(make_harness: MakeHarness,
                                                              user_id: Callable[[str], str]) -> None:
    harness = await make_harness(**RECORDING)
    session = str(uuid.uuid4())
    data = png(122)
    harness.upstream.refused[ref_id(data)] = False
    body = {**anthropic_body(anthropic_block(data)), "metadata": {"user_id": user_id(session)}}
    with capture_logs() as logs:
        resp = await post(harness, "/v1/messages", body)
    assert resp.status == 200, await resp.text()
    [line] = request_lines(logs)
    assert (line["session"], line["session_source"]) == (f"claude-code:{session}", "claude-code")
    assert rejected(await harness.events(f"claude-code:{session}")) == [(ref_id(data), "anthropic")]
    assert await sessions_listed(harness) == [f"claude-code:{session}"]


async def test_a_text_only_request_without_a_signal_stays_sessionless(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    wordy = {"model": "m", "messages": [{"role": "user", "content": "inline base64 words, but no image"}]}
    with capture_logs() as logs:
        for body in (chat_body(), wordy):
            assert (await post(harness, "/v1/chat/completions", body)).status == 200
    assert [line["session"] for line in request_lines(logs)] == [None, None]
    await harness.app[SERVICES].recording.drain()
    assert await sessions_listed(harness) == []


async def test_a_derived_session_is_scoped_by_the_clients_key(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    data = png(123)
    first = anthropic_body(anthropic_block(data), system="you are a careful agent")
    first["messages"][0]["content"][1]["cache_control"] = {"type": "ephemeral"}  # on the last block, this turn
    later = next_turn("anthropic", first)
    del later["messages"][0]["content"][1]["cache_control"]  # clients move the mark to the new last block
    later["messages"][-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    with capture_logs() as logs:
        for key, body in (("key-a", first), ("key-b", first), ("key-a", later), ("key-b", later)):
            assert (await post(harness, "/v1/messages", body, headers={"Authorization": f"Bearer {key}"})).status == 200
    a1, b1, a2, b2 = (line["session"] for line in request_lines(logs))
    assert a1.startswith("derived:") and b1.startswith("derived:")
    assert a1 != b1
    assert (a2, b2) == (a1, b1)
    # a changed opening is another conversation
    with capture_logs() as logs:
        other = anthropic_body(anthropic_block(data), system="another system prompt")
        assert (await post(harness, "/v1/messages", other, headers={"Authorization": "Bearer key-a"})).status == 200
    [line] = request_lines(logs)
    assert line["session"] not in (a1, b1)
