"""How a recorded call ends, end to end: a client that leaves mid-stream, with and without a hold
(one row, or a request row and a ``response/recorded`` naming it by seq), and an app that closes
with a call in flight (its request record goes alone, built from the parts held for it)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from projectionist.proxy.inbound.services import SERVICES
from tests.calls import recorded_calls
from tests.backends import BACKENDS
from tests.conftest import Harness

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

MakeHarness = Callable[..., Awaitable[Harness]]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


BODY = msgspec.json.encode({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})


async def _leave_mid_stream(harness: Harness) -> str:
    harness.upstream.gate = asyncio.Event()
    resp = await harness.client.post("/v1/chat/completions", data=BODY, headers={
        "X-Session-Id": "end", "Content-Type": "application/json"})
    assert resp.status == 200
    await resp.content.readline()  # the first chunk came through: the call is streaming
    request_id = resp.headers["x-projectionist-request-id"]
    resp.close()  # the client leaves
    for _ in range(200):  # until the call's outcome is in the log
        if any(outcome for _, outcome in recorded_calls(await harness.events("end"))):
            break
        await asyncio.sleep(0.05)
    harness.upstream.gate.set()
    return request_id


@pytest.mark.parametrize("hold", [30.0, 0.0])
async def test_a_client_that_leaves_mid_stream_gets_its_call_recorded_once(make_harness: MakeHarness,
                                                                            hold: float) -> None:
    harness = await make_harness(**{"record.mode": "full", "record.hold": hold, "record.batch_wait": 0.0})
    request_id = await _leave_mid_stream(harness)
    events = await harness.events("end")
    [(request, outcome)] = recorded_calls(events)
    data = request["data"]
    assert data["request_id"] == request_id and data["inbound_digest"] == sha(BODY) == data["inbound_blob"]
    assert await harness.app[SERVICES].store.get_blob(data["inbound_blob"]) == BODY
    assert outcome is not None and outcome["request_id"] == request_id
    assert (outcome["status"], outcome["error_code"]) == (None, "CLIENT_DISCONNECTED")
    assert "response_blob" not in outcome  # nothing of an answer the client left is kept
    if hold:
        assert [e["type"] for e in events] == ["request/recorded"] and data["response"] == outcome
    else:
        assert [e["type"] for e in events] == ["request/recorded", "response/recorded"]
        assert "response" not in data and outcome["request_seq"] == request["seq"]


async def test_closing_with_a_call_in_flight_writes_its_request_alone_and_its_outcome_names_it(
        make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "full", "record.hold": 60.0, "record.batch_wait": 0.0})
    recording = harness.app[SERVICES].recording
    harness.upstream.gate = asyncio.Event()
    resp = await harness.client.post("/v1/chat/completions", data=BODY, headers={
        "X-Session-Id": "end", "Content-Type": "application/json"})
    first = await resp.content.readline()
    assert len(recording._held) == 1
    await recording.close()  # as at shutdown: the held request record goes alone
    assert recording._held == {}
    harness.upstream.gate.set()
    streamed = await resp.read()
    await recording.drain()
    events = await harness.events("end")
    assert [e["type"] for e in events] == ["request/recorded", "response/recorded"]
    [(request, outcome)] = recorded_calls(events)
    assert "response" not in request["data"] and request["data"]["inbound_blob"] == sha(BODY)
    assert outcome is not None and outcome["request_seq"] == request["seq"] and outcome["status"] == 200
    store: Any = harness.app[SERVICES].store
    assert await store.get_blob(request["data"]["inbound_blob"]) == BODY
    assert await store.get_blob(outcome["response_blob"]) == first + streamed
    assert outcome["response_blob"] == sha(first + streamed)
