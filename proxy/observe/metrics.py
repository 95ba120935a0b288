"""Prometheus metrics, one registry per app, served at ``GET /metrics`` (proxy layer).

The hot path only bumps plain ints (the app is one event loop: no locks needed); a collector turns
them into Prometheus families when scraped. Labels are low-cardinality by construction: route
names, HTTP statuses, configured upstream names, failure classes, read results, operation names,
and model names capped per app (``model_label``). Session and attachment ids never become labels.
``OpCounter`` is the exception to "no locks": the store and log backends count what they send to
their service where they send it, some of it on worker threads. The registry also carries
prometheus-client's process, platform and GC collectors (``process_*``, ``python_*``).
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator, Sized
from typing import Final, Protocol

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, GCCollector, PlatformCollector,
                               ProcessCollector, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Distinct ``model`` label values one app admits (models come from clients and upstreams);
#: later ones, and any name that is not 1-100 of ``MODEL_CHARS``, count as ``other``.
MODEL_LABELS: Final = 100
MODEL_CHARS: Final = re.compile(r"[A-Za-z0-9._:/@+-]{1,100}")


class Histogram:
    """Cumulative-on-scrape latency histogram over ``LATENCY_BUCKETS`` (seconds)."""

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        running, buckets = 0, list[tuple[str, float]]()
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.counts):
            running += n
            buckets.append((bound, running))
        return buckets

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        return HistogramMetricFamily(name, documentation, buckets=self.buckets(), sum_value=self.total)


class Watched(Protocol):
    """What metrics read of a log's state-change watch."""

    healthy: bool
    notices: int


class OpCounter:
    """Operations one backend sent to its service (S3 requests, filesystem calls, SQL round
    trips), by operation name. Bumped by the backend at the one place it talks to the service,
    from the event loop or a worker thread; read whole when scraped."""

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, op: str, n: int = 1) -> None:
        with self._lock:
            self._counts[op] += n

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self._counts)

    @property
    def total(self) -> int:
        return sum(self.snapshot().values())


class BudgetReading(Protocol):
    """What the metrics read of the memory budget (``inbound.budget.Budget``)."""

    held: int
    limit: int
    refused: Counter[str]


class Metrics:
    def __init__(self) -> None:
        #: Answers by (route, status, upstream name; "" for the proxy's own routes).
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self.in_flight = 0
        self.quarantines: Counter[str] = Counter()
        self.store_reads: Counter[str] = Counter()
        self.store_retries = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.shared_reads = 0
        self.automatic_recoveries = 0
        self.records_dropped: Counter[str] = Counter()
        #: The records waiting for the writer (the recorder's queue: read when scraped, never counted per call).
        self.records_queue: Sized = ()
        #: Image refusals by an upstream, by what became of them (see ``http.resend``).
        self.rejections: Counter[str] = Counter()
        self.evidence_calls = 0
        #: Answers that could not fetch an image by its URL, by what became of them (``call.resend``).
        self.unfetched: Counter[str] = Counter()
        self.variants_pinned = 0
        #: The memory budget of the requests under way (``inbound.budget``; the services set it).
        self.budget: BudgetReading | None = None
        self.errors_after_start = 0
        self.projection = Histogram()
        #: Time to the upstream's response headers, by upstream name.
        self.upstream: dict[str, Histogram] = {}
        #: Tokens the upstreams' answers reported, by (upstream, model label, "input" | "output").
        self.tokens: Counter[tuple[str, str, str]] = Counter()
        self._models: set[str] = set()
        #: The store's and the log's own counts (``create_app`` wires the backends' counters).
        self.store_ops = OpCounter()
        self.log_round_trips = OpCounter()
        #: The log's state-change watch, when its backend has one (PostgreSQL).
        self.watch: Watched | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def answered(self, route: str, status: int | str, upstream: str = "") -> None:
        self.requests[route, str(status), upstream] += 1

    def upstream_answered(self, upstream: str, seconds: float) -> None:
        """An upstream's response headers arrived ``seconds`` after the request was sent."""
        histogram = self.upstream.get(upstream)
        if histogram is None:
            histogram = self.upstream[upstream] = Histogram()
        histogram.observe(seconds)

    def used(self, upstream: str, model: str | None, input_tokens: int | None, output_tokens: int | None) -> None:
        """The tokens one answer of ``upstream`` reported using, for ``model``."""
        label = self.model_label(model)
        if input_tokens:
            self.tokens[upstream, label, "input"] += input_tokens
        if output_tokens:
            self.tokens[upstream, label, "output"] += output_tokens

    def model_label(self, model: str | None) -> str:
        """``model`` as a label value: ``unknown`` when not known; ``other`` once ``MODEL_LABELS``
        names are taken, or for a name that is not 1-100 of ``MODEL_CHARS``."""
        if not model:
            return "unknown"
        if model in self._models:
            return model
        if len(self._models) >= MODEL_LABELS or MODEL_CHARS.fullmatch(model) is None:
            return "other"
        self._models.add(model)
        return model

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("projectionist_requests", "Requests answered, by route, HTTP status and "
                                       "upstream (empty for the proxy's own routes)",
                                       labels=["route", "status", "upstream"])
        for (route, status, upstream), n in sorted(self.requests.items()):
            requests.add_metric([route, status, upstream], n)
        yield requests
        tokens = CounterMetricFamily("projectionist_tokens", "Tokens the upstreams' answers reported, by upstream, "
                                     "model and kind (input, output)", labels=["upstream", "model", "kind"])
        for (upstream, model, kind), n in sorted(self.tokens.items()):
            tokens.add_metric([upstream, model, kind], n)
        yield tokens
        yield GaugeMetricFamily("projectionist_in_flight_requests", "Requests being handled now", value=self.in_flight)
        if self.budget is not None:
            budget = self.budget
            yield GaugeMetricFamily("projectionist_memory_held_bytes",
                                    "Bytes the requests under way hold of the memory budget", value=budget.held)
            yield GaugeMetricFamily("projectionist_memory_budget_bytes", "The memory budget ([server] memory_budget)",
                                    value=budget.limit)
            yield _by("projectionist_memory_refused", "Requests and messages refused because the memory budget "
                      "was spent, by what was refused (body, decoded, built, message)", "what",
                           Counter({"body": 0, "decoded": 0, "built": 0, "message": 0, **budget.refused}))
        yield _by("projectionist_quarantines", "Quarantine events this replica recorded, by failure class",
                  "failure", self.quarantines)
        yield _by("projectionist_store_reads", "Verified reads of the attachment store, by result",
                  "result", self.store_reads)
        yield CounterMetricFamily("projectionist_store_retries", "Immediate retries after ATTACHMENT_READ_FAILED",
                                  value=self.store_retries)
        yield CounterMetricFamily("projectionist_cache_hits",
                                  "Images served from the verified-object cache (stamp checked)", value=self.cache_hits)
        yield CounterMetricFamily("projectionist_cache_misses",
                                  "Images not in the verified-object cache, or whose stamp changed",
                                  value=self.cache_misses)
        yield CounterMetricFamily("projectionist_automatic_recoveries",
                                  "Retryable quarantines lifted by a probe read that verified",
                                  value=self.automatic_recoveries)
        yield CounterMetricFamily("projectionist_store_shared_reads",
                                  "Reads that joined a read of the same object already in flight",
                                  value=self.shared_reads)
        yield _by("projectionist_image_rejections", "Upstream answers that refused an image, by outcome: "
                  "resent (quarantined and sent once more), learnt (a rule about the request learnt, its images "
                  "fitted and the call sent once more), proven (in words no table knows: leaving images out "
                  "made the call succeed, recorded), unproven (leaving them out did not help: the error went "
                  "back), unattributed (no suspect: the error went back), failed (could not be recorded: the "
                  "error went back)", "outcome",
                  Counter({"resent": 0, "learnt": 0, "proven": 0, "unproven": 0, "unattributed": 0, "failed": 0,
                           **self.rejections}))
        yield CounterMetricFamily("projectionist_evidence_calls",
                                  "Extra upstream calls made to settle a refusal in words no table knows",
                                  value=self.evidence_calls)
        yield _by("projectionist_unfetched_images", "Upstream answers that could not fetch an image by its URL, by "
                  "outcome: resent (the URL quarantined and the call sent once more), unattributed (no URL image "
                  "of the call to put it down to: the error went back), failed (could not be recorded: the error "
                  "went back)", "outcome", Counter({"resent": 0, "unattributed": 0, "failed": 0, **self.unfetched}))
        yield CounterMetricFamily("projectionist_variants_pinned",
                                  "Variants this replica pinned in a session log (an image sent as one that fits "
                                  "its upstream's profile)", value=self.variants_pinned)
        dropped = Counter({"request": 0, "response": 0, **self.records_dropped})  # both kinds, from 0
        yield _by("projectionist_records_dropped", "Request and response records that could not be written "
                  "(the calls went on unrecorded)", "kind", dropped)
        yield GaugeMetricFamily("projectionist_records_queued", "Records waiting for the writer",
                                value=len(self.records_queue))
        yield CounterMetricFamily("projectionist_errors_after_response_started",
                                  "Errors after a response had started: logged, the connection closed",
                                  value=self.errors_after_start)
        yield _by("projectionist_store_operations", "Operations sent to the attachment store (S3 requests, "
                  "filesystem calls), by operation, counted by the store itself", "op", self.store_ops.snapshot())
        if self.watch is not None:
            yield GaugeMetricFamily("projectionist_log_watch_listening", "1 while the log's state-change notices "
                                    "arrive (cached session folds need no read), else 0", value=int(self.watch.healthy))
            yield CounterMetricFamily("projectionist_log_state_notices", "State-change notices received from the "
                                      "log (another replica's or this one's quarantine, recovery or fork)",
                                      value=self.watch.notices)
        yield _by("projectionist_log_round_trips", "Round trips to the session log database (statements and "
                  "transactions sent), by operation, counted by the log itself", "op", self.log_round_trips.snapshot())
        yield self.projection.family("projectionist_projection_seconds",
                                     "Time to project a request body (reads, log, render, encode)")
        latency = HistogramMetricFamily("projectionist_upstream_seconds", "Time from sending a request upstream "
                                        "to its response headers, by upstream", labels=["upstream"])
        for name, histogram in sorted(self.upstream.items()):
            latency.add_metric([name], histogram.buckets(), histogram.total)
        yield latency

    def exposition(self) -> tuple[bytes, str]:
        """The Prometheus text of every family, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _by(name: str, documentation: str, label: str, counts: Counter[str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, n in sorted(counts.items()):
        family.add_metric([value], n)
    return family
