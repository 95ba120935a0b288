"""OpenTelemetry traces of proxied calls, exported over OTLP/HTTP (proxy layer, observe).

Imported only when ``[telemetry] otlp_endpoint`` is set: with tracing off, no opentelemetry
module is loaded and a request pays one ``is None`` test. Each app has its own ``TracerProvider``
(no global one) with a ``BatchSpanProcessor``: spans are exported off the event loop, in the
processor's thread, and ``close`` flushes them when the app shuts down.

One span per proxied call (``CallSpan``), a child of the caller's ``traceparent`` when it sent
one, with the GenAI semantic conventions' attributes (``gen_ai.provider.name`` and, for older
backends, ``gen_ai.system``; ``gen_ai.operation.name``, ``gen_ai.request.model``,
``gen_ai.response.model``, ``gen_ai.usage.*``), HTTP ones and the request id; a child span per
projection. The span's context goes upstream as the ``traceparent``. Never bodies, keys or tokens.
The provider's and the operation's names are the adapters' facts (``FormatFacts.provider``,
``CallFacts.operation``), read from the registry.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ...adapters.registry import ADAPTERS, FORMATS

_PROPAGATOR: Final = TraceContextTextMapPropagator()


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector: ``endpoint`` itself when it names ``/v1/traces``,
    else that path under it (``http://collector:4318`` -> ``http://collector:4318/v1/traces``)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


class Tracing:
    """This app's tracer: spans of proxied calls, batched to an OTLP/HTTP collector."""

    def __init__(self, endpoint: str, service_name: str, *, exporter: SpanExporter | None = None) -> None:
        # shut down with the app (``close``), not at exit: an exit hook would keep every app's provider
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}), shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(traces_url(endpoint))))
        self.tracer = self.provider.get_tracer("projectionist")

    def call(self, incoming: Mapping[str, str], *, method: str, path: str, route: str, upstream: str,
             upstream_format: str, request_id: str) -> CallSpan:
        """Start the span of one proxied call (``incoming``: the request's headers, for its
        ``traceparent``; ``path``: the raw path, never the query)."""
        operation = _operation(route, path)
        facts = FORMATS.get(upstream_format)
        # an OpenAI-compatible upstream of another provider is still "openai": the proxy knows formats, not vendors
        provider = (facts.provider or upstream_format) if facts is not None else upstream_format
        attributes: dict[str, str] = {
            "gen_ai.provider.name": provider, "gen_ai.system": provider,
            "http.request.method": method, "url.path": path,
            "projectionist.route": route, "projectionist.upstream": upstream, "projectionist.request_id": request_id,
        }
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation
        span = self.tracer.start_span(operation or f"{method} {route}", _PROPAGATOR.extract(incoming),
                                      kind=SpanKind.SERVER, attributes=attributes)
        return CallSpan(self, span, operation)

    def close(self) -> None:
        """Export what is batched and stop (blocks: call it off the event loop)."""
        self.provider.shutdown()


def _operation(route: str, path: str) -> str | None:
    """``gen_ai.operation.name`` of a call on ``route`` (a projected call's is its adapter's name):
    its adapter's operation, none for token counting, for batches, for a route of no adapter."""
    adapter = ADAPTERS.get(route)
    if adapter is None or path.endswith(adapter.CALLS.counting):
        return None
    return adapter.CALLS.operation


class CallSpan:
    """The span of one proxied call, open until ``end``."""

    __slots__ = ("tracing", "span", "operation")

    def __init__(self, tracing: Tracing, span: trace.Span, operation: str | None) -> None:
        self.tracing = tracing
        self.span = span
        self.operation = operation

    def requested(self, model: str) -> None:
        """The model the request names; a GenAI span is then named ``{operation} {model}``."""
        self.span.set_attribute("gen_ai.request.model", model)
        if self.operation is not None:
            self.span.update_name(f"{self.operation} {model}")

    def projection(self, seconds: float, *, references: int, reads: int, quarantines: int,
                   placeholders: int) -> None:
        """A projection that just ended, ``seconds`` long, as a child span."""
        end = time.time_ns()
        child = self.tracing.tracer.start_span(
            "projection", trace.set_span_in_context(self.span), kind=SpanKind.INTERNAL,
            start_time=end - int(seconds * 1e9),
            attributes={"projectionist.references": references, "projectionist.reads": reads,
                        "projectionist.quarantines": quarantines, "projectionist.placeholders": placeholders})
        child.end(end_time=end)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Name this span as the parent of the upstream's work (``traceparent``, ``tracestate``)."""
        _PROPAGATOR.inject(headers, trace.set_span_in_context(self.span))

    def answered(self, *, model: str | None, input_tokens: int | None, output_tokens: int | None) -> None:
        """What the upstream's answer reported: its model and token usage."""
        if model is not None:
            self.span.set_attribute("gen_ai.response.model", model)
        if input_tokens is not None:
            self.span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        if output_tokens is not None:
            self.span.set_attribute("gen_ai.usage.output_tokens", output_tokens)

    def end(self, status: int | None, fields: Mapping[str, Any]) -> None:
        """The call was answered with ``status`` (None: the client left); ``fields`` are its
        log line's (session, upstream status, error code). An error code, a 5xx answer or a
        client that left marks the span an error (``error.type``)."""
        span = self.span
        error = fields.get("error_code")
        for key, attribute in (("session", "session.id"), ("upstream_status", "projectionist.upstream_status")):
            if (value := fields.get(key)) is not None:
                span.set_attribute(attribute, value)
        if status is None:
            error = error or "CLIENT_DISCONNECTED"
        else:
            span.set_attribute("http.response.status_code", status)
            if error is None and status >= 500:
                error = str(status)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end()
