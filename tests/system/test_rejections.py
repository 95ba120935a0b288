"""An image the provider refuses never bricks a session: rejection quarantine and one re-send.

The fake upstream refuses chosen images in each provider's real error shape (``tests.refusing``).
Each test drives the proxy as a client would, and reads the upstream's side and the session log.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from projectionist.policy.rejection import message_digest
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.call.replay import rebuild
from tests.calls import recorded_calls
from tests.conftest import ADMIN, BACKENDS, Harness
from tests.imaging import make_image, ref_id
from tests.refusing import OPENAI_MESSAGE
from tests.system.test_sdks import anthropic_client, anthropic_messages, chat_messages, openai_client

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
RECORDING = {"record.mode": "metadata"}


def quarantines(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "attachment/rejected"]


def images_sent(body: dict[str, Any]) -> list[str]:
    """The ids of the images a chat call inlined, in order."""
    out = []
    for message in body["messages"]:
        for part in message["content"] if isinstance(message["content"], list) else []:
            if part.get("type") == "image_url":
                out.append(ref_id(base64.b64decode(part["image_url"]["url"].split(",", 1)[1])))
    return out


def texts_sent(body: dict[str, Any]) -> list[str]:
    return [p["text"] for m in body["messages"] for p in (m["content"] if isinstance(m["content"], list) else [])
            if p.get("type") == "text"]


async def admitted(harness: Harness, *colors: int) -> list[str]:
    return [await harness.admit(make_image(color=c)) for c in colors]


async def test_one_new_bad_image_among_accepted_ones_is_quarantined_and_the_call_sent_again(harness: Harness,
                                                                                            make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    good, bad = await admitted(harness, 1, 2)
    assert (await harness.chat("s1", good)).status == 200  # the upstream accepts `good` once
    harness.upstream.refused[bad] = False
    before = len(harness.upstream.received)
    resp = await harness.chat("s1", good, bad)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["choices"][0]["message"]["content"] == "Hello from the fake upstream."
    first, second = harness.upstream.received[before:]
    assert images_sent(first.json()) == [good, bad]
    assert images_sent(second.json()) == [good]
    assert f"[image unavailable: rejected (sha256:{bad[7:15]})]" in texts_sent(second.json())
    [q] = quarantines(await harness.events("s1"))
    assert q == {"attachment_id": bad, "format": "openai", "suspects": 1,
                 "message_digest": message_digest(OPENAI_MESSAGE)}
    # later requests derive the placeholder from the log: one call, never refused again
    before = len(harness.upstream.received)
    assert (await harness.chat("s1", good, bad)).status == 200
    [again] = harness.upstream.received[before:]
    assert images_sent(again.json()) == [good]


async def test_two_new_bad_images_are_both_quarantined_with_their_suspect_count(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    good, bad1, bad2 = await admitted(harness, 1, 2, 3)
    assert (await harness.chat("s2", good)).status == 200
    harness.upstream.refused.update({bad1: False, bad2: False})
    resp = await harness.chat("s2", good, bad1, bad2)
    assert resp.status == 200
    found = quarantines(await harness.events("s2"))
    assert [(q["attachment_id"], q["suspects"]) for q in found] == [(bad1, 2), (bad2, 2)]
    assert images_sent(harness.upstream.last.json()) == [good]


async def test_an_image_accepted_before_is_never_quarantined_for_a_rejection(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    [seen] = await admitted(harness, 4)
    assert (await harness.chat("s3", seen)).status == 200
    harness.upstream.refused[seen] = False  # the upstream now refuses it: not this image's fault
    before = len(harness.upstream.received)
    resp = await harness.chat("s3", seen)
    assert resp.status == 400
    body = await resp.json()
    assert body["error"]["code"] == "invalid_image_format"  # the provider's own error, unchanged
    assert len(harness.upstream.received) == before + 1  # no re-send
    assert quarantines(await harness.events("s3")) == []


async def test_a_re_sent_call_refused_again_returns_the_providers_error_no_loops(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    seen, bad = await admitted(harness, 5, 6)
    assert (await harness.chat("s4", seen)).status == 200
    harness.upstream.refused.update({bad: False})
    harness.upstream.refused[seen] = False  # the second call carries `seen`, which is refused too
    before = len(harness.upstream.received)
    resp = await harness.chat("s4", seen, bad)
    assert resp.status == 400 and (await resp.json())["error"]["message"] == OPENAI_MESSAGE
    assert len(harness.upstream.received) == before + 2  # the call and exactly one re-send
    assert [q["attachment_id"] for q in quarantines(await harness.events("s4"))] == [bad]


async def test_a_named_site_is_exact_even_in_a_tool_result(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    fresh, bad = await admitted(harness, 7, 8)
    harness.upstream.refused[bad] = True  # Anthropic names the place: messages.0.content.1.content.0
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": f"attachment:{fresh}"}},
        {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "url", "url": f"attachment:{bad}?name=shot.png"}}]}]}]}
    resp = await harness.client.post("/v1/messages", json=body, headers={"X-Session-Id": "s5"})
    assert resp.status == 200, await resp.text()
    [q] = quarantines(await harness.events("s5"))
    assert (q["attachment_id"], q["format"], q["suspects"], q["name"]) == (bad, "anthropic", 1, "shot.png")
    sent = harness.upstream.last.json()["messages"][0]["content"]
    assert sent[0]["source"]["type"] == "base64"  # the never-accepted image the error did not name stays
    assert sent[1]["content"][0] == {"type": "text", "text": f'[image unavailable: rejected; "shot.png" (sha256:{bad[7:15]})]'}


async def test_a_rejection_holds_only_for_the_format_that_refused(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    [bad] = await admitted(harness, 9)
    harness.upstream.refused[bad] = False
    assert (await harness.chat("s6", bad)).status == 200
    assert images_sent(harness.upstream.last.json()) == []
    harness.upstream.refused.clear()
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": f"attachment:{bad}"}}]}]}
    resp = await harness.client.post("/v1/messages", json=body, headers={"X-Session-Id": "s6"})
    assert resp.status == 200
    assert harness.upstream.last.json()["messages"][0]["content"][0]["source"]["type"] == "base64"


async def test_a_streamed_call_is_re_sent_before_its_first_byte(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    [bad] = await admitted(harness, 10)
    harness.upstream.refused[bad] = False
    resp = await harness.chat("s7", bad, stream=True)
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    text = await resp.text()
    assert "tok1" in text and text.rstrip().endswith("data: [DONE]")
    assert len(quarantines(await harness.events("s7"))) == 1


async def test_concurrent_requests_refused_for_one_image_record_one_transition(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    [bad] = await admitted(harness, 11)
    harness.upstream.refused[bad] = False
    answers = await asyncio.gather(*(harness.chat("s8", bad) for _ in range(8)))
    assert [a.status for a in answers] == [200] * 8
    assert len(quarantines(await harness.events("s8"))) == 1


async def test_without_any_session_the_providers_error_goes_back(make_harness: Any) -> None:
    harness = await make_harness(**{"server.client_sessions": False})
    [bad] = await admitted(harness, 12)
    harness.upstream.refused[bad] = False
    resp = await harness.chat(None, bad)
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_image_format"
    assert harness.upstream.refusals == 1


async def test_an_inlined_image_in_a_call_that_names_no_session_is_rescued_in_its_derived_session(
        make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    bad = make_image(color=12)
    harness.upstream.refused[ref_id(bad)] = False
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(bad).decode()}}]}]}
    first = await harness.client.post("/v1/chat/completions", json=body)
    assert first.status == 200 and harness.upstream.refusals == 1
    placeholder = f"[image unavailable: rejected ({ref_id(bad)[:15]})]"
    assert texts_sent(harness.upstream.last.json()) == ["look", placeholder]
    again = await harness.client.post("/v1/chat/completions", json=body)  # re-sent: the same derived session
    assert again.status == 200 and harness.upstream.refusals == 1
    assert texts_sent(harness.upstream.last.json()) == ["look", placeholder]
    listed = await (await harness.client.get("/admin/sessions", headers=ADMIN)).json()
    [derived] = [s["session"] for s in listed["sessions"] if not s["session"].startswith(("~refusals", "~conversations"))]  # and the tenant's
    assert derived.startswith("derived:")
    assert [q["attachment_id"] for q in quarantines(await harness.events(derived))] == [ref_id(bad)]


async def test_references_in_a_call_that_names_no_session_keep_the_sessionless_policy(harness: Harness) -> None:
    [bad] = await admitted(harness, 12)
    harness.upstream.refused[bad] = False
    resp = await harness.chat(None, bad)
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_image_format"
    assert harness.upstream.refusals == 1


async def test_both_calls_are_recorded_and_replay_rebuilds_each_byte_for_byte(make_harness: Any) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    good, bad = await admitted(harness, 13, 14)
    assert (await harness.chat("s9", good)).status == 200
    harness.upstream.refused[bad] = False
    before = len(harness.upstream.received)
    resp = await harness.chat("s9", good, bad)
    assert resp.status == 200
    refused, resent = harness.upstream.received[before:]
    request_id = resp.headers["x-projectionist-request-id"]
    services = harness.app[SERVICES]
    await services.recording.drain()
    events = await harness.events("s9")
    calls = {e["data"]["request_id"]: e for e in events if e["type"] == "request/recorded"}
    answers = {r["data"]["request_id"]: outcome and outcome["status"] for r, outcome in recorded_calls(events)}
    assert answers[request_id] == 400 and answers[f"{request_id}.2"] == 200
    for rid, sent in ((request_id, refused), (f"{request_id}.2", resent)):
        rebuilt = await rebuild(services.log, services.store, "s9", calls[rid]["seq"])
        assert rebuilt.matches and rebuilt.body == sent.body, rid


async def test_explicit_recovery_lifts_a_rejection_once_the_bytes_verify(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    [bad] = await admitted(harness, 15)
    harness.upstream.refused[bad] = False
    assert (await harness.chat("s10", bad)).status == 200
    view = await (await harness.client.get("/admin/sessions/s10/quarantine", headers=ADMIN)).json()
    assert [(q["attachment_id"], q["format"]) for q in view["quarantined"]] == [(bad, "openai")]
    harness.upstream.refused.clear()
    resp = await harness.client.post(f"/admin/sessions/s10/attachments/{bad}/recover", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    assert (await harness.chat("s10", bad)).status == 200
    assert images_sent(harness.upstream.last.json()) == [bad]


# --- through the official SDKs, unmodified; and the Gemini and Responses shapes ---------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_openai_sdk_sees_one_successful_answer(make_harness: Any, stream: bool) -> None:
    harness = await make_harness(**RECORDING)
    good, bad = await admitted(harness, 20, 21)
    async with openai_client(harness, "sdk-o") as client:
        await client.chat.completions.create(model="m", messages=chat_messages(good))  # type: ignore[arg-type]
        harness.upstream.refused[bad] = False
        if stream:
            chunks = await client.chat.completions.create(model="m", messages=chat_messages(good, bad), stream=True)  # type: ignore[arg-type]
            assert "".join([c.choices[0].delta.content or "" async for c in chunks]) == "tok1 tok2 tok3 tok4 "
        else:
            completion = await client.chat.completions.create(model="m", messages=chat_messages(good, bad))  # type: ignore[arg-type]
            assert completion.choices[0].message.content == "Hello from the fake upstream."
    assert images_sent(harness.upstream.last.json()) == [good]
    assert [q["attachment_id"] for q in quarantines(await harness.events("sdk-o"))] == [bad]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
async def test_the_anthropic_sdk_sees_one_successful_answer(make_harness: Any, stream: bool, named: bool) -> None:
    harness = await make_harness(**RECORDING)
    good, bad = await admitted(harness, 22, 23)
    async with anthropic_client(harness, "sdk-a") as client:
        await client.messages.create(model="m", max_tokens=5, messages=anthropic_messages(good))  # type: ignore[arg-type]
        harness.upstream.refused[bad] = named
        if stream:
            async with client.messages.stream(model="m", max_tokens=5, messages=anthropic_messages(good, bad)) as s:  # type: ignore[arg-type]
                assert "".join([t async for t in s.text_stream]) == "tok0 tok1 tok2 tok3 tok4 "
        else:
            message = await client.messages.create(model="m", max_tokens=5, messages=anthropic_messages(good, bad))  # type: ignore[arg-type]
            assert message.content[0].text == "Hello from the fake upstream."  # type: ignore[union-attr]
    blocks = harness.upstream.last.json()["messages"][0]["content"]
    assert [b["type"] for b in blocks] == ["text", "image", "text"]
    assert blocks[2]["text"] == f"[image unavailable: rejected (sha256:{bad[7:15]})]"
    [q] = quarantines(await harness.events("sdk-a"))
    assert (q["attachment_id"], q["format"]) == (bad, "anthropic")


async def test_gemini_and_responses_refusals_are_handled_the_same(make_harness: Any, upstream: Any) -> None:
    harness = await make_harness(**{**RECORDING, "upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    [bad] = await admitted(harness, 24)
    harness.upstream.refused[bad] = False
    gemini = {"contents": [{"role": "user", "parts": [{"text": "look"}, {"file_data": {
        "mime_type": "image/png", "file_uri": f"attachment:{bad}"}}]}]}
    resp = await harness.client.post("/v1beta/models/m:generateContent", json=gemini, headers={"X-Session-Id": "g"})
    assert resp.status == 200, await resp.text()
    assert harness.upstream.last.json()["contents"][0]["parts"][1] == {
        "text": f"[image unavailable: rejected (sha256:{bad[7:15]})]"}
    responses = {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": f"attachment:{bad}"}]}]}
    resp = await harness.client.post("/v1/responses", json=responses, headers={"X-Session-Id": "g"})
    assert resp.status == 200, await resp.text()
    assert harness.upstream.last.json()["input"][0]["content"][0]["type"] == "input_text"
    assert [q["format"] for q in quarantines(await harness.events("g"))] == ["gemini", "openai"]


async def test_after_a_rejection_restart_and_fork_send_the_same_bytes(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    good, bad = await admitted(harness, 30, 31)
    assert (await harness.chat("s11", good)).status == 200
    harness.upstream.refused[bad] = False
    assert (await harness.chat("s11", good, bad)).status == 200
    resent = harness.upstream.last.body
    harness.upstream.refused.clear()  # the upstream would take it now: the log still decides
    restarted = await make_harness(**RECORDING)  # a second process on the same store and log
    assert (await restarted.chat("s11", good, bad)).status == 200
    assert harness.upstream.last.body == resent
    resp = await restarted.client.post("/admin/sessions/s11/fork", json={"new_session_id": "s11-fork"}, headers=ADMIN)
    assert resp.status == 201
    assert (await restarted.chat("s11-fork", good, bad)).status == 200
    assert harness.upstream.last.body == resent
