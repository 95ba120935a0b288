"""Traffic recording: request/recorded before the upstream call, response/recorded after it."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from projectionist.policy.fold import fold
from projectionist.proxy.http.services import SERVICES
from tests.conftest import BACKENDS, Harness
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
    quarantine, request, response = await harness.events("rec")
    assert (quarantine["type"], request["type"], response["type"]) == (
        "attachment/quarantine", "request/recorded", "response/recorded")
    data = request["data"]
    assert data["request_id"] == resp.headers["x-projectionist-request-id"]
    assert (data["route"], data["adapter"], data["upstream"], data["method"], data["path"]) == (
        "openai_chat", "openai_chat", "openai", "POST", "/v1/chat/completions")
    assert data["log_seq"] == 1 and data["inbound_digest"] == sha(body) and "inbound_blob" not in data
    assert data["refs"] == [
        {"path": "/messages/0/content/1", "attachment_id": ok, "outcome": "inlined"},
        {"path": "/messages/0/content/2", "attachment_id": gone, "outcome": "placeholder", "failure": "not_found"}]
    assert [path for path, _ in data["shape"]] == ["/model", "/stream", "/messages", "/messages/0"]
    outcome = response["data"]
    # one append held both records: the response names its request by id (request_seq 0, request first)
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
    request, response = await harness.events("rec")
    store = harness.app[SERVICES].store
    assert await store.get_blob(request["data"]["inbound_blob"]) == body
    assert await store.get_blob(response["data"]["response_blob"]) == streamed
    assert response["data"]["usage"]["output_tokens"] == harness.upstream.chunks
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
    request, response = await harness.events("rec")
    assert response["data"]["status"] is None and response["data"]["error_code"] == "UPSTREAM_UNAVAILABLE"
    assert response["data"]["request_seq"] in (0, request["seq"]) and response["data"]["request_id"] == request["data"]["request_id"]


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
    assert [e.seq for e in events] == list(range(1, 8))  # 1 quarantine + 3 x (request, response)
    assert list(fold(events).quarantined) == [gone]


async def test_a_gemini_key_in_the_query_is_not_recorded(make_harness: MakeHarness, upstream: Any) -> None:
    harness = await make_harness(**{"record.mode": "metadata",
                                    "upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    body = msgspec.json.encode({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    await post(harness, body, path="/v1beta/models/g:generateContent?key=g-secret&alt=sse")
    [request, _] = await harness.events("rec")
    assert request["data"]["path"] == "/v1beta/models/g:generateContent?alt=sse"
    assert "g-secret" not in repr(await harness.events("rec"))
