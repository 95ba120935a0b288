"""Nothing is ever written into a response that has started: a recording that fails mid-stream (a
blob write on a full disk, a record append that loses a race or meets a dead database) leaves the
client's answer whole, with one status line, and is counted; errors raised after the start close
the connection instead of appending a second response. Both backends, JSON and SSE, read as raw
bytes so nothing a client library does can hide a spliced response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from projectionist.policy.errors import Unavailable
from projectionist.policy.events import RequestRecorded, ResponseRecorded
from projectionist.proxy.inbound.services import SERVICES
from tests.calls import raw_exchange
from tests.conftest import BACKENDS, Harness
from tests.fakes import COMPLETION

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
MakeHarness = Callable[..., Awaitable[Harness]]


def dechunk(payload: bytes) -> bytes:
    out, rest = b"", payload
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, rest = out + rest[:size], rest[size + 2:]
    raise AssertionError("no terminating chunk: the stream was cut")


def one_whole_response(answer: bytes) -> bytes:
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.") == 1, answer[:2000]
    return dechunk(payload) if b"transfer-encoding: chunked" in head.lower() else payload


FAULTS = ["blob_write_fails", "record_append_raises", "record_append_unavailable"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("fault", FAULTS)
async def test_a_recording_that_fails_mid_stream_never_splices_an_error(
        make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch, fault: str, stream: bool) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    services = harness.app[SERVICES]
    failures: list[str] = []
    if fault == "blob_write_fails":
        real_put = services.recording.store.put_blob

        async def no_space(data: bytes) -> str:
            if not failures and data.startswith(b'{"model"'):
                failures.append("inbound stored")  # the inbound body still fits; the response does not
                return await real_put(data)
            failures.append("blob")
            raise Unavailable("ATTACHMENT_WRITE_FAILED: no space left", code="ATTACHMENT_WRITE_FAILED")
        monkeypatch.setattr(services.recording.store, "put_blob", no_space)
    else:
        real_append = services.log.append

        async def append(session_id: str, expected: int | None, data: Any, *, durable: bool = True) -> Any:
            if any(isinstance(d, ResponseRecorded) or isinstance(d, RequestRecorded) and d.response is not None
                   for d in data):  # a response record, or a call's one row that carries it
                failures.append("append")
                if fault == "record_append_raises":  # a foreign error, as a lost unique-key race raised one
                    raise RuntimeError("duplicate key value violates unique constraint")
                raise Unavailable("session log unavailable", code="LOG_UNAVAILABLE")
            return await real_append(session_id, expected, data, durable=durable)
        monkeypatch.setattr(services.log, "append", append)

    body = msgspec.json.encode({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
    payload = one_whole_response(await raw_exchange(harness, body, session="spliced"))
    if stream:
        assert payload.count(b"data: ") == harness.upstream.chunks + 1 and payload.endswith(b"data: [DONE]\n\n")
    else:
        assert msgspec.json.decode(payload) == COMPLETION
    await services.recording.drain()  # records are written off the request path
    assert failures[-1] in ("blob", "append"), "the fault was never hit: the test proves nothing"
    assert services.metrics.records_dropped["response"] >= 1
    assert services.metrics.errors_after_start == 0
    kinds = [e["type"] for e in await harness.events("spliced")]
    # the response record was dropped (with its request's, when one append held both), nothing else went wrong
    assert kinds in ([], ["request/recorded"])


async def test_a_request_record_that_cannot_be_written_does_not_stop_the_call(
        make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    services = harness.app[SERVICES]

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise Unavailable("session log unavailable", code="LOG_UNAVAILABLE")
    monkeypatch.setattr(services.log, "append", down)
    monkeypatch.setattr(services.log, "append_calls", down)  # a whole call's record (metadata mode)
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert msgspec.json.decode(one_whole_response(await raw_exchange(harness, body, session="spliced"))) == COMPLETION
    await services.recording.drain()
    assert services.metrics.records_dropped["request"] == 1


async def test_an_error_after_the_response_started_closes_the_connection_instead(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever raises once the response has started (here: a bug in the relay's last step) is
    logged and counted, and the connection closes: the client sees a cut stream, not a 500."""
    import projectionist.proxy.call.relay as relay_module

    real = relay_module._stream

    async def broken(request: Any, response: Any, answer: Any, observer: Any, request_id: str) -> None:
        await response.write(b"data: first\n\n")
        raise RuntimeError("a bug after the start")
    monkeypatch.setattr(relay_module, "_stream", broken)
    body = msgspec.json.encode({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    answer = await raw_exchange(harness, body, session="spliced")
    assert answer.count(b"HTTP/1.") == 1 and answer.startswith(b"HTTP/1.1 200 ")
    assert b"UNCLASSIFIED_ERROR" not in answer and not answer.endswith(b"0\r\n\r\n")
    assert harness.app[SERVICES].metrics.errors_after_start == 1
    monkeypatch.setattr(relay_module, "_stream", real)
