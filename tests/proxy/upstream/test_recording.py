"""Traffic recording: request/recorded before the upstream call, its outcome after it (in the same
row when the call ended before the writer took its request record, else in response/recorded)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from projectionist.policy.fold import fold
from projectionist.proxy.inbound.services import SERVICES
from tests.calls import recorded_calls, state_kinds
from tests.conftest import ADMIN, BACKENDS, Harness
from tests.imaging import make_image, ref_id

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
MakeHarness = Callable[..., Awaitable[Harness]]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def chat_body(*ids: str, stream: bool = False) -> bytes:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": f"attachment:{i}"}} for i in ids]
    return msgspec.json.encode({"model": "m", "stream": stream, "messages": [{"role": "user", "content": parts}]})


async def post(harness: Harness, body: bytes, session: str | None = "rec", path: str = "/v1/chat/completions",
               **headers: str) -> Any:
    if session:
        headers["X-Session-Id"] = session
    resp = await harness.client.post(path, data=body, headers={"Content-Type": "application/json", **headers})
    await resp.read()  # the whole answer: by then its response record is in the log
    return resp


async def test_metadata_records_the_request_before_and_the_response_after(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    ok = await harness.admit(make_image(color=200))
    gone = ref_id(make_image(color=201))
    body = chat_body(ok, gone)
    resp = await post(harness, body, Authorization="Bearer sk-secret-key")
    assert resp.status == 200
    await resp.read()
    events = await harness.events("rec")
    assert state_kinds(events) == ["attachment/quarantine", "request/recorded"]
    [(request, outcome)] = recorded_calls(events)
    assert outcome is not None
    data = request["data"]
    assert data["request_id"] == resp.headers["x-projectionist-request-id"]
    assert (data["route"], data["adapter"], data["upstream"], data["method"], data["path"]) == (
        "openai_chat", "openai_chat", "openai", "POST", "/v1/chat/completions")
    assert data["log_seq"] == 1 and data["inbound_digest"] == sha(body) and "inbound_blob" not in data
    assert data["refs"] == [
        {"path": "/messages/0/content/1", "attachment_id": ok, "outcome": "inlined"},
        {"path": "/messages/0/content/2", "attachment_id": gone, "outcome": "placeholder", "failure": "not_found"}]
    assert [path for path, _ in data["shape"]] == ["/model", "/stream", "/messages", "/messages/0"]
    # in the request's own record, or in one of its own naming the request by seq, or by id (request_seq 0)
    # when one append held both
    assert outcome["request_seq"] in (0, request["seq"]) and outcome["request_id"] == data["request_id"]
    assert outcome["status"] == 200 and outcome["latency_ms"] > 0 and "response_blob" not in outcome
    assert outcome["usage"] == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}


async def test_projected_digest_is_the_upstream_bytes_when_nothing_is_inlined(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    await post(harness, chat_body(ref_id(make_image(color=202))))
    [record] = [e for e in await harness.events("rec") if e["type"] == "request/recorded"]
    assert record["data"]["projected_digest"] == sha(harness.upstream.last.body)
    await post(harness, b'{"model": "m", "messages": []}')  # no reference: the original bytes, untouched
    plain = [e for e in await harness.events("rec") if e["type"] == "request/recorded"][-1]
    assert plain["data"]["projected_digest"] == sha(b'{"model": "m", "messages": []}') == sha(harness.upstream.last.body)


async def test_full_mode_keeps_inbound_and_streamed_response_as_blobs(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    data = make_image(color=203)
    ok = await harness.admit(data)
    body = msgspec.json.encode({"model": "m", "max_tokens": 5, "stream": True, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": ok}}]}]})
    resp = await post(harness, body, path="/v1/messages", **{"x-api-key": "sk-ant-secret"})
    streamed = await resp.read()
    [(request, outcome)] = recorded_calls(await harness.events("rec"))
    store = harness.app[SERVICES].store
    assert outcome is not None
    assert await store.get_blob(request["data"]["inbound_blob"]) == body
    assert await store.get_blob(outcome["response_blob"]) == streamed
    assert outcome["usage"]["output_tokens"] == harness.upstream.chunks
    everything = repr(await harness.events("rec")).encode() + body + streamed
    assert b"sk-ant-secret" not in everything and base64.b64encode(data)[:40] not in everything


async def test_nothing_is_recorded_without_a_session_or_when_off(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    assert (await post(harness, chat_body(), session=None)).status == 200
    off = await make_harness(**{"record.mode": "off"})
    await post(off, chat_body())
    assert await off.events("rec") == []


async def test_an_unreachable_upstream_is_recorded_as_such(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "metadata",
                                    "upstreams.openai": {"format": "openai", "url": "http://127.0.0.1:9"}})
    resp = await post(harness, chat_body())
    assert resp.status == 502
    [(request, outcome)] = recorded_calls(await harness.events("rec"))
    assert outcome is not None and outcome["status"] is None and outcome["error_code"] == "UPSTREAM_UNAVAILABLE"
    assert outcome["request_seq"] in (0, request["seq"]) and outcome["request_id"] == request["data"]["request_id"]


async def test_records_never_change_what_is_projected(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    ok = await harness.admit(make_image(color=204))
    gone = ref_id(make_image(color=205))
    bodies = []
    for _ in range(3):
        await post(harness, chat_body(ok, gone))
        bodies.append(harness.upstream.last.body)
    assert len(set(bodies)) == 1
    await harness.app[SERVICES].recording.drain()  # records are written off the request path
    events = await harness.app[SERVICES].log.read("rec")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(recorded_calls([msgspec.to_builtins(e) for e in events])) == 3  # 1 quarantine + 3 calls
    assert list(fold(events).quarantined) == [gone]


async def test_a_gemini_key_in_the_query_is_not_recorded(make_harness: MakeHarness, upstream: Any) -> None:
    harness = await make_harness(**{"record.mode": "metadata",
                                    "upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    body = msgspec.json.encode({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    await post(harness, body, path="/v1beta/models/g:generateContent?key=g-secret&alt=sse")
    [(request, _)] = recorded_calls(await harness.events("rec"))
    assert request["data"]["path"] == "/v1beta/models/g:generateContent?alt=sse"
    assert "g-secret" not in repr(await harness.events("rec"))


async def test_a_call_longer_than_the_hold_is_recorded_in_two_rows_and_read_as_one_call(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "full", "record.hold": 0.1, "record.batch_wait": 0.0})
    quick = chat_body()
    await post(harness, quick)  # ends well within the hold: one row
    harness.upstream.chunks, harness.upstream.chunk_delay = 10, 0.05  # streams for half a second
    slow = chat_body(stream=True)
    resp = await post(harness, slow)
    assert resp.status == 200
    events = await harness.events("rec")
    assert [e["type"] for e in events] == ["request/recorded", "request/recorded", "response/recorded"]
    (first, first_outcome), (second, second_outcome) = recorded_calls(events)
    assert first["data"]["response"] == first_outcome and first_outcome["status"] == 200
    assert "response" not in second["data"] and second_outcome == events[2]["data"]
    assert second_outcome["request_seq"] == second["seq"] and second_outcome["status"] == 200
    for seq, outcome in ((first["seq"], first_outcome), (second["seq"], second_outcome)):
        answer = await harness.client.get("/admin/sessions/rec/replay", params={"seq": seq}, headers=ADMIN)
        report = await answer.json()
        assert answer.status == 200 and report["matches"] is True
        assert report["recorded_response"] == outcome  # replay finds each call's outcome, wherever it is
    page = await harness.client.get("/admin/ui/sessions/rec", headers=ADMIN)
    text = await page.text()
    assert page.status == 200 and text.count('class="status">200<') == 2 and "response/recorded" not in text
