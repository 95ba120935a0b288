"""OpenTelemetry traces: spans of proxied calls reach a real OTLP/HTTP receiver, started here
(an aiohttp server on loopback taking ``POST /v1/traces`` with protobuf bodies, decoded with
``opentelemetry-proto``'s ``ExportTraceServiceRequest``), and tracing off loads no opentelemetry."""

from __future__ import annotations

import gzip
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from projectionist.policy.errors import ProjectionistError
from projectionist.proxy.config import load_config
from projectionist.proxy.edge.app import open_tracing
from projectionist.proxy.observe.tracing import traces_url
from tests.conftest import Harness
from tests.imaging import make_image, ref_id

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: every span it was sent, with its service name."""

    url: str = ""
    spans: list[Span] = field(default_factory=list)
    services: set[str] = field(default_factory=set)
    content_types: set[str] = field(default_factory=set)

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.content_types.add(request.headers.get("Content-Type", ""))
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            self.services.update(a.value.string_value for a in resource_spans.resource.attributes
                                 if a.key == "service.name")
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def named(self, name: str) -> Span:
        [span] = [s for s in self.spans if s.name == name]
        return span


@pytest.fixture
async def receiver(aiohttp_server: Any) -> Receiver:
    found = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", found.traces)
    server = await aiohttp_server(app)
    found.url = str(server.make_url("")).rstrip("/")
    return found


def attributes(span: Span) -> dict[str, Any]:
    def value(v: AnyValue) -> Any:
        return getattr(v, v.WhichOneof("value"))
    return {a.key: value(a.value) for a in span.attributes}


async def traced(make_harness: Callable[..., Awaitable[Harness]], receiver: Receiver, **overrides: Any) -> Harness:
    return await make_harness(**{"telemetry.otlp_endpoint": receiver.url, "telemetry.service_name": "proxy-under-test",
                                 **overrides})


async def test_a_call_with_images_and_a_quarantine_is_one_span_with_a_projection_child(
        make_harness: Callable[..., Awaitable[Harness]], receiver: Receiver) -> None:
    harness = await traced(make_harness, receiver)
    aid = await harness.admit(make_image(color=40))
    gone = ref_id(make_image(color=41))
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"attachment:{aid}"}},
        {"type": "image_url", "image_url": {"url": f"attachment:{gone}"}}]}]}
    resp = await harness.client.post("/v1/chat/completions?api_key=sk-query-secret", json=body,
                                     headers={"X-Session-Id": "traced", "traceparent": TRACEPARENT,
                                              "Authorization": "Bearer sk-header-secret"})
    assert resp.status == 200
    request_id = resp.headers["x-projectionist-request-id"]
    sent = harness.upstream.last.headers["traceparent"]
    await harness.client.close()  # app cleanup shuts the batch processor down: every span is exported

    assert len(receiver.spans) == 2  # the upload made none: only proxied calls are traced
    call, projection = receiver.named("chat gpt-4o-mini"), receiver.named("projection")
    assert receiver.services == {"proxy-under-test"} and receiver.content_types == {"application/x-protobuf"}
    # the caller's trace continues: its span is the call's parent, the call the projection's
    assert call.trace_id.hex() == projection.trace_id.hex() == TRACE_ID
    assert call.parent_span_id.hex() == CALLER_SPAN
    assert projection.parent_span_id == call.span_id
    assert call.kind == Span.SPAN_KIND_SERVER and call.status.code != Status.STATUS_CODE_ERROR
    # and goes upstream: the upstream's work is the call's child
    assert sent == f"00-{TRACE_ID}-{call.span_id.hex()}-01"
    assert call.start_time_unix_nano <= projection.start_time_unix_nano <= projection.end_time_unix_nano \
        <= call.end_time_unix_nano
    assert attributes(call) == {
        "gen_ai.provider.name": "openai", "gen_ai.system": "openai", "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o-mini", "gen_ai.response.model": "fake-model",
        "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 7,
        "http.request.method": "POST", "url.path": "/v1/chat/completions", "http.response.status_code": 200,
        "projectionist.route": "openai_chat", "projectionist.upstream": "openai",
        "projectionist.request_id": request_id, "projectionist.upstream_status": 200, "session.id": "traced",
    }
    assert attributes(projection) == {"projectionist.references": 2, "projectionist.reads": 2,
                                      "projectionist.quarantines": 1, "projectionist.placeholders": 1}
    everything = repr([attributes(s) for s in receiver.spans])
    assert "sk-query-secret" not in everything and "sk-header-secret" not in everything


async def test_a_failed_call_is_an_error_span_and_a_new_trace_without_a_traceparent(
        make_harness: Callable[..., Awaitable[Harness]], receiver: Receiver) -> None:
    harness = await traced(make_harness, receiver)
    gone = ref_id(make_image(color=42))
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"attachment:{gone}"}}]}]}
    resp = await harness.client.post("/v1/chat/completions", json=body)  # no session: fails, 422
    assert resp.status == 422
    passthrough = await harness.client.get("/v1/models")
    assert passthrough.status == 200
    await harness.client.close()

    failed = receiver.named("chat")  # the projection failed before the call was built: no model known
    assert failed.parent_span_id == b"" and len(failed.trace_id) == 16
    assert failed.status.code == Status.STATUS_CODE_ERROR
    assert attributes(failed)["error.type"] == "ATTACHMENT_NOT_FOUND"
    assert attributes(failed)["http.response.status_code"] == 422
    plain = attributes(receiver.named("GET passthrough"))
    assert "gen_ai.operation.name" not in plain and plain["gen_ai.provider.name"] == "openai"
    assert plain["http.response.status_code"] == 200 and plain["url.path"] == "/v1/models"
    assert len(receiver.spans) == 2  # the failed call (no projection ended), the pass-through


async def test_a_streamed_anthropic_call_carries_its_usage(
        make_harness: Callable[..., Awaitable[Harness]], receiver: Receiver) -> None:
    harness = await traced(make_harness, receiver)
    resp = await harness.client.post("/v1/messages", headers={"anthropic-version": "2023-06-01"},
                                     json={"model": "claude-x", "max_tokens": 9, "stream": True, "messages": []})
    await resp.read()
    await harness.client.close()
    [span] = receiver.spans  # no references: nothing projected, no child; the model is the answer's
    found = attributes(span)
    assert span.name == "chat"
    assert (found["gen_ai.provider.name"], found["gen_ai.response.model"]) == ("anthropic", "fake-model")
    assert (found["gen_ai.usage.input_tokens"], found["gen_ai.usage.output_tokens"]) == (10, harness.upstream.chunks)


def test_the_endpoint_names_the_collector_or_its_traces_path() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://c.example/otlp/v1/traces") == "https://c.example/otlp/v1/traces"
    with pytest.raises(ProjectionistError) as caught:
        open_tracing(load_config(None, **{"telemetry.otlp_endpoint": "collector:4318"}).telemetry)
    assert caught.value.code == "INVALID_CONFIG"
    assert open_tracing(load_config(None).telemetry) is None


def test_tracing_off_loads_no_opentelemetry(tmp_path: Any) -> None:
    script = f"""
import sys
from projectionist.proxy.config import load_config
from projectionist.proxy.edge.app import create_app
app = create_app(load_config(None, **{{"server.data_dir": {str(tmp_path)!r}}}))
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
