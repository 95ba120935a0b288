"""A session nobody named stays one session through its client's compaction (issue 41, item 1;
``proxy.call.conversations``). Qwen Code and Gemini CLI compress a long conversation into a
summary that becomes its first message; Gemini CLI keeps the latest turns as they were, Qwen
Code 0.24 puts a reference text where each image was and attaches the latest images anew to the
last message. The derived session (named by the opening) changes, but the images were linked
to the old one, so the compacted conversation continues it: what it learnt about its images (here, a refusal put
down to two images, which stays in its session) holds, with no refused round trip. Another
credential or another tenant sending the same messages continues nothing; restart and replay
decide alike; concurrent first calls, also on two replicas, make one link; an index the log
cannot read or write never fails or holds up a call."""

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
from tests.system.test_inline_images import (RECORDING, background_settled, data_url, on_both, placeholder, png,
                                             post, rejected, request_lines)

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
    await background_settled(harness)  # the answered call's images linked, off the request
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
    replicas of one log: each keeps its own session, the image is linked once (the first link
    holds), and a later compaction continues the linked one on either replica."""
    first = await make_harness(make_config(**RECORDING))
    second = await make_harness(make_config(**RECORDING))
    shot = png(138)
    bodies = [conversation(shot), reattached(shot)]
    with capture_logs() as logs:
        answers = await asyncio.gather(*(post(h, "/v1/chat/completions", b, headers=KEY)
                                         for h in (first, second) for b in bodies))
        assert [resp.status for resp in answers] == [200] * 4
        await background_settled(first)
        await background_settled(second)
    assert len(request_lines(logs)) == 4
    index = [s for s in await sessions(first) if s.startswith("~conversations.")]
    links = [e for s in index for e in await first.events(s) if e["type"] == "conversation/linked"]
    assert len(links) == 1
    linked = links[0]["data"]["session"]
    body = compacted(shot)
    body["messages"][1]["content"] = "another summary"
    assert (await send(first, body))["session"] == linked
    assert (await send(second, body))["session"] == linked


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
    """Another replica that wins every append to the index (the fault): the call is answered as
    ever and links nothing; once the index takes writes again, the next call links its image."""
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
    assert line["session_source"] == "derived"
    assert not [s for s in await sessions(harness) if s.startswith("~conversations")]
    monkeypatch.setattr(inner, "append", append)
    again = await send(harness, conversation(shot, turns=2))
    assert again["session"] == line["session"]
    assert (await send(harness, reattached(shot)))["session"] == line["session"]


async def test_an_index_the_log_cannot_read_in_time_never_holds_up_the_call(
        make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of the index that hangs (a stalled disk): the call waits ``conversations.TIMEOUT``
    at most, keeps its derived session, and its log line says why."""
    from projectionist.proxy.call import conversations

    harness = await make_harness(**RECORDING)
    monkeypatch.setattr(conversations, "TIMEOUT", 0.3)
    inner = harness.app[SERVICES].log.inner
    read = inner.read

    async def hanging(session_id: str, after_seq: int = 0) -> Any:
        if session_id.startswith("~conversations"):
            await asyncio.sleep(30)
        return await read(session_id, after_seq)

    monkeypatch.setattr(inner, "read", hanging)
    started = asyncio.get_running_loop().time()
    line = await send(harness, conversation(png(143)))
    assert asyncio.get_running_loop().time() - started < 3
    assert line["session_source"] == "derived" and line["session_index"] == "TIMEOUT"


async def test_a_held_write_lock_delays_no_call(make_harness: MakeHarness) -> None:
    """Another process holds the SQLite write lock (a prune, a backup): a call with a new image
    is answered as one with a named session is, without waiting for the lock; its link waits
    off the call, and is written once the lock is let go (by a later call)."""
    import sqlite3
    import time

    harness = await make_harness(**RECORDING, **{"log.busy_timeout": 2.0})
    await send(harness, conversation(png(145)))
    holder = sqlite3.connect(str(harness.app[SERVICES].config.log_path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.perf_counter()
        with capture_logs():
            resp = await post(harness, "/v1/chat/completions", conversation(png(146)), headers=KEY)
        assert resp.status == 200 and time.perf_counter() - started < 1.5
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await background_settled(harness)
    line = await send(harness, conversation(png(146), turns=2))
    assert (await send(harness, reattached(png(146))))["session"] == line["session"]


async def test_a_call_that_failed_links_nothing(make_harness: MakeHarness) -> None:
    """A made-up key's 401: the call's images are not linked, so no stranger fills an index."""
    from aiohttp import web

    harness = await make_harness(**RECORDING)

    async def unauthorized(request: Any, body: Any) -> web.StreamResponse:
        return web.json_response({"error": {"message": "Incorrect API key", "code": "invalid_api_key"}}, status=401)

    harness.upstream.script = unauthorized
    with capture_logs():
        resp = await post(harness, "/v1/chat/completions", conversation(png(147), png(148)),
                          headers={"Authorization": "Bearer sk-made-up"})
    assert resp.status == 401
    await background_settled(harness)
    assert not [s for s in await sessions(harness) if s.startswith("~conversations")]


async def test_an_older_replicas_checkpoint_drops_no_link(make_harness: MakeHarness,
                                                          make_config: Callable[..., Config]) -> None:
    """A replica of the version before the index folds a shard and checkpoints it without links
    (it knows none): the links still hold, after a restart too, as the index reads them whole."""
    from projectionist.policy.events import Checkpoint

    harness = await make_harness(make_config(**RECORDING))
    one, two, session = await refused_pair(harness, 150)
    log = harness.app[SERVICES].log
    for shard in [s for s in await sessions(harness) if s.startswith("~conversations")]:
        last = max(e["seq"] for e in await harness.events(shard))
        await log.inner.append(shard, None, [Checkpoint(state_seq=last)], durable=True)
    restarted = await make_harness(make_config(**RECORDING))
    assert (await send(restarted, reattached(one, two)))["session"] == session


async def test_the_first_image_the_index_knows_decides(make_harness: MakeHarness) -> None:
    """Images of three conversations in one request: the session of the first one the index knows,
    in the body's order, whatever shard each key falls in; the new image is linked to it."""
    harness = await make_harness(**RECORDING)
    x1, x3, x0 = png(151), png(152), png(153)
    s1 = (await send(harness, conversation(x1)))["session"]
    body = conversation(x3)
    body["messages"][1]["content"][1]["text"] = "Another task."
    s3 = (await send(harness, body))["session"]
    assert s1 != s3
    line = await send(harness, reattached(x0, x1, x3))
    assert (line["session"], line["session_source"]) == (s1, "continued")
    assert (await send(harness, reattached(x0)))["session"] == s1


async def test_no_fork_writes_into_an_index(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    await send(harness, conversation(png(154)), {"X-Session-Id": "mine"})
    for child in ("~conversations.0@000000000000", "~refusals@000000000000"):
        resp = await harness.client.post("/admin/sessions/mine/fork", json={"new_session_id": child}, headers=ADMIN)
        assert resp.status == 400 and (await resp.json())["error"]["code"] == "INVALID_SESSION_ID"


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


def test_the_console_names_a_link() -> None:
    from projectionist.policy.events import Linked, LinkedEvent
    from projectionist.proxy.console.ui_pages import _describe

    kind, detail = _describe("~conversations.0@x", LinkedEvent(seq=1, time="t", data=Linked("k" * 32, "derived:x")), {})
    assert kind == "linked" and "derived:x" in detail and "k" * 12 in detail
    # with tenants, the link goes to the tenant's session, as the log holds it
    _, detail = _describe("alice~~conversations.0", LinkedEvent(seq=1, time="t", data=Linked("k" * 32, "derived:x")), {})
    assert "/sessions/alice~derived:x" in detail.replace("%7E", "~").replace("%3A", ":")


async def test_a_shard_holds_at_most_its_cap(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index is bounded: past ``SHARD_LINKS`` links a shard links no more images (their calls
    go on, in their derived session)."""
    from projectionist.proxy.call import conversations

    monkeypatch.setattr(conversations, "SHARD_LINKS", 1)
    harness = await make_harness(**RECORDING)
    shots = [png(160 + n, width=5) for n in range(40)]
    line = await send(harness, conversation(*shots))
    assert line["session_source"] == "derived"
    counts = [sum(e["type"] == "conversation/linked" for e in await harness.events(s))
              for s in await sessions(harness) if s.startswith("~conversations")]
    assert counts and max(counts) == 1 and len(counts) <= conversations.SHARDS
