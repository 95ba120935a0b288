"""A session nobody named stays one session through its client's compaction (issue 41, item 1;
``proxy.call.conversations``). Qwen Code and Gemini CLI compress a long conversation into a
summary that becomes its first message; Gemini CLI keeps the latest turns as they were, Qwen
Code 0.24 puts a reference text where each image was and attaches the latest images anew to the
last message. The derived session (named by the opening) changes, but the images were linked
to the old one, so the compacted conversation continues it: what it learnt about its images (here, a refusal put
down to two images, which stays in its session) holds, with no refused round trip. Another
credential or another tenant sending the same messages continues nothing; restart and replay
decide alike; concurrent first requests, also on two replicas, make one link."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from projectionist.proxy.call.replay import rebuild
from projectionist.proxy.config import Config
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import ADMIN, Harness
from tests.imaging import ref_id
from tests.system.test_inline_images import (RECORDING, data_url, on_both, placeholder, png, post, rejected,
                                             request_lines)

MakeHarness = Callable[..., Awaitable[Harness]]
SYSTEM = "You are Qwen Code, an interactive CLI agent."
REMINDER = "<system-reminder>\nThe current date is: Sunday, December 6, 2026.\n</system-reminder>"
KEY = {"Authorization": "Bearer sk-one"}


def image_message(*shots: bytes) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "The layout breaks in these: @a.png @b.png"}]
    parts += [{"type": "image_url", "image_url": {"url": data_url(shot)}} for shot in shots]
    return {"role": "user", "content": parts}


def conversation(*shots: bytes, turns: int = 1) -> dict[str, Any]:
    """A text first turn (its reminder part Qwen Code drops later), then the screenshots, then
    ``turns - 1`` more questions."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": "Fix the CSS."}]},
        {"role": "assistant", "content": "Which page?"},
        image_message(*shots)]
    for n in range(1, turns):
        messages += [{"role": "assistant", "content": f"answer {n}"}, {"role": "user", "content": f"and then {n}?"}]
    return {"model": "qwen3-coder-plus", "messages": messages}


def compacted(*shots: bytes, summary: str = "<state_snapshot>the user fixes the CSS</state_snapshot>") -> dict[str, Any]:
    """The conversation after Gemini CLI's compression: its summary first, the latest turns as they were."""
    return {"model": "qwen3-coder-plus", "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": summary},
        {"role": "assistant", "content": "Got it. Thanks for the additional context!"},
        image_message(*shots),
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "and after the compression?"}]}


def reattached(*shots: bytes) -> dict[str, Any]:
    """The conversation after Qwen Code 0.24.4's compaction (``buildReattachParts``): the summary
    first, each image of the compacted turns a reference text, the latest images attached anew
    to the last message behind a text of its own."""
    last: list[dict[str, Any]] = [{"type": "text", "text": "and after the compression?"},
                                  {"type": "text", "text": "[Re-attached images from before the compaction]"}]
    last += [{"type": "image_url", "image_url": {"url": data_url(shot)}} for shot in shots]
    return {"model": "qwen3-coder-plus", "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "<state_snapshot>the user fixes the CSS; [image #1a2b3c]</state_snapshot>"},
        {"role": "assistant", "content": "Got it. Thanks for the additional context!"},
        {"role": "user", "content": last}]}


async def send(harness: Harness, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    """``body`` sent with no session named: the request's log line."""
    with capture_logs() as logs:
        resp = await post(harness, "/v1/chat/completions", body, headers={**KEY, **(headers or {})})
        assert resp.status == 200, await resp.text()
    [line] = request_lines(logs)
    return line


def sent_texts(harness: Harness) -> list[str]:
    return [p["text"] for m in harness.upstream.last.json()["messages"] if isinstance(m["content"], list)
            for p in m["content"] if p.get("type") == "text"]


async def refused_pair(harness: Harness, color: int) -> tuple[bytes, bytes, str]:
    """Two screenshots, the first refused in words that name no place (both suspects: the refusal
    stays in the session), sent in turns 1 and 2 of a conversation: its derived session."""
    one, two = png(color), png(color + 1)
    harness.upstream.refused[ref_id(one)] = False
    await send(harness, conversation())  # no image: no session derived
    first = await send(harness, conversation(one, two))
    assert first["session_source"] == "derived" and harness.upstream.refusals == 1
    assert sorted(rejected(await harness.events(first["session"]))) == sorted(
        [(ref_id(one), "openai"), (ref_id(two), "openai")])
    later = await send(harness, conversation(one, two, turns=2))
    assert later["session"] == first["session"] and harness.upstream.refusals == 1
    return one, two, first["session"]


@on_both
async def test_a_compacted_conversation_continues_its_session(make_harness: MakeHarness, backend: Any,
                                                              make_config: Callable[..., Config]) -> None:
    harness = await make_harness(make_config(**RECORDING))
    one, two, session = await refused_pair(harness, 130)
    line = await send(harness, reattached(one, two))
    assert (line["session"], line["session_source"]) == (session, "continued")
    assert harness.upstream.refusals == 1
    line = await send(harness, compacted(one, two))
    assert (line["session"], line["session_source"]) == (session, "continued")
    assert harness.upstream.refusals == 1  # the session's refusal held: no refused round trip
    assert placeholder(ref_id(one)) in sent_texts(harness) and placeholder(ref_id(two)) in sent_texts(harness)
    upstream_bytes = harness.upstream.last.body
    # a turn after the compaction, and a second compaction that kept the same image message
    assert (await send(harness, {**compacted(one, two), "messages": [
        *compacted(one, two)["messages"], {"role": "assistant", "content": "done"},
        {"role": "user", "content": "thanks"}]}))["session"] == session
    assert (await send(harness, compacted(one, two, summary="an older summary, summarised")))["session"] == session
    # the compacted call is recorded in the session's own log and rebuilds byte for byte from it
    log = harness.app[SERVICES].log
    await harness.app[SERVICES].recording.drain()
    replayed = await rebuild(log, harness.store, session, inbound=msgspec.json.encode(compacted(one, two)),
                             request_id=line["request_id"])
    assert replayed.matches and replayed.body == upstream_bytes
    # a restarted proxy on the same data continues it alike, with the same bytes upstream
    restarted = await make_harness(make_config(**RECORDING))
    assert (await send(restarted, compacted(one, two)))["session"] == session
    assert restarted.upstream.last.body == upstream_bytes and harness.upstream.refusals == 1


async def test_a_new_image_joins_the_session_it_was_first_sent_in(make_harness: MakeHarness) -> None:
    """After the compaction, a new screenshot is linked to the continued session: a second
    compaction that kept only it still continues the conversation."""
    harness = await make_harness(**RECORDING)
    one, two, session = await refused_pair(harness, 132)
    three = png(144)
    body = reattached(one, two)
    body["messages"] += [{"role": "assistant", "content": "ok"}, image_message(three)]
    assert (await send(harness, body))["session"] == session
    line = await send(harness, reattached(three))
    assert (line["session"], line["session_source"]) == (session, "continued")


async def test_another_credential_continues_nothing(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    one, two, session = await refused_pair(harness, 134)
    line = await send(harness, compacted(one, two), {"Authorization": "Bearer sk-two"})
    assert line["session"] != session and line["session_source"] == "derived"
    assert harness.upstream.refusals == 2


async def test_another_tenant_continues_nothing(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_TENANT_TOKENS", "alice:sk-one bob:sk-bob")
    harness = await make_harness(**RECORDING)
    one, two, session = await refused_pair(harness, 136)
    assert session.startswith("alice~derived:")
    assert (await send(harness, compacted(one, two)))["session"] == session
    line = await send(harness, compacted(one, two), {"Authorization": "Bearer sk-bob"})
    assert line["session"].startswith("bob~derived:") and line["session_source"] == "derived"
    assert harness.upstream.refusals == 2


@on_both
async def test_concurrent_first_requests_on_two_replicas_make_one_link(
        make_harness: MakeHarness, backend: Any, make_config: Callable[..., Config]) -> None:
    """Two conversations that open differently send the same new screenshot at once, on two
    replicas of one log: both land in one session, and the image is linked once."""
    first = await make_harness(make_config(**RECORDING))
    second = await make_harness(make_config(**RECORDING))
    shot = png(138)
    bodies = [conversation(shot), reattached(shot)]
    with capture_logs() as logs:
        answers = await asyncio.gather(*(post(h, "/v1/chat/completions", b, headers=KEY)
                                         for h in (first, second) for b in bodies))
    assert [resp.status for resp in answers] == [200] * 4
    lines = request_lines(logs)
    assert len(lines) == 4 and len({line["session"] for line in lines}) == 1
    index = [s for s in await sessions(first) if s.startswith("~conversations.")]
    links = [e for s in index for e in await first.events(s) if e["type"] == "conversation/linked"]
    assert len(links) == 1 and links[0]["data"]["session"] == lines[0]["session"]


async def test_a_named_session_reads_and_writes_no_index(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    line = await send(harness, conversation(png(139)), {"X-Session-Id": "mine"})
    assert line["session"] == "mine"
    assert not [s for s in await sessions(harness) if s.startswith("~conversations")]


@pytest.mark.parametrize("named", ["~conversations.a@0123456789ab", "~conversations"])
async def test_no_client_names_an_index(make_harness: MakeHarness, named: str) -> None:
    harness = await make_harness(**RECORDING)
    resp = await post(harness, "/v1/chat/completions", conversation(png(140)), session=named)
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "INVALID_SESSION_ID"
    assert harness.upstream.received == []


async def sessions(harness: Harness) -> list[str]:
    resp = await harness.client.get("/admin/sessions", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    return [s["session"] for s in (await resp.json())["sessions"]]


async def test_an_index_that_keeps_changing_never_fails_the_request(make_harness: MakeHarness,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Another replica that wins every append to the index (the fault): the request keeps its
    derived session, answered as ever, and names why on its log line; once the index takes
    writes again, the next request links its messages."""
    from projectionist.policy.errors import AppendConflict

    harness = await make_harness(**RECORDING)
    inner = harness.app[SERVICES].log.inner
    append = inner.append

    async def losing(session_id: str, expected: int | None, data: Any, **kw: Any) -> Any:
        if session_id.startswith("~conversations"):
            raise AppendConflict(session_id, expected or 0, (expected or 0) + 1)
        return await append(session_id, expected, data, **kw)

    monkeypatch.setattr(inner, "append", losing)
    shot = png(141)
    line = await send(harness, conversation(shot))
    assert line["session_source"] == "derived" and line["session_index"] == "SESSION_CONTENDED"
    monkeypatch.setattr(inner, "append", append)
    again = await send(harness, conversation(shot, turns=2))
    assert again["session"] == line["session"] and "session_index" not in again
    assert (await send(harness, compacted(shot)))["session"] == line["session"]


async def test_a_side_call_with_a_prompt_of_its_own_continues_nothing(make_harness: MakeHarness) -> None:
    """A memory subagent, or another bot of the same key, carrying the same screenshot message
    under another system prompt is another conversation: the index's digest holds the prompt."""
    harness = await make_harness(**RECORDING)
    one, two, session = await refused_pair(harness, 142)
    body = reattached(one, two)
    body["messages"][0]["content"] = "You are a memory extraction subagent."
    line = await send(harness, body)
    assert line["session"] != session and line["session_source"] == "derived"
    assert harness.upstream.refusals == 2  # the control: without its session, the guess is asked again
