"""Every image fits the call it rides in: the images a client inlines are fitted to the target
before the call, as references are, and a refusal is read for what it is about.

Each test drives the proxy over HTTP with sessions shaped as agents send them (screenshots in
``tool_result`` blocks, the whole history every turn, only the client's own session header)
against an upstream that enforces the providers' documented limits in their own words
(``tests.limits``): what it refuses, a provider would refuse. The tests read what the upstream
received, how often it was called, and the session log.

- fitted before the call: Anthropic's many-image rule over 25 screenshots, a 9000 px screenshot,
  PNG bytes labelled JPEG, a BMP to Gemini; truncated and empty images get their placeholder and
  one event with no refused round trip;
- refusals about the context: a model that takes no images (learnt for that upstream and model;
  the same image still reaches a vision model of the session), a many-image rule the profile does
  not know;
- refusals in words no table knows: settled by one re-send without the suspects (a bisection
  among several), and a 400 that no image caused goes back unchanged with nothing recorded;
- a refusal of bytes in a mislabelled form never holds for the same bytes sent right;
- determinism: the same turn twice, after a restart, a fork and a replay, byte for byte.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientResponse, web

from projectionist.proxy.call.replay import rebuild
from projectionist.proxy.config import Config
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import ADMIN, Harness
from tests.fakes import FakeUpstream, Received
from tests.imaging import make_image, ref_id
from projectionist.policy.evidence import MAX_CALLS
from tests.limits import Enforcing, Refusal, anthropic_blocks, opened

MakeHarness = Callable[..., Awaitable[Harness]]
Json = dict[str, Any]
RECORDING: Json = {"record.mode": "metadata"}


# --- bodies ------------------------------------------------------------------------------------

def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_block(data: bytes, media_type: str = "image/png") -> Json:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64(data)}}


def claude_code_turn(shots: list[bytes], media_type: str = "image/png") -> Json:
    """Claude Code's request after ``len(shots)`` screenshots: each came back from a tool call
    as an image in a ``tool_result``, and the whole history is sent again."""
    messages: list[Json] = [{"role": "user", "content": [{"type": "text", "text": "check the page after each step"}]}]
    for n, shot in enumerate(shots):
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{n:03}", "name": "Screenshot", "input": {}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{n:03}", "content": [image_block(shot, media_type)]}]})
    return {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}


def screenshot(n: int, width: int = 2400, height: int = 1400) -> bytes:
    return make_image(width, height, color=n)


def chat_body(model: str, *urls: str) -> Json:
    parts: list[Json] = [{"type": "text", "text": "what is on the screen?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"model": model, "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": parts}]}


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"


def gemini_body(data: bytes, mime: str) -> Json:
    return {"contents": [{"role": "user", "parts": [{"text": "what is this?"},
                                                    {"inline_data": {"mime_type": mime, "data": b64(data)}}]}]}


GEMINI = "/v1beta/models/gemini-2.5-flash:generateContent"


async def send(harness: Harness, path: str, body: Json, headers: dict[str, str]) -> tuple[ClientResponse, list[Received]]:
    """POST ``body``; the answer, and what the upstream received for it."""
    before = len(harness.upstream.received)
    resp = await harness.client.post(path, json=body, headers=headers)
    await resp.read()
    return resp, harness.upstream.received[before:]


def sent_images(received: Received) -> list[tuple[str, int, int, str]]:
    """Every image block an Anthropic call carried: (media type, width, height, its base64)."""
    found = []
    for _, block in anthropic_blocks(received.json()):
        data = base64.b64decode(block["source"]["data"])
        media_type, width, height = opened(data) or ("none", 0, 0)
        assert media_type == block["source"]["media_type"]
        found.append((media_type, width, height, block["source"]["data"]))
    return found


def of_type(events: list[Json], kind: str) -> list[Json]:
    return [e["data"] for e in events if e["type"] == kind]


@pytest.fixture
def enforcing(upstream: FakeUpstream) -> Enforcing:
    script = Enforcing()
    upstream.script = script
    return script


@pytest.fixture
def with_gemini(upstream: FakeUpstream) -> Json:
    return {"upstreams.gemini": {"format": "gemini", "url": upstream.url}}


# --- fitted before the call ---------------------------------------------------------------------

async def test_twenty_five_screenshots_keep_every_image_within_2000_px_and_no_call_is_refused(
        make_harness: MakeHarness, make_config: Callable[..., Config], enforcing: Enforcing) -> None:
    """The most reported image failure of Claude Code: past 20 screenshots of 2400 px every turn
    was refused ("... for many-image requests: 2000 pixels") and the session was lost. Fitted
    before the call, every turn is answered with every image visible, in one call each."""
    harness = await make_harness(make_config(**RECORDING))
    header = {"X-Claude-Code-Session-Id": str(uuid.uuid4())}
    session = "claude-code:" + header["X-Claude-Code-Session-Id"]
    shots = [screenshot(n) for n in range(25)]
    last: list[Received] = []
    for turn in range(1, 26):
        resp, last = await send(harness, "/v1/messages", claude_code_turn(shots[:turn]), header)
        assert resp.status == 200, (turn, await resp.text())
        assert len(last) == 1, f"turn {turn}: {len(last)} upstream calls"
        images = sent_images(last[0])
        assert len(images) == turn  # every screenshot is there, as an image
        sides = {max(w, h) for _, w, h, _ in images}
        assert sides == ({2400} if turn <= 20 else {2000}), (turn, sides)
    assert enforcing.refused == []
    events = await harness.events(session)
    assert of_type(events, "attachment/quarantine") == of_type(events, "attachment/rejected") == []
    pins = of_type(events, "attachment/variant")
    assert sorted(p["attachment_id"] for p in pins) == sorted(ref_id(s) for s in shots)
    assert {p["target"] for p in pins} == {"anthropic@2000"}
    # the same turn again, and on a restarted proxy: the same bytes upstream
    resp, again = await send(harness, "/v1/messages", claude_code_turn(shots), header)
    assert resp.status == 200 and again[0].body == last[0].body
    restarted = await make_harness(make_config(**RECORDING))
    resp, after = await send(restarted, "/v1/messages", claude_code_turn(shots), header)
    assert resp.status == 200 and after[0].body == last[0].body
    assert of_type(await restarted.events(session), "attachment/variant") == pins  # none made twice


async def test_a_9000_px_screenshot_goes_as_a_pinned_variant_within_8000_px(make_harness: MakeHarness,
                                                                              enforcing: Enforcing) -> None:
    harness = await make_harness(**RECORDING)
    wide = make_image(9000, 500, color=3)
    resp, received = await send(harness, "/v1/messages", claude_code_turn([wide]), {"X-Session-Id": "wide"})
    assert resp.status == 200, await resp.text()
    [(media_type, width, height, _)] = sent_images(received[0])
    assert (media_type, width, height) == ("image/png", 8000, 444) and enforcing.refused == []
    [pin] = of_type(await harness.events("wide"), "attachment/variant")
    assert (pin["attachment_id"], pin["target"], pin["width"]) == (ref_id(wide), "anthropic@8000", 8000)


async def test_png_bytes_labelled_jpeg_go_as_png(make_harness: MakeHarness, enforcing: Enforcing) -> None:
    harness = await make_harness(**RECORDING)
    shot = screenshot(4, 300, 200)
    resp, received = await send(harness, "/v1/messages", claude_code_turn([shot], "image/jpeg"), {"X-Session-Id": "lie"})
    assert resp.status == 200, await resp.text()
    [(media_type, _, _, data)] = sent_images(received[0])
    assert media_type == "image/png" and data == b64(shot)  # the same bytes, under what they are
    assert enforcing.refused == [] and await harness.events("lie") != []


@pytest.mark.parametrize("broken", ["truncated", "empty", "not an image"])
async def test_bytes_that_are_no_image_get_their_placeholder_before_the_call(make_harness: MakeHarness,
                                                                             enforcing: Enforcing,
                                                                             broken: str) -> None:
    harness = await make_harness(**RECORDING)
    good = screenshot(5, 300, 200)
    bad = {"truncated": good[: len(good) // 2], "empty": b"", "not an image": b"%PDF-1.7 not an image " * 4}[broken]
    body = claude_code_turn([good, bad])
    resp, received = await send(harness, "/v1/messages", body, {"X-Session-Id": "cut"})
    assert resp.status == 200, await resp.text()
    assert len(received) == 1 and enforcing.refused == []  # no refused round trip
    [(_, _, _, kept)] = sent_images(received[0])
    assert kept == b64(good)
    tool_result = received[0].json()["messages"][4]["content"][0]
    assert tool_result["content"] == [{"type": "text", "text": f"[image unavailable: corrupt ({ref_id(bad)[:15]})]"}]
    [event] = of_type(await harness.events("cut"), "attachment/quarantine")
    assert event == {"attachment_id": ref_id(bad), "failure": "corrupt", "retryable": False, "inline": True}
    # the next turn: the same placeholder, no new event
    resp, again = await send(harness, "/v1/messages", claude_code_turn([good, bad, good]), {"X-Session-Id": "cut"})
    assert resp.status == 200 and len(again) == 1
    assert len(of_type(await harness.events("cut"), "attachment/quarantine")) == 1


async def test_a_bmp_goes_to_gemini_as_a_png_variant(make_harness: MakeHarness, enforcing: Enforcing,
                                                      with_gemini: Json) -> None:
    harness = await make_harness(**RECORDING, **with_gemini)
    bmp = make_image(64, 48, color=6, media_type="image/png")
    from PIL import Image
    import io
    out = io.BytesIO()
    Image.open(io.BytesIO(bmp)).save(out, "BMP")
    resp, received = await send(harness, GEMINI, gemini_body(out.getvalue(), "image/bmp"), {"X-Session-Id": "bmp"})
    assert resp.status == 200, await resp.text()
    assert len(received) == 1 and enforcing.refused == []
    inline = received[0].json()["contents"][0]["parts"][1]["inline_data"]
    variant = base64.b64decode(inline["data"])
    assert inline["mime_type"] == "image/png" and opened(variant) == ("image/png", 64, 48)
    [pin] = of_type(await harness.events("bmp"), "attachment/variant")
    assert pin["attachment_id"] == ref_id(out.getvalue()) and pin["media_type"] == "image/png"


# --- refusals about the context -------------------------------------------------------------------

async def test_a_text_only_model_is_learnt_once_and_a_vision_model_of_the_session_still_sees_the_image(
        make_harness: MakeHarness, enforcing: Enforcing) -> None:
    harness = await make_harness(**RECORDING)
    shot = screenshot(7, 300, 200)
    headers = {"X-Session-Id": "mixed"}
    resp, received = await send(harness, "/v1/chat/completions", chat_body("deepseek-chat", data_url(shot)), headers)
    assert resp.status == 200, await resp.text()
    assert len(received) == 2  # refused, then re-sent under the rule
    parts = received[1].json()["messages"][1]["content"]
    assert parts[1] == {"type": "text", "text": f"[image unavailable: unsupported ({ref_id(shot)[:15]})]"}
    events = await harness.events("mixed")
    [rule] = of_type(events, "upstream/learnt")
    assert (rule["upstream"], rule["model"], rule["rule"]) == ("openai", "deepseek-chat", "no_images")
    assert of_type(events, "attachment/rejected") == of_type(events, "attachment/quarantine") == []
    # the next turn to the same model: one call, the placeholder before it
    resp, received = await send(harness, "/v1/chat/completions", chat_body("deepseek-chat", data_url(shot)), headers)
    assert resp.status == 200 and len(received) == 1 and "unsupported" in received[0].body.decode()
    # a vision model of the same session gets the image as it came
    resp, received = await send(harness, "/v1/chat/completions", chat_body("gpt-4o", data_url(shot)), headers)
    assert resp.status == 200 and len(received) == 1
    assert received[0].json()["messages"][1]["content"][1]["image_url"]["url"] == data_url(shot)
    assert len(enforcing.refused) == 1


async def test_a_many_image_rule_the_profile_does_not_know_is_learnt_and_the_images_fitted(
        make_harness: MakeHarness, enforcing: Enforcing) -> None:
    """An upstream of Anthropic's format with a stricter many-image rule than the API's (more than 3
    images: 1000 px): its refusal names an image it took before, so it is about the context."""
    def stricter(request: web.Request, doc: Any) -> Refusal | None:
        blocks = list(anthropic_blocks(doc))
        for path, block in blocks:
            found = opened(base64.b64decode(block["source"]["data"]))
            if len(blocks) > 3 and found is not None and max(found[1:]) > 1000:
                return 400, {"type": "error", "error": {"type": "invalid_request_error", "message": (
                    f"{path}.image.source.base64.data: At least one of the image dimensions exceed max allowed size "
                    "for many-image requests: 1000 pixels")}}
        return None

    enforcing.extra = stricter
    harness = await make_harness(**RECORDING)
    shots = [screenshot(n, 1200, 800) for n in range(10, 14)]
    headers = {"X-Session-Id": "stricter"}
    for turn in (1, 2, 3):
        resp, received = await send(harness, "/v1/messages", claude_code_turn(shots[:turn]), headers)
        assert resp.status == 200 and len(received) == 1
    resp, received = await send(harness, "/v1/messages", claude_code_turn(shots), headers)
    assert resp.status == 200, await resp.text()
    assert len(received) == 2 and {max(w, h) for _, w, h, _ in sent_images(received[1])} == {1000}
    events = await harness.events("stricter")
    [rule] = of_type(events, "upstream/learnt")
    assert (rule["rule"], rule["images"], rule["side"]) == ("many_images", 4, 1000)
    assert of_type(events, "attachment/rejected") == []
    resp, received = await send(harness, "/v1/messages", claude_code_turn([*shots, shots[0]]), headers)
    assert resp.status == 200 and len(received) == 1  # known now: fitted before the call


# --- refusals in words no table knows ---------------------------------------------------------------

def refuse_in_unknown_words(bad: set[str], path: str = "") -> Callable[[web.Request, Any], Refusal | None]:
    """Refuse every call that carries one of ``bad`` (ids) with a message no table knows."""
    from tests.refusing import inlined

    def script(request: web.Request, doc: Any) -> Refusal | None:
        if bad & {aid for _, aid in inlined(doc)}:
            return 400, {"error": {"code": 400, "message": "Request contains an invalid argument.",
                                   "status": "INVALID_ARGUMENT"}}
        return None
    return script


async def test_a_generic_refusal_of_an_image_is_settled_by_one_re_send(make_harness: MakeHarness,
                                                                       enforcing: Enforcing,
                                                                       with_gemini: Json) -> None:
    harness = await make_harness(**RECORDING, **with_gemini)
    shot = screenshot(20, 200, 100)
    enforcing.extra = refuse_in_unknown_words({ref_id(shot)})
    headers = {"X-Session-Id": "generic"}
    resp, received = await send(harness, GEMINI, gemini_body(shot, "image/png"), headers)
    assert resp.status == 200, await resp.text()
    assert len(received) == 2  # at most one extra call
    assert received[1].json()["contents"][0]["parts"][1] == {
        "text": f"[image unavailable: rejected ({ref_id(shot)[:15]})]"}
    [event] = of_type(await harness.events("generic"), "attachment/rejected")
    assert (event["attachment_id"], event["format"], event["suspects"]) == (ref_id(shot), "gemini", 1)
    resp, received = await send(harness, GEMINI, gemini_body(shot, "image/png"), headers)
    assert resp.status == 200 and len(received) == 1  # known now


async def test_a_generic_400_no_image_caused_goes_back_unchanged_and_nothing_is_recorded(
        make_harness: MakeHarness, upstream: FakeUpstream) -> None:
    harness = await make_harness(**RECORDING)
    answer = {"error": {"message": "Unrecognized request argument supplied: frobnicate", "type": "invalid_request_error",
                        "param": None, "code": None}}

    async def always(request: web.Request, doc: Any) -> web.StreamResponse:
        return web.json_response(answer, status=400, headers={"x-upstream": "kept"})

    upstream.script = always
    resp, received = await send(harness, "/v1/chat/completions",
                                chat_body("gpt-4o", data_url(screenshot(21, 50, 50))), {"X-Session-Id": "plain"})
    assert resp.status == 400 and await resp.json() == answer and resp.headers["x-upstream"] == "kept"
    assert len(received) == 2  # one extra call at most
    events = await harness.events("plain")
    assert [e["type"] for e in events if not e["type"].endswith("/recorded")] == []
    resp, received = await send(harness, "/v1/chat/completions", chat_body("gpt-4o", "https://example.com/a.png"),
                                {"X-Session-Id": "plain"})
    assert resp.status == 400 and len(received) == 2  # a URL image is a suspect too; still nothing recorded
    assert [e["type"] for e in await harness.events("plain") if not e["type"].endswith("/recorded")] == []


async def test_one_refused_image_among_new_ones_is_found_by_bisection_and_the_others_kept(
        make_harness: MakeHarness, enforcing: Enforcing) -> None:
    harness = await make_harness(**RECORDING)
    shots = [screenshot(n, 120, 80) for n in range(30, 34)]
    bad = ref_id(shots[2])
    enforcing.extra = refuse_in_unknown_words({bad})
    resp, received = await send(harness, "/v1/chat/completions", chat_body("gpt-4o", *map(data_url, shots)),
                                {"X-Session-Id": "bisect"})
    assert resp.status == 200, await resp.text()
    assert 2 <= len(received) <= 1 + MAX_CALLS  # the refused call and the bounded extra calls
    final = received[-1].json()["messages"][1]["content"]
    assert [p["image_url"]["url"] for p in final if p["type"] == "image_url"] == [
        data_url(s) for s in shots if ref_id(s) != bad]
    [event] = of_type(await harness.events("bisect"), "attachment/rejected")
    assert (event["attachment_id"], event["suspects"]) == (bad, 1)
    assert harness.app[SERVICES].metrics.rejections["proven"] == 1


# --- how the image was sent ---------------------------------------------------------------------------

async def test_a_refusal_of_mislabelled_bytes_never_holds_for_the_same_bytes_sent_right(
        make_harness: MakeHarness, enforcing: Enforcing) -> None:
    """Without fitting (``[policy] fit_images = false``) bytes go as the client spelled them: a
    refusal of PNG bytes labelled JPEG is a refusal of that form only."""
    harness = await make_harness(**RECORDING, **{"policy.fit_images": False})
    other, shot = screenshot(40, 100, 80), screenshot(41, 100, 80)
    headers = {"X-Session-Id": "form"}
    resp, _ = await send(harness, "/v1/messages", claude_code_turn([other]), headers)
    assert resp.status == 200
    resp, received = await send(harness, "/v1/messages",
                                {**claude_code_turn([other]), "messages": [
                                    *claude_code_turn([other])["messages"],
                                    {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
                                    {"role": "user", "content": [image_block(shot, "image/jpeg")]}]}, headers)
    assert resp.status == 200 and len(received) == 2
    [event] = of_type(await harness.events("form"), "attachment/rejected")
    assert (event["attachment_id"], event["form"]) == (ref_id(shot), "labelled image/jpeg")
    # the same bytes, labelled what they are: an image, not the placeholder
    resp, received = await send(harness, "/v1/messages", claude_code_turn([other, shot]), headers)
    assert resp.status == 200 and len(received) == 1
    assert [data for _, _, _, data in sent_images(received[0])] == [b64(other), b64(shot)]


# --- determinism ---------------------------------------------------------------------------------

async def test_fork_and_replay_of_a_fitted_session_send_the_same_bytes(make_harness: MakeHarness,
                                                                       enforcing: Enforcing) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    shots = [screenshot(n, 2400, 1400) for n in range(50, 71)]  # 21: the many-image rule
    shots.append(make_image(20, 20, color=1)[:40])  # and a truncated one
    headers = {"X-Session-Id": "det"}
    resp, received = await send(harness, "/v1/messages", claude_code_turn(shots), headers)
    assert resp.status == 200 and len(received) == 1
    services = harness.app[SERVICES]
    await services.recording.drain()
    rebuilt = await rebuild(services.log, services.store, "det")
    assert rebuilt.matches, (rebuilt.first_difference, rebuilt.reason)
    assert rebuilt.body == received[0].body
    resp = await harness.client.post("/admin/sessions/det/fork", json={"new_session_id": "det2"}, headers=ADMIN)
    assert resp.status == 201, await resp.text()
    resp, forked = await send(harness, "/v1/messages", claude_code_turn(shots), {"X-Session-Id": "det2"})
    assert resp.status == 200 and forked[0].body == received[0].body
    assert of_type(await harness.events("det2"), "attachment/variant") == of_type(
        await harness.events("det"), "attachment/variant")


# --- found by the red team ------------------------------------------------------------------------------

async def test_an_image_no_variant_can_be_made_for_goes_respelled_and_its_refusal_holds(
        make_harness: MakeHarness, enforcing: Enforcing) -> None:
    """Over the pixels a variant is made from, a 9000 px PNG labelled JPEG goes as it came, but
    under its true type: its refusal is then of the form every later turn sends, and holds."""
    harness = await make_harness(**RECORDING, **{"store.limits.max_pixels": 1_000_000})
    wide = make_image(9000, 200, color=8)
    headers = {"X-Session-Id": "nofit"}
    resp, received = await send(harness, "/v1/messages", claude_code_turn([wide], "image/jpeg"), headers)
    assert resp.status == 200, await resp.text()
    assert len(received) == 2  # refused (over 8000 px), then re-sent with its placeholder
    assert received[0].json()["messages"][2]["content"][0]["content"][0]["source"]["media_type"] == "image/png"
    [event] = of_type(await harness.events("nofit"), "attachment/rejected")
    assert (event["attachment_id"], event.get("form", "")) == (ref_id(wide), "")
    resp, received = await send(harness, "/v1/messages", claude_code_turn([wide, screenshot(9, 50, 50)], "image/jpeg"),
                                headers)
    assert resp.status == 200 and len(received) == 1  # held before the call, every later turn


async def test_a_refusal_that_says_the_prompt_is_too_long_goes_back_and_convicts_no_image(
        make_harness: MakeHarness, upstream: FakeUpstream) -> None:
    """Leaving the images out would make the prompt short enough, but the refusal is about the
    context window, not an image: the client gets it (Claude Code compacts on it)."""
    answer = {"type": "error", "error": {"type": "invalid_request_error",
                                         "message": "prompt is too long: 216327 tokens > 200000 maximum"}}

    async def too_long(request: web.Request, doc: Any) -> web.StreamResponse | None:
        return web.json_response(answer, status=400) if list(anthropic_blocks(doc)) else None

    upstream.script = too_long
    harness = await make_harness(**RECORDING)
    resp, received = await send(harness, "/v1/messages", claude_code_turn([screenshot(n, 80, 60) for n in range(3)]),
                                {"X-Session-Id": "long"})
    assert resp.status == 400 and await resp.json() == answer and len(received) == 1
    assert [e for e in await harness.events("long") if not e["type"].endswith("/recorded")] == []


async def test_past_the_images_a_request_may_hold_the_oldest_give_way(make_harness: MakeHarness,
                                                                       enforcing: Enforcing) -> None:
    """Anthropic takes 100 images per request: the 102nd screenshot's turn sends the newest 100
    and the placeholders of the two oldest, never a request the provider refuses."""
    harness = await make_harness(**RECORDING)
    shots = [make_image(2 + n // 200, 2, color=n % 200) for n in range(102)]
    resp, received = await send(harness, "/v1/messages", claude_code_turn(shots), {"X-Session-Id": "hundred"})
    assert resp.status == 200 and len(received) == 1, await resp.text()
    assert [data for _, _, _, data in sent_images(received[0])] == [b64(s) for s in shots[2:]]
    first = received[0].json()["messages"][2]["content"][0]["content"]
    assert first == [{"type": "text", "text": f"[image unavailable: over_limit ({ref_id(shots[0])[:15]})]"}]
    assert [e for e in await harness.events("hundred") if not e["type"].endswith("/recorded")] == []


async def test_a_refusal_another_call_records_meanwhile_never_misleads_the_evidence(
        make_harness: MakeHarness, upstream: FakeUpstream, with_gemini: Json) -> None:
    """While one call settles a refusal in unknown words by evidence, another call of the session
    records the culprit: the first one's probes are built on the session as it was when it was
    refused, so the innocent images stay innocent."""
    from tests.refusing import inlined

    g1, g2, bad = (screenshot(60 + n, 30, 20) for n in range(3))
    calls: list[set[str]] = []
    second = asyncio.Event()

    async def script(request: web.Request, doc: Any) -> web.StreamResponse | None:
        ids = {aid for _, aid in inlined(doc)}
        if "first" in str(doc):
            calls.append(ids)
            if len(calls) == 2:  # the first probe: slow, while the other call is refused and records
                second.set()
                await asyncio.sleep(1.0)
            if ref_id(bad) in ids:
                return web.json_response({"error": {"code": 400, "message": "Request contains an invalid argument.",
                                                    "status": "INVALID_ARGUMENT"}}, status=400)
            return None
        if ref_id(bad) in ids:
            return web.json_response({"error": {"code": 400, "message": "Unable to process input image.",
                                                "status": "INVALID_ARGUMENT"}}, status=400)
        return None

    upstream.script = script
    harness = await make_harness(**RECORDING, **with_gemini)

    def body(tag: str, images: list[bytes]) -> Json:
        parts: list[Json] = [{"text": tag}] + [{"inline_data": {"mime_type": "image/png", "data": b64(i)}} for i in images]
        return {"contents": [{"role": "user", "parts": parts}]}

    headers = {"X-Session-Id": "race"}
    first = asyncio.create_task(harness.client.post(GEMINI, json=body("first", [g1, g2, bad]), headers=headers))
    await asyncio.wait_for(second.wait(), 10)
    other = await harness.client.post(GEMINI, json=body("other", [bad]), headers=headers)
    assert other.status == 200, await other.text()
    assert (await first).status == 200
    rejected = {e["attachment_id"] for e in of_type(await harness.events("race"), "attachment/rejected")}
    assert rejected == {ref_id(bad)}


async def test_a_client_that_names_no_session_gets_its_images_fitted_too(make_harness: MakeHarness,
                                                                          enforcing: Enforcing) -> None:
    """As aider sends it: no session header, no session in the body, the history re-sent each
    turn. The session the proxy derives pins the variant, and the next turn sends the same bytes."""
    harness = await make_harness(**RECORDING)
    wide = make_image(9000, 500, color=12)
    body = claude_code_turn([wide])
    resp, received = await send(harness, "/v1/messages", body, {})
    assert resp.status == 200 and len(received) == 1 and enforcing.refused == [], await resp.text()
    [(_, width, _, data)] = sent_images(received[0])
    assert width == 8000
    later = {**body, "messages": [*body["messages"], {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
                                  {"role": "user", "content": [{"type": "text", "text": "and now?"}]}]}
    resp, again = await send(harness, "/v1/messages", later, {})
    assert resp.status == 200 and [d for _, _, _, d in sent_images(again[0])] == [data]
    listed = await harness.client.get("/admin/sessions", headers=ADMIN)
    [session] = [s["session"] for s in (await listed.json())["sessions"]
                 if not s["session"].startswith("~conversations")]  # not the conversations index
    assert session.startswith("derived:")
    assert [p["attachment_id"] for p in of_type(await harness.events(session), "attachment/variant")] == [ref_id(wide)]
