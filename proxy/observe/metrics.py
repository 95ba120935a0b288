"""Prometheus metrics, one registry per app, served at ``GET /metrics`` (proxy layer).

The hot path only bumps plain ints (the app is one event loop: no locks needed); a collector turns
them into Prometheus families when scraped. Labels are low-cardinality by construction: route
names, HTTP statuses, failure classes, read results and operation names. Session and attachment
ids never become labels. ``OpCounter`` is the exception to "no locks": the store and log backends
count what they send to their service where they send it, some of it on worker threads.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


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

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        running, buckets = 0, []
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.counts):
            running += n
            buckets.append((bound, running))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.total)


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


class Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()
        self.in_flight = 0
        self.quarantines: Counter[str] = Counter()
        self.store_reads: Counter[str] = Counter()
        self.store_retries = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.shared_reads = 0
        self.automatic_recoveries = 0
        self.records_dropped: Counter[str] = Counter()
        self.records_queued = 0
        #: Image refusals by an upstream, by what became of them (see ``http.resend``).
        self.rejections: Counter[str] = Counter()
        self.variants_pinned = 0
        self.errors_after_start = 0
        self.projection = Histogram()
        self.upstream = Histogram()
        #: The store's and the log's own counts (``create_app`` wires the backends' counters).
        self.store_ops = OpCounter()
        self.log_round_trips = OpCounter()
        #: The log's state-change watch, when its backend has one (PostgreSQL).
        self.watch: Watched | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def answered(self, route: str, status: int | str) -> None:
        self.requests[route, str(status)] += 1

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("projectionist_requests", "Requests answered, by route and HTTP status",
                                       labels=["route", "status"])
        for (route, status), n in sorted(self.requests.items()):
            requests.add_metric([route, status], n)
        yield requests
        yield GaugeMetricFamily("projectionist_in_flight_requests", "Requests being handled now", value=self.in_flight)
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
                  "resent (quarantined and sent once more), unattributed (no suspect: the error went back), "
                  "failed (could not be recorded: the error went back)", "outcome",
                  Counter({"resent": 0, "unattributed": 0, "failed": 0, **self.rejections}))
        yield CounterMetricFamily("projectionist_variants_pinned",
                                  "Variants this replica pinned in a session log (an image sent as one that fits "
                                  "its upstream's profile)", value=self.variants_pinned)
        dropped = Counter({"request": 0, "response": 0, **self.records_dropped})  # both kinds, from 0
        yield _by("projectionist_records_dropped", "Request and response records that could not be written "
                  "(the calls went on unrecorded)", "kind", dropped)
        yield GaugeMetricFamily("projectionist_records_queued", "Records waiting for the writer",
                                value=self.records_queued)
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
        yield self.upstream.family("projectionist_upstream_seconds",
                                   "Time from sending a request upstream to its response headers")

    def exposition(self) -> tuple[bytes, str]:
        """The Prometheus text of every family, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _by(name: str, documentation: str, label: str, counts: Counter[str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, n in sorted(counts.items()):
        family.add_metric([value], n)
    return family
