"""Functional tests of the proxy: the policy through HTTP, against the real filesystem store and
SQLite log, with a recording fake upstream behind it."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from projectionist.policy.errors import CORRUPT, NOT_FOUND, READ_FAILED, AttachmentError
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import ADMIN, BACKENDS, Harness
from tests.fakes import fail_with
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]
SID = "sess-1"
pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


def user_parts(received: Any) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = received.json()["messages"][0]["content"]
    return parts


async def test_healthy_reference_is_inlined_as_a_data_url(harness: Harness) -> None:
    data = make_image(color=1)
    aid = await harness.admit(data)
    resp = await harness.chat(SID, aid)
    assert resp.status == 200
    assert (await resp.json())["object"] == "chat.completion"
    image = user_parts(harness.upstream.last)[1]
    assert image == {"type": "image_url",
                     "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}
    assert await harness.events(SID) == []


async def test_body_without_references_is_forwarded_byte_for_byte(harness: Harness) -> None:
    raw = b'{"model": "m",  "messages": [{"role": "user", "content": "hi"}], "x": 1.50}'
    resp = await harness.client.post("/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 200
    assert harness.upstream.last.body == raw
    assert harness.store.total == 0


async def test_missing_image_is_quarantined_once_and_never_read_again(harness: Harness) -> None:
    aid = ref_id(make_image(color=2))
    first = await harness.chat(SID, aid)
    second = await harness.chat(SID, aid)
    assert (first.status, second.status) == (200, 200)
    assert harness.store.reads[aid] == 1
    events = await harness.events(SID)
    assert [(e["type"], e["data"]["failure"], e["data"]["retryable"]) for e in events] == [
        ("attachment/quarantine", "not_found", False)]
    expected = f"[image unavailable: not_found ({aid[:15]})]"
    assert user_parts(harness.upstream.received[0])[1] == {"type": "text", "text": expected}
    assert harness.upstream.received[0].body == harness.upstream.received[1].body


async def test_corrupt_object_is_quarantined_as_corrupt(harness: Harness) -> None:
    data = make_image(color=3)
    aid = await harness.admit(data)
    await harness.corrupt(aid, bytes(len(data)))
    resp = await harness.chat(SID, aid)
    assert resp.status == 200
    assert [e["data"]["failure"] for e in await harness.events(SID)] == ["corrupt"]
    assert user_parts(harness.upstream.last)[1]["text"].startswith("[image unavailable: corrupt")


async def test_read_failed_then_success_sends_the_image(harness: Harness) -> None:
    aid = await harness.admit(color=4)
    harness.store.script = fail_with(READ_FAILED, times=1)
    resp = await harness.chat(SID, aid)
    assert resp.status == 200
    assert harness.store.reads[aid] == 2
    assert await harness.events(SID) == []
    assert user_parts(harness.upstream.last)[1]["type"] == "image_url"


async def test_read_failed_twice_is_a_retryable_quarantine(harness: Harness) -> None:
    aid = await harness.admit(color=5)
    harness.store.script = fail_with(READ_FAILED)
    resp = await harness.chat(SID, aid)
    assert resp.status == 200
    assert harness.store.reads[aid] == 2
    [event] = await harness.events(SID)
    assert event["data"] == {"attachment_id": aid, "failure": "read_failed", "retryable": True}


async def test_unclassified_store_error_fails_clearly_without_an_event(harness: Harness) -> None:
    aid = await harness.admit(color=6)

    def broken(attachment_id: str, n: int) -> float | None:
        raise KeyError("driver bug")

    harness.store.script = broken
    resp = await harness.chat(SID, aid)
    assert resp.status == 500
    body = await resp.json()
    assert body["error"]["code"] == "UNCLASSIFIED_ERROR"
    assert resp.headers["x-projectionist-error-code"] == "UNCLASSIFIED_ERROR"
    assert await harness.events(SID) == []
    assert harness.upstream.received == []


async def _open_and_abandon(harness: Harness, started: asyncio.Event, body: bytes) -> None:
    """Send a request over a raw socket and close it once the store read has started."""
    server = harness.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"X-Session-Id: {SID}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    await writer.drain()
    await asyncio.wait_for(started.wait(), 5)
    writer.close()
    await writer.wait_closed()


def _chat_body(*ids: str) -> bytes:
    import msgspec

    parts = [{"type": "image_url", "image_url": {"url": f"attachment:{i}"}} for i in ids]
    return msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": parts}]})


@pytest.mark.parametrize("during", ["first read", "retry"])
async def test_client_disconnect_stops_the_request_records_nothing_and_shares_its_read(
        harness: Harness, during: str) -> None:
    """The handler stops: no quarantine, no upstream call. The read it started (it cannot be
    stopped once in the OS) runs to its own end, shared: a client that comes back joins it."""
    aid = ref_id(make_image(color=7))  # never admitted: the read would end in NOT_FOUND
    started = asyncio.Event()
    reads_started = 0

    def slow(attachment_id: str, n: int) -> float | None:
        nonlocal reads_started
        if during == "retry" and n == 1:
            raise AttachmentError(READ_FAILED)
        reads_started += 1
        started.set()
        return 0.5

    harness.store.script = slow
    await _open_and_abandon(harness, started, _chat_body(aid))
    again = asyncio.create_task(harness.chat("back", aid))  # the client, back at once, in another session
    await asyncio.sleep(0.8)  # longer than the slow read: an uncancelled handler would have recorded
    assert await harness.events(SID) == []
    assert (await again).status == 200
    assert reads_started == 1  # the returning client joined the read still in flight
    assert [e["type"] for e in await harness.events("back")] == ["attachment/quarantine"]
    assert len(harness.upstream.received) == 1  # only the returning client's call went upstream


@pytest.mark.parametrize("apps", [1, 2], ids=["one-app", "two-apps-one-data-dir"])
async def test_fifty_concurrent_requests_on_one_missing_reference_make_one_event(
    make_harness: MakeHarness, make_config: Callable[..., Any], apps: int
) -> None:
    config = make_config()
    harnesses = [await make_harness(config) for _ in range(apps)]
    aid = ref_id(make_image(color=8))
    responses = await asyncio.gather(*(harnesses[i % apps].chat(SID, aid) for i in range(50)))
    assert [r.status for r in responses] == [200] * 50
    events = await harnesses[0].events(SID)
    assert len(events) == 1 and events[0]["type"] == "attachment/quarantine"
    bodies = {r.body for r in harnesses[0].upstream.received}
    assert len(bodies) == 1  # every request projected the same placeholder


async def test_recovery_refused_until_repaired_then_the_image_is_back(harness: Harness) -> None:
    data = make_image(color=9)
    aid = ref_id(data)
    await harness.chat(SID, aid)  # not admitted yet: quarantined not_found
    url = f"/admin/sessions/{SID}/attachments/{aid}/recover"
    refused = await harness.client.post(url, headers=ADMIN)
    assert refused.status == 409
    assert (await refused.json())["error"]["code"] == NOT_FOUND
    assert len(await harness.events(SID)) == 1
    assert await harness.admit(data) == aid  # explicit repair: the digest proves the bytes
    done = await harness.client.post(url, headers=ADMIN)
    assert done.status == 200
    body = await done.json()
    assert body["recovered"] is True and body["event"]["type"] == "attachment/recovered"
    assert body["event"]["data"] == {"attachment_id": aid, "bytes": len(data), "media_type": "image/png",
                                     "width": 4, "height": 3}
    await harness.chat(SID, aid)
    assert user_parts(harness.upstream.last)[1]["image_url"]["url"].endswith(base64.b64encode(data).decode())


async def test_the_folded_state_is_cached_per_session_and_read_only_past_its_last_seq(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request reads only the state events after the cached fold's last seq (never the whole
    log); the session's own appends (a quarantine, a recovery) move the cached fold forward, so
    nothing is read twice."""
    state = harness.app[SERVICES]
    reads: list[tuple[str, int]] = []
    real_read = state.log.read_state

    async def spy(session_id: str, after_seq: int = 0) -> Any:
        reads.append((session_id, after_seq))
        return await real_read(session_id, after_seq)

    async def whole(session_id: str, after_seq: int = 0) -> Any:
        raise AssertionError("a request read the whole log")

    monkeypatch.setattr(state.log, "read_state", spy)
    monkeypatch.setattr(state.log, "read", whole)
    data = make_image(color=19)
    aid = ref_id(data)
    await harness.chat(SID, aid)  # quarantined: seq 1
    cached = state.log.state(SID)
    assert cached is not None and cached.last_seq == 1 and aid in cached.quarantined
    reads.clear()
    await harness.chat(SID, aid)
    # only what lies beyond the cached fold; with PostgreSQL's state watch, a request that comes
    # before the notice of our own quarantine may use the fold that quarantine moved forward (it
    # failed one run in four, as a race between the notice and the next request)
    reads = [r for r in reads if not r[0].startswith("~refusals")]  # the tenant's refusals, read once
    assert reads in ([(SID, 1)], [] if harness.app[SERVICES].metrics.watch is not None else None)
    await harness.admit(data)
    assert (await harness.client.post(f"/admin/sessions/{SID}/attachments/{aid}/recover", headers=ADMIN)).status == 200
    cached = state.log.state(SID)
    assert cached is not None and cached.last_seq == 2 and aid not in cached.quarantined
    reads.clear()
    await harness.chat(SID, aid)
    # past the recovery, or nothing at all: with PostgreSQL's state watch, a request that comes
    # before the notice of our own recovery may use the fold that recovery moved forward
    assert reads in ([(SID, 2)], [] if harness.app[SERVICES].metrics.watch is not None else None)
    assert user_parts(harness.upstream.last)[1]["type"] == "image_url"


async def test_recovering_a_corrupt_object_is_refused_with_its_code(harness: Harness) -> None:
    aid = await harness.admit(color=10)
    await harness.corrupt(aid, b"garbage")
    await harness.chat(SID, aid)
    resp = await harness.client.post(f"/admin/sessions/{SID}/attachments/{aid}/recover", headers=ADMIN)
    assert resp.status == 409 and (await resp.json())["error"]["code"] == CORRUPT
    assert len(await harness.events(SID)) == 1


async def test_recovering_a_reference_that_is_not_quarantined_appends_nothing(harness: Harness) -> None:
    aid, gone = await harness.admit(color=11), await harness.admit(color=111)
    await harness.remove(gone)
    assert (await harness.chat(SID, aid, gone)).status == 200  # the session exists: one quarantine
    before = await harness.events(SID)
    assert len(before) == 1
    resp = await harness.client.post(f"/admin/sessions/{SID}/attachments/{aid}/recover", headers=ADMIN)
    assert resp.status == 200 and (await resp.json())["recovered"] is False
    assert await harness.events(SID) == before


@pytest.mark.parametrize("apps", [1, 2], ids=["one-app", "two-apps-one-data-dir"])
async def test_two_concurrent_recoveries_make_one_event(
    make_harness: MakeHarness, make_config: Callable[..., Any], apps: int
) -> None:
    config = make_config()
    harnesses = [await make_harness(config) for _ in range(apps)]
    data = make_image(color=12)
    aid = ref_id(data)
    await harnesses[0].chat(SID, aid)
    await harnesses[0].admit(data)
    url = f"/admin/sessions/{SID}/attachments/{aid}/recover"
    results = await asyncio.gather(*(harnesses[i % apps].client.post(url, headers=ADMIN) for i in range(2)))
    assert sorted([(await r.json())["recovered"] for r in results]) == [False, True]
    assert [e["type"] for e in await harnesses[0].events(SID)] == ["attachment/quarantine", "attachment/recovered"]


async def test_restart_and_fork_rebuild_byte_identical_upstream_bodies(
    make_harness: MakeHarness, make_config: Callable[..., Any]
) -> None:
    config = make_config()
    first = await make_harness(config)
    ok = await first.admit(color=13)
    gone = ref_id(make_image(color=14))
    await first.chat(SID, ok, gone, ok)
    original = first.upstream.last.body
    await first.client.close()  # the app shuts down: store and log closed

    second = await make_harness(config)
    await second.chat(SID, ok, gone, ok)
    assert second.upstream.last.body == original
    assert second.store.reads[gone] == 0

    fork = await second.client.post(f"/admin/sessions/{SID}/fork", json={"new_session_id": "child"}, headers=ADMIN)
    assert fork.status == 201
    assert (await fork.json())["event"]["data"] == {"parent": SID, "at_seq": 1}
    await second.chat("child", ok, gone, ok)
    assert second.upstream.last.body == original


async def test_fork_errors_are_clear(harness: Harness) -> None:
    await harness.chat(SID, ref_id(make_image(color=15)))
    url = f"/admin/sessions/{SID}/fork"
    too_far = await harness.client.post(url, json={"new_session_id": "c", "at_seq": 9}, headers=ADMIN)
    assert too_far.status == 400 and (await too_far.json())["error"]["code"] == "INVALID_FORK_SEQ"
    assert (await harness.client.post(url, json={"new_session_id": "c"}, headers=ADMIN)).status == 201
    again = await harness.client.post(url, json={"new_session_id": "c"}, headers=ADMIN)
    assert again.status == 409 and (await again.json())["error"]["code"] == "SESSION_EXISTS"
    bad = await harness.client.post(url, json={"nope": 1}, headers=ADMIN)
    assert bad.status == 400


async def test_nested_tool_result_images_in_openai_format(harness: Harness) -> None:
    ok = await harness.admit(color=16)
    gone = ref_id(make_image(color=17))
    body = {"model": "m", "messages": [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "shot", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [
            {"type": "text", "text": "here"},
            {"type": "image_url", "image_url": {"url": f"attachment:{ok}", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": f"attachment:{gone}?name=old.png"}}]}]}
    resp = await harness.client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": SID})
    assert resp.status == 200
    tool = harness.upstream.last.json()["messages"][2]["content"]
    assert tool[1]["image_url"]["detail"] == "low" and tool[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert tool[2] == {"type": "text", "text": f'[image unavailable: not_found; "old.png" ({gone[:15]})]'}


async def test_nested_tool_result_images_in_anthropic_format(harness: Harness) -> None:
    data = make_image(color=18)
    ok = await harness.admit(data)
    gone = ref_id(make_image(color=19))
    body = {"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": ok}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "url", "url": f"attachment:{gone}"},
             "cache_control": {"type": "ephemeral"}},
            {"type": "image", "source": {"type": "url", "url": f"attachment:{ok}"}}]}]}]}
    resp = await harness.client.post("/v1/messages", json=body, headers={"X-Session-Id": SID})
    assert resp.status == 200
    sent = harness.upstream.last.json()["messages"]
    inline = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}
    assert sent[0]["content"][0] == {"type": "image", "source": inline}
    nested = sent[2]["content"][0]["content"]
    assert nested[0] == {"type": "text", "text": f"[image unavailable: not_found ({gone[:15]})]",
                         "cache_control": {"type": "ephemeral"}}
    assert nested[1] == {"type": "image", "source": inline}
    assert harness.store.reads == {ok: 1, gone: 1}


async def test_sessionless_failures_use_the_attachment_status(harness: Harness) -> None:
    gone = ref_id(make_image(color=20))
    resp = await harness.chat(None, gone)
    assert resp.status == 422
    assert (await resp.json())["error"]["code"] == NOT_FOUND
    ok = await harness.admit(color=21)
    harness.store.script = fail_with(READ_FAILED)
    resp = await harness.chat(None, ok)
    assert resp.status == 503 and resp.headers["Retry-After"] == "1"
    assert (await resp.json())["error"]["code"] == READ_FAILED
    assert harness.upstream.received == []


async def test_sessionless_placeholder_mode_records_nothing(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"server.sessionless": "placeholder"})
    gone = ref_id(make_image(color=22))
    resp = await harness.chat(None, gone)
    assert resp.status == 200
    assert user_parts(harness.upstream.last)[1]["text"].startswith("[image unavailable: not_found")


@pytest.mark.parametrize(
    ("body", "code"),
    [(b'{"messages": [{"content": [{"type": "image_url", "image_url": {"url": "attachment:sha256:XYZ"}}]}]}',
      "INVALID_ATTACHMENT_REF"),
     (b'{"messages": "sha256:', "INVALID_JSON")],
)
async def test_bad_input_is_a_400_in_the_openai_shape(harness: Harness, body: bytes, code: str) -> None:
    resp = await harness.client.post("/v1/chat/completions", data=body, headers={"X-Session-Id": SID})
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == code
    assert harness.upstream.received == []


async def test_bad_input_is_a_400_in_the_anthropic_shape(harness: Harness) -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "sha256:nothex"}}]}]}
    resp = await harness.client.post("/v1/messages", json=body)
    assert resp.status == 400
    payload = await resp.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["details"]["error_code"] == "INVALID_ATTACHMENT_REF"


async def test_invalid_session_id_is_rejected(harness: Harness) -> None:
    resp = await harness.chat("has space", ref_id(make_image(color=23)))
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "INVALID_SESSION_ID"


async def test_body_over_client_max_size_is_a_413_in_wire_shape(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"server.client_max_size": 2048})
    resp = await harness.client.post("/v1/messages", data=b"x" * 5000)
    assert resp.status == 413
    payload = await resp.json()
    assert payload["error"]["type"] == "request_too_large"
    assert payload["error"]["details"]["error_code"] == "PAYLOAD_TOO_LARGE"


async def test_headers_hop_by_hop_dropped_auth_forwarded(harness: Harness) -> None:
    resp = await harness.client.post(
        "/v1/chat/completions", json={"model": "m", "messages": []},
        headers={"Authorization": "Bearer client-key", "X-Session-Id": SID, "Connection": "keep-alive, X-Drop-Me",
                 "X-Drop-Me": "1", "Proxy-Authorization": "secret", "X-Keep": "yes", "TE": "trailers"},
    )
    assert resp.status == 200
    got = {k.lower(): v for k, v in harness.upstream.last.headers.items()}
    assert got["authorization"] == "Bearer client-key"
    assert got["x-keep"] == "yes"
    for dropped in ("x-drop-me", "proxy-authorization", "te", "x-session-id"):
        assert dropped not in got


async def test_configured_upstream_key_replaces_the_clients(
    make_harness: MakeHarness, monkeypatch: Any, upstream: Any
) -> None:
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", "server-key")
    harness = await make_harness(**{"upstreams.anthropic": {"format": "anthropic", "url": upstream.url,
                                                            "api_key_env": "TEST_ANTHROPIC_KEY"}})
    resp = await harness.client.post("/v1/messages", json={"model": "m", "messages": []},
                                     headers={"x-api-key": "client-key", "Authorization": "Bearer client"})
    assert resp.status == 200
    got = {k.lower(): v for k, v in harness.upstream.last.headers.items()}
    assert got["x-api-key"] == "server-key" and "authorization" not in got


async def test_sse_first_chunk_is_forwarded_before_the_stream_ends(harness: Harness) -> None:
    harness.upstream.gate = asyncio.Event()
    resp = await harness.chat(SID, stream=True)
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)  # upstream still held at the gate
    assert first.startswith(b"data: ") and b'"role":"assistant"' in first
    harness.upstream.gate.set()
    rest = await resp.read()
    assert rest.endswith(b"data: [DONE]\n\n") and rest.count(b"data: ") == harness.upstream.chunks


async def test_upstream_unreachable_is_a_502_and_timeout_a_504(make_harness: MakeHarness, aiohttp_server: Any) -> None:
    from aiohttp import web

    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": "http://127.0.0.1:9"}})
    resp = await harness.chat(SID)
    assert resp.status == 502 and (await resp.json())["error"]["code"] == "UPSTREAM_UNAVAILABLE"

    async def stall(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    slow = web.Application()
    slow.router.add_post("/v1/messages", stall)
    server = await aiohttp_server(slow)
    harness = await make_harness(**{"upstreams.anthropic": {
        "format": "anthropic", "url": str(server.make_url("")).rstrip("/"), "read_timeout": 0.2}})
    resp = await harness.client.post("/v1/messages", json={"model": "m", "messages": []})
    assert resp.status == 504
    assert (await resp.json())["error"]["details"]["error_code"] == "UPSTREAM_TIMEOUT"


async def test_upstream_errors_reach_the_client_unchanged(make_harness: MakeHarness, aiohttp_server: Any) -> None:
    from aiohttp import web

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "bad model", "code": "model_not_found"}}, status=404)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    server = await aiohttp_server(app)
    harness = await make_harness(**{"upstreams.openai": {"format": "openai", "url": str(server.make_url("")).rstrip("/")}})
    resp = await harness.chat(SID)
    assert resp.status == 404
    assert await resp.json() == {"error": {"message": "bad model", "code": "model_not_found"}}


async def test_admin_api_requires_the_token(harness: Harness) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "admintok"}):
        resp = await harness.client.get(f"/admin/sessions/{SID}/events", headers=headers)
        assert resp.status == 401 and (await resp.json())["error"]["code"] == "ADMIN_UNAUTHORIZED"
    past = await harness.client.get(f"/admin/sessions/{SID}/quarantine", headers=ADMIN)  # a session with no event
    assert past.status == 404 and (await past.json())["error"]["code"] == "SESSION_NOT_FOUND"


async def test_quarantine_view_lists_what_is_quarantined(harness: Harness) -> None:
    gone = ref_id(make_image(color=24))
    await harness.chat(SID, gone)
    resp = await harness.client.get(f"/admin/sessions/{SID}/quarantine", headers=ADMIN)
    assert await resp.json() == {"session": SID, "last_seq": 1, "quarantined": [
        {"attachment_id": gone, "failure": "not_found", "retryable": False}], "variants": []}


async def test_canonical_log_line_has_counts_and_no_payloads(harness: Harness) -> None:
    data = make_image(color=25)
    ok = await harness.admit(data)
    gone = ref_id(make_image(color=26))
    with capture_logs() as logs:
        await harness.client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"attachment:{ok}"}},
            {"type": "image_url", "image_url": {"url": f"attachment:{gone}"}}]}]},
            headers={"X-Session-Id": SID, "Authorization": "Bearer sk-secret-key"})
    [line] = [entry for entry in logs if entry["event"] == "request"]
    assert line["session"] == SID and line["route"] == "openai_chat" and line["status"] == 200
    assert line["refs"] == 2 and line["reads"] == 2 and line["quarantined"] == ["not_found"]
    assert line["upstream_status"] == 200 and line["duration_ms"] >= line["upstream_ms"] >= 0
    text = repr(logs)
    assert base64.b64encode(data).decode()[:40] not in text
    assert "sk-secret-key" not in text and "admintok" not in text


async def test_healthz(harness: Harness) -> None:
    resp = await harness.client.get("/healthz")
    assert resp.status == 200 and await resp.json() == {"status": "ok"}


async def test_the_harness_runs_on_the_backend_it_names(harness: Harness, backend: str) -> None:
    from projectionist.proxy.stores.filesystem import FilesystemStore
    from projectionist.proxy.sessionlog.postgres import PostgresLog
    from projectionist.proxy.stores.s3 import S3Store
    from projectionist.proxy.sessionlog.sqlite import SqliteLog
    from projectionist.proxy.inbound.services import SERVICES

    state = harness.app[SERVICES]
    expected = (FilesystemStore, SqliteLog) if backend == "embedded" else (S3Store, PostgresLog)
    assert (type(harness.store.inner), type(state.log.inner)) == expected



@pytest.mark.parametrize("after", ["-1", "x", str(2**63)])
async def test_admin_events_after_must_be_a_sane_integer(harness: Harness, after: str) -> None:
    resp = await harness.client.get(f"/admin/sessions/{SID}/events", params={"after": after}, headers=ADMIN)
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "INVALID_QUERY"
