"""Red-team probes of client-inlined images (scan, identity, derived sessions, re-send, replay).

Each test drives the proxy over HTTP in front of the fake upstream (``tests.refusing``) with
bodies a hostile or merely unusual client sends, and compares what the upstream received to
what the client sent. Each of the six defects the red team found first (a derived session that
took a scan's stand-in, runs hashed that were no image, an identity cache over its bound, a
shared cache key another key could use, a spliced digest a forged body could match) is kept
here as the test of its fix.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from projectionist.proxy.config import Config
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.call import scan as scan_module
from projectionist.proxy.call.describe import sha256_id
from projectionist.proxy.call.replay import rebuild
from tests.conftest import Harness
from tests.imaging import make_image, ref_id
from tests.refusing import inlined
from tests.system.test_inline_images import (RECORDING, anthropic_block, anthropic_body, anthropic_refusal,
                                             b64, data_url, encoded, ids_in, next_turn, placeholder, post,
                                             refuse_while, rejected, request_lines)

MakeHarness = Callable[..., Awaitable[Harness]]
Json = dict[str, Any]
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


def png(color: int) -> bytes:
    return make_image(4, 3, color=color)


def chat(*parts: Json, text: str = "look") -> Json:
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]}


def image_part(url: str) -> Json:
    return {"type": "image_url", "image_url": {"url": url}}


def no_marker(body: bytes) -> bool:
    """No trace of the scan's stand-in (``\\u0000<nonce>:N``) in a body."""
    return scan_module._NONCE.encode() not in body and b"\\u0000" not in body and b"\x00" not in body


# --- 1. hostile bodies: the scan must cut nothing the upstream sees ------------------------------

def _passthrough_bodies() -> dict[str, tuple[str, bytes]]:
    x, y = b64(png(1)), b64(png(2))
    bodies: dict[str, tuple[str, bytes]] = {}
    # a text quoting a data URL before the image (a ;base64, run no image accounts for)
    bodies["chat-text-quotes-data-url"] = (CHAT, encoded(chat(image_part("data:image/png;base64," + x),
                                                              text="see data:image/png;base64," + x)))
    # the same base64 in a text and an image, the text ending with it (where located() looks first)
    bodies["chat-text-ends-with-the-same-base64"] = (CHAT, encoded(chat(image_part("data:image/png;base64," + y),
                                                                        text=y)))
    # two ;base64, in one string (overlapping runs)
    bodies["chat-two-markers-one-string"] = (CHAT, encoded(chat(image_part(f"data:image/png;base64,{x};base64,{y}"))))
    # escaped slashes and a \u escape in the base64
    esc = x.replace("/", "\\/").encode()
    raw = encoded(chat(image_part("data:image/png;base64," + x))).replace(x.encode(), esc)
    bodies["chat-escaped-slashes"] = (CHAT, raw)
    # a text whose ;base64, run ends at an escaped quote (left in place), and one whose run holds an
    # escape and ends at its string's own quote (cut out whole: no base64, so the body is decoded whole)
    bodies["chat-text-run-to-an-escaped-quote"] = (CHAT, encoded(chat(
        image_part("data:image/png;base64," + x), text='see ;base64,' + "A" * 40 + '" and "' + "B" * 40)))
    bodies["chat-text-run-with-an-escape"] = (CHAT, encoded(chat(
        image_part("data:image/png;base64," + y), text="see ;base64," + "A" * 40 + "\n" + "B" * 40)))
    # an Anthropic "data" key that is not an image's, before the image
    body = anthropic_body(anthropic_block(png(3)))
    body["metadata"] = {"data": x}
    bodies["anthropic-foreign-data-key-first"] = (MESSAGES, msgspec.json.encode({"metadata": body.pop("metadata"), **body}))
    # duplicate "data" keys in one source
    src = f'{{"type":"base64","media_type":"image/png","data":"{x}","data":"{y}"}}'
    bodies["anthropic-duplicate-data-keys"] = (MESSAGES, (
        '{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"look"},'
        f'{{"type":"image","source":{src}}}]}}]}}').encode())
    # whitespace around the colon, a key "foo \"data" whose value looks like base64
    bodies["anthropic-odd-keys"] = (MESSAGES, (
        '{"model":"m","max_tokens":10,"foo \\"data":"' + y + '","messages":[{"role":"user","content":['
        '{"type":"image","source":{"type":"base64","media_type":"image/png","data" :  "' + x + '"}}]}]}').encode())
    # a document (PDF) base64 source next to an image
    pdf = base64.b64encode(b"%PDF-1.4 not really" * 4).decode()
    bodies["anthropic-document-and-image"] = (MESSAGES, encoded(anthropic_body(
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}},
        anthropic_block(png(4)))))
    # pretty-printed with odd whitespace
    bodies["chat-pretty"] = (CHAT, json.dumps(chat(image_part("data:image/png;base64," + x)), indent=3).encode())
    return bodies


PASSTHROUGH = _passthrough_bodies()


@pytest.mark.parametrize("name", sorted(PASSTHROUGH))
async def test_a_body_nothing_changes_in_goes_upstream_byte_for_byte(make_harness: MakeHarness, name: str) -> None:
    harness = await make_harness(**RECORDING)
    path, raw = PASSTHROUGH[name]
    for session in ("rt-named", None):  # named, and derived
        resp = await post(harness, path, raw, session=session)
        assert resp.status == 200, await resp.text()
        assert harness.upstream.last.body == raw, f"{name}: the upstream got other bytes than the client sent"


async def test_a_refused_image_next_to_a_quoted_copy_of_another_is_the_only_one_replaced(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    keep, bad = png(10), png(11)
    harness.upstream.refused[ref_id(bad)] = False
    text = "earlier you saw data:image/png;base64," + b64(keep)
    body = chat(image_part(data_url(keep)), image_part(data_url(bad)), text=text)
    harness.upstream.script = None
    # the kept image was accepted before: an unnamed refusal then is about the new one only
    assert (await post(harness, CHAT, chat(image_part(data_url(keep))), session="q1")).status == 200
    await harness.app[SERVICES].recording.drain()
    resp = await post(harness, CHAT, body, session="q1")
    assert resp.status == 200, await resp.text()
    sent = harness.upstream.last.json()
    assert sent["messages"][0]["content"][0]["text"] == text, "the text quoting a data URL was changed"
    assert ids_in(harness.upstream.last) == [ref_id(keep)]
    assert placeholder(ref_id(bad)) in harness.upstream.last.body.decode()
    assert rejected(await harness.events("q1")) == [(ref_id(bad), "openai")]
    assert no_marker(harness.upstream.last.body)


async def test_anthropic_named_refusal_maps_to_the_named_block_with_foreign_data_keys_around(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    keep, bad = png(12), png(13)
    answer = anthropic_refusal("messages.0.content.2.image.source.base64: Could not process image")

    async def script(request: web.Request, doc: Any) -> web.StreamResponse | None:
        blocks = doc["messages"][0]["content"] if doc else []
        if any(b.get("source", {}).get("data") == b64(bad) for b in blocks):
            return web.Response(body=answer, status=400, content_type="application/json")
        return None

    harness.upstream.script = script
    body = anthropic_body(anthropic_block(keep), anthropic_block(bad))
    body["metadata"] = {"data": b64(bad)}  # the refused bytes also under a foreign "data" key
    body["tools"] = [{"name": "t", "input_schema": {"type": "object", "properties": {"data": {"type": "string"}}}}]
    resp = await post(harness, MESSAGES, body, session="q2")
    assert resp.status == 200, await resp.text()
    assert rejected(await harness.events("q2")) == [(ref_id(bad), "anthropic")]
    sent = harness.upstream.last.json()
    assert sent["metadata"] == {"data": b64(bad)}, "a foreign data key was taken for the image"
    assert sent["messages"][0]["content"][1]["source"]["data"] == b64(keep)
    assert no_marker(harness.upstream.last.body)


async def test_a_thousand_and_one_images_with_the_refused_one_last(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    tiny = [make_image(1 + i // 256, 1, color=i % 256) for i in range(1000)]
    bad = png(14)
    harness.upstream.refused[ref_id(bad)] = False
    body = chat(*(image_part("data:image/png;base64," + b64(t)) for t in tiny), image_part(data_url(bad)))
    raw = encoded(body)
    resp = await post(harness, CHAT, raw, session="many")
    # the 1001st image gets no identity: the refusal goes back as it came, nothing is quarantined
    assert resp.status == 400
    assert rejected(await harness.events("many")) == []
    assert harness.upstream.last.body == raw


# --- 1b. defects --------------------------------------------------------------------------------

def _unpadded(data: bytes) -> str:
    """Base64 without its padding (some clients strip it): no identity for the proxy."""
    text = b64(data)
    assert text.endswith("="), "pick bytes whose base64 is padded"
    return text.rstrip("=")


def _opening_with_an_image_without_identity() -> Json:
    good, odd = png(20), png(21)
    return chat(image_part(data_url(good)), image_part("data:image/png;base64," + _unpadded(odd)))


async def test_a_derived_session_stays_when_a_later_turn_quotes_a_data_url(make_harness: MakeHarness) -> None:
    """A derived session must be a function of the opening; here it depends on whether the scan was
    complete (a later message whose text holds ``;base64,`` makes it incomplete)."""
    harness = await make_harness(**RECORDING)
    first = _opening_with_an_image_without_identity()
    later = next_turn("chat", first)
    later["messages"][-1]["content"] = "what about data:image/png;base64," + "A" * 40
    with capture_logs() as logs:
        assert (await post(harness, CHAT, first)).status == 200
        assert (await post(harness, CHAT, later)).status == 200
    sessions = [line["session"] for line in request_lines(logs)]
    assert sessions[0] == sessions[1], (
        "one conversation got two derived sessions: proxying._session derives from the scan's small document, "
        "in which an image whose base64 has no identity (unpadded here) is still the scan's stand-in "
        "'\\x00<nonce>:<run index>' (scan.scan counts its run as used, but it is not in `client`, so "
        "sessions._standing leaves the stand-in in the opening); a later turn that makes the scan incomplete "
        f"decodes the whole body and sees the real base64: {sessions}")


async def test_a_derived_session_is_the_same_in_every_process(make_harness: MakeHarness,
                                                               make_config: Callable[..., Config],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart (or another replica) must derive the same session for the same conversation."""
    a = await make_harness(make_config(**RECORDING))
    body = _opening_with_an_image_without_identity()
    with capture_logs() as logs:
        assert (await post(a, CHAT, body)).status == 200
    # another process: scan.py draws its nonce per process
    nonce = "0123456789abcdef"
    monkeypatch.setattr(scan_module, "_NONCE", nonce)
    monkeypatch.setattr(scan_module, "_MARK", f"\\u0000{nonce}:".encode())
    monkeypatch.setattr(scan_module, "_MARK_TEXT", f"\x00{nonce}:")
    b = await make_harness(make_config(**RECORDING))
    with capture_logs() as more:
        assert (await post(b, CHAT, body)).status == 200
    one, other = request_lines(logs)[0]["session"], request_lines(more)[0]["session"]
    assert one == other, (
        "the same conversation gets another derived session in another process: the per-process nonce of "
        "scan.py's stand-in reaches sessions.derived through an image without identity in the opening "
        f"({one} vs {other}); a rejection recorded before a restart or on another replica is lost")


async def test_a_deeply_nested_body_with_an_image_is_never_a_500(make_harness: MakeHarness) -> None:
    """Around the depth where decoding gives up (msgspec's recursion limit), nothing is a 500:
    sessions._standing and the adapters' walks must not recurse deeper than the decoder did."""
    harness = await make_harness()
    for depth in (100, 400, 460, 470, 480, 490, 900, 5000):
        raw = (b'{"model":"m","messages":[{"role":"user","x":' + b"[" * depth + b"]" * depth +
               b',"content":[{"type":"image_url","image_url":{"url":"' + data_url(png(22)).encode() + b'"}}]}]}')
        for session in (None, "deep"):
            resp = await post(harness, CHAT, raw, session=session)
            assert resp.status in (200, 400), (depth, session, resp.status, await resp.text())


async def test_runs_that_are_no_image_are_not_hashed_or_remembered(make_harness: MakeHarness) -> None:
    """Strings that are no image's must not fill the identity cache (nor cost a hash each)."""
    harness = await make_harness()
    count = 5000
    body = anthropic_body(anthropic_block(png(24)))  # one image: the body is scanned
    body["metadata"] = {"x": [{"data": b64(i.to_bytes(12, "big"))} for i in range(count)]}
    resp = await post(harness, MESSAGES, body, session="noimg")
    assert resp.status == 200, await resp.text()
    identities = harness.app[SERVICES].identities
    assert len(identities._kept) <= 1 and identities.misses <= 1, (
        f"{identities.misses} base64 decodes + sha256 and {len(identities._kept)} cache entries for a body "
        f"with one image and {count} short strings under foreign 'data' keys: scan.scan identifies every run (identities.of_run) before it knows which "
        "runs are images, and MAX_CLIENT_IMAGES bounds only the images found, not the runs hashed")


async def test_the_identity_cache_stays_within_its_bound(make_harness: MakeHarness) -> None:
    """``[policy] inline_cache_bytes`` bounds the cache's memory; tiny runs make it ~20x that."""
    harness = await make_harness(**{"policy.inline_cache_bytes": 256 * 1024})
    identities = harness.app[SERVICES].identities
    for batch in range(4):
        body = anthropic_body(anthropic_block(png(25)))
        body["metadata"] = {"x": [{"data": b64((batch * 10**6 + i).to_bytes(12, "big"))} for i in range(8000)]}
        assert (await post(harness, MESSAGES, body, session="mem")).status == 200
    held = sum(sys.getsizeof(k) + sys.getsizeof(v) + sys.getsizeof(v[0]) + sys.getsizeof(v[1]) + 100
               for k, v in identities._kept.items())
    assert held <= 2 * identities.max_bytes, (
        f"the identity cache holds ~{held // 1024} KiB for a bound of {identities.max_bytes // 1024} KiB: "
        "Identities.size counts only the base64's length, and each entry (an int key, a tuple, the bytes, "
        "the 71-character id, an OrderedDict node) costs ~370 bytes beyond a 16-character run")


async def test_non_utf8_in_a_run_and_a_named_refusal_is_not_a_500(make_harness: MakeHarness) -> None:
    """A refused image next to a run with a byte that is not UTF-8 (JSON the proxy passed through)."""
    harness = await make_harness(**RECORDING)
    bad = png(23)
    junk = b"\xff" * 20
    raw = (b'{"model":"m","max_tokens":10,"messages":[{"role":"user","content":['
           b'{"type":"image","source":{"type":"base64","media_type":"image/png","data":"' + junk + b'"}},'
           b'{"type":"image","source":{"type":"base64","media_type":"image/png","data":"' + b64(bad).encode() +
           b'"}}]}]}')
    answer = anthropic_refusal("messages.0.content.1.image.source.base64: Could not process image")

    async def script(request: web.Request, doc: Any) -> web.StreamResponse | None:
        body = await request.read()
        if b64(bad).encode() in body:
            return web.Response(body=answer, status=400, content_type="application/json")
        return None

    harness.upstream.script = script
    resp = await post(harness, MESSAGES, raw, session="utf")
    assert resp.status != 500, (
        "a 500: the first call went as it came (the scan's small document is valid JSON without the "
        "non-UTF-8 run), the refusal was recorded, and the re-send decodes the whole body "
        f"(body.build: decode_json(raw)), which is not UTF-8: {resp.status} {await resp.text()}")


# --- 2. another session's healthy image ---------------------------------------------------------

async def test_a_stranger_with_another_key_and_the_same_opening_cannot_quarantine_a_victims_image(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    victim_img, junk = png(30), png(31)
    harness.upstream.refused[ref_id(junk)] = False
    # the stranger opens like the victim, adds junk the upstream refuses (unnamed): both are suspects
    stranger = chat(image_part(data_url(victim_img)), image_part(data_url(junk)))
    with capture_logs() as logs:
        assert (await post(harness, CHAT, stranger, headers={"Authorization": "Bearer stranger"})).status == 200
        victim = chat(image_part(data_url(victim_img)), image_part(data_url(junk)))
        harness.upstream.refused.clear()
        assert (await post(harness, CHAT, victim, headers={"Authorization": "Bearer victim"})).status == 200
    lines = request_lines(logs)
    assert lines[0]["session"] != lines[1]["session"]
    assert ref_id(victim_img) in ids_in(harness.upstream.last)


async def test_a_shared_prompt_cache_key_never_lets_another_key_quarantine_a_healthy_image(
        make_harness: MakeHarness) -> None:
    """Rule 3 takes a Responses ``prompt_cache_key`` as the session whatever the credential. Apps set
    one key for many users (it groups requests for the provider's cache): a stranger with another
    API key who opens with the victim's image and some junk gets both quarantined for the victim."""
    harness = await make_harness(**RECORDING)
    victim_img, junk = png(32), png(33)
    harness.upstream.refused[ref_id(junk)] = False

    def responses(*urls: str) -> Json:
        parts: list[Json] = [{"type": "input_text", "text": "look"}, *({"type": "input_image", "image_url": u}
                                                                       for u in urls)]
        return {"model": "m", "prompt_cache_key": "summarize-v1", "input": [{"role": "user", "content": parts}]}

    assert (await post(harness, "/v1/responses", responses(data_url(victim_img), data_url(junk)),
                       headers={"Authorization": "Bearer stranger"})).status == 200
    harness.upstream.refused.clear()
    assert (await post(harness, "/v1/responses", responses(data_url(victim_img)),
                       headers={"Authorization": "Bearer victim"})).status == 200
    assert ref_id(victim_img) in ids_in(harness.upstream.last), (
        "a healthy image of the victim (another API key) became a placeholder: sessions.from_body names the "
        "session 'cache-key:<prompt_cache_key>' without the credential (a derived session is scoped by it, "
        "rule 3 is not), so an unnamed refusal of a stranger's call quarantined it for everyone on that key")


async def test_an_unnamed_refusal_while_a_call_with_the_healthy_image_is_in_flight(make_harness: MakeHarness) -> None:
    """Derived sessions: the victim's call is streaming its success while the same conversation's
    next call (same key, same opening) is refused: the healthy image is not quarantined."""
    harness = await make_harness(**RECORDING)
    good, bad = png(34), png(35)
    streaming, finish = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request, doc: Any) -> web.StreamResponse | None:
        found = {aid for _, aid in inlined(doc)} if doc is not None else set()
        if ref_id(bad) in found:
            return web.Response(body=encoded({"error": {"message": "You uploaded an unsupported image.",
                                                        "type": "invalid_request_error", "param": None,
                                                        "code": "invalid_image_format"}}),
                                status=400, content_type="application/json")
        if doc is None or not doc.get("stream"):
            return None
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": []}\n\n')
        streaming.set()
        await finish.wait()
        await response.write(b"data: [DONE]\n\n")
        return response

    harness.upstream.script = slow
    key = {"Authorization": "Bearer same"}
    opening = chat(image_part(data_url(good)))
    flying = asyncio.create_task(post(harness, CHAT, {**opening, "stream": True}, headers=key))
    await asyncio.wait_for(streaming.wait(), 5)
    later = next_turn("chat", opening)
    later["messages"][-1]["content"] = [{"type": "image_url", "image_url": {"url": data_url(bad)}}]
    with capture_logs() as logs:
        resp = await post(harness, CHAT, later, headers=key)
    finish.set()
    assert (await flying).status == 200
    assert resp.status == 200, await resp.text()
    session = request_lines(logs)[0]["session"]
    assert rejected(await harness.events(session)) == [(ref_id(bad), "openai")]


# --- 3. determinism: replay of client-inlined images -------------------------------------------

@pytest.mark.parametrize("mode", ["full", "metadata"])
async def test_replay_rebuilds_an_incompletely_scanned_body_with_a_placeholder(make_harness: MakeHarness,
                                                                             mode: str) -> None:
    harness = await make_harness(**{"record.mode": mode})
    keep, bad = png(40), png(41)
    harness.upstream.refused[ref_id(bad)] = False
    # a text quoting a data URL makes the scan incomplete: the whole body is decoded
    body = chat(image_part(data_url(keep)), image_part(data_url(bad)), text="x;base64," + b64(keep))
    assert (await post(harness, CHAT, chat(image_part(data_url(keep))), session="rp")).status == 200
    raws = [encoded(body), encoded(next_turn("chat", body))]
    sent = []
    for raw in raws:
        before = len(harness.upstream.received)
        resp = await post(harness, CHAT, raw, session="rp")
        assert resp.status == 200
        sent += harness.upstream.received[before:]
    services = harness.app[SERVICES]
    await services.recording.drain()
    records = [e for e in await harness.events("rp") if e["type"] == "request/recorded"][1:]
    assert len(records) == len(sent) == 3  # refused, re-sent, later
    for record, upstream_got, inbound in zip(records, sent, (raws[0], raws[0], raws[1])):
        rebuilt = await rebuild(services.log, services.store, "rp", record["seq"],
                                None if mode == "full" else inbound)
        assert rebuilt.matches, (record["data"]["request_id"], rebuilt.first_difference, rebuilt.reason)
        assert rebuilt.body == upstream_got.body


async def test_replay_never_takes_a_body_that_spells_an_identity_for_the_recorded_one(make_harness: MakeHarness
                                                                                     ) -> None:
    """Replay checks that a given inbound body is the recorded call's. A body that spells the
    image's identity in its text where the recorded one carried the image must not pass (the
    spliced digest frames its pieces: a literal identity is bytes, never an image's run)."""
    harness = await make_harness(**RECORDING)
    image = png(42)
    raw = encoded(chat(image_part(data_url(image))))
    assert (await post(harness, CHAT, raw, session="forge")).status == 200
    services = harness.app[SERVICES]
    await services.recording.drain()
    [record] = [e for e in await harness.events("forge") if e["type"] == "request/recorded"]
    for spelled in (f"<{ref_id(image)}>", f"I{ref_id(image)}", ref_id(image)):
        forged = raw.replace(b64(image).encode(), spelled.encode())
        assert forged != raw and sha256_id(forged) != record["data"]["inbound_digest"]
        with pytest.raises(Exception) as refused:
            await rebuild(services.log, services.store, "forge", record["seq"], forged)
        assert getattr(refused.value, "code", "") == "INBOUND_MISMATCH", refused.value
    rebuilt = await rebuild(services.log, services.store, "forge", record["seq"], raw)  # the real one passes
    assert rebuilt.matches


async def test_restart_sends_the_same_bytes_for_a_body_with_quoted_base64(make_harness: MakeHarness,
                                                                          make_config: Callable[..., Config]) -> None:
    a = await make_harness(make_config(**RECORDING))
    keep, bad = png(43), png(44)
    a.upstream.refused[ref_id(bad)] = True
    body = chat(image_part(data_url(keep)), image_part(data_url(bad)), text="q;base64," + b64(bad))
    with capture_logs() as logs:
        assert (await post(a, CHAT, body)).status == 200
    first = a.upstream.last.body
    b = await make_harness(make_config(**RECORDING))
    a.upstream.refused.clear()
    with capture_logs() as more:
        assert (await post(b, CHAT, body)).status == 200
    assert request_lines(logs)[0]["session"] == request_lines(more)[0]["session"]
    assert b.upstream.last.body == first
    assert no_marker(first)
    assert json.loads(first)["messages"][0]["content"][0]["text"] == "q;base64," + b64(bad)


# --- 4. Accept-Encoding ------------------------------------------------------------------------

async def test_accept_encoding_identity_refused_is_not_turned_into_identity(make_harness: MakeHarness) -> None:
    harness = await make_harness()
    resp = await harness.client.post(CHAT, data=encoded(chat()), headers={
        "Content-Type": "application/json", "Accept-Encoding": "gzip;q=0, identity;q=1"})
    assert resp.status == 200
    assert harness.upstream.last.headers.get("Accept-Encoding") == "identity;q=1"


# --- 5. a real agent client: two images, one refused ---------------------------------------------

@pytest.mark.timeout(600)
@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
async def test_codex_with_two_images_keeps_the_healthy_one_when_the_other_is_refused(
        named: bool, aiohttp_client: Any, aiohttp_server: Any, make_config: Callable[..., Config],
        tmp_path: Any) -> None:
    from projectionist.proxy.edge.app import create_app, open_log, open_store
    from tests.agent_upstream import ANSWER, ScriptedUpstream
    from tests.agents import codex, codex_config, run_agent
    from tests.fakes import CountingStore

    scripted = ScriptedUpstream()
    server = await aiohttp_server(scripted.app(), host="127.0.0.1")
    scripted.url = str(server.make_url("")).rstrip("/")
    config = make_config(**{"record.mode": "metadata", "upstreams.openai": {"format": "openai", "url": scripted.url}})
    live = await aiohttp_client(create_app(config, store=CountingStore(open_store(config)), log=open_log(config)),
                                server_kwargs={"host": "127.0.0.1"})
    cwd, home = tmp_path / "work", tmp_path / "home"
    cwd.mkdir()
    healthy, broken = make_image(64, 48, color=5), make_image(64, 48, color=6)
    (cwd / "a.png").write_bytes(healthy)
    (cwd / "b.png").write_bytes(broken)
    scripted.refused[ref_id(broken)] = named
    codex_home = home / ".codex"
    home.mkdir(parents=True)
    codex_config(codex_home, str(live.make_url("")).rstrip("/") + "/v1")
    rc, out, err = await run_agent([str(codex()), "exec", "--skip-git-repo-check", "Compare the two screenshots",
                                    "-i", "a.png", "-i", "b.png"],
                                   {"HOME": str(home), "CODEX_HOME": str(codex_home), "PROJ_API_KEY": "sk-dummy"},
                                   cwd, timeout=240)
    assert rc == 0 and ANSWER in out, (rc, out[-2000:], err[-2000:])
    calls = scripted.requests("/v1/responses")
    last = [aid for _, aid in calls[-1].images]
    assert ref_id(broken) not in last
    if named:
        assert last == [ref_id(healthy)], "a named refusal of one image must keep the other"
    # unnamed: both were new to the session, so both are suspects (README: 'Several suspects are all
    # quarantined'); the call still goes through
