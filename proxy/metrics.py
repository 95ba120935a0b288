"""Prometheus metrics, one registry per app, served at ``GET /metrics`` (proxy layer).

Labels are low-cardinality by construction: route names, HTTP statuses, failure classes and read
results. Session ids and attachment ids never become labels.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("projectionist_requests", "Requests answered, by route and HTTP status",
                                ["route", "status"], registry=r)
        self._answered: dict[tuple[str, int | str], Any] = {}
        self.in_flight = Gauge("projectionist_in_flight_requests", "Requests being handled now", registry=r)
        self.quarantines = Counter("projectionist_quarantines", "Quarantine events this replica recorded, by failure class",
                                   ["failure"], registry=r)
        self.store_reads = Counter("projectionist_store_reads", "Verified reads of the attachment store, by result",
                                   ["result"], registry=r)
        self.store_retries = Counter("projectionist_store_retries",
                                     "Immediate retries after ATTACHMENT_READ_FAILED", registry=r)
        self.cache_hits = Counter("projectionist_cache_hits",
                                  "Images served from the verified-object cache (stamp checked)", registry=r)
        self.cache_misses = Counter("projectionist_cache_misses",
                                    "Images not in the verified-object cache, or whose stamp changed", registry=r)
        self.projection_seconds = Histogram("projectionist_projection_seconds",
                                            "Time to project a request body (reads, log, render, encode)",
                                            buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream_seconds = Histogram("projectionist_upstream_seconds",
                                          "Time from sending a request upstream to its response headers",
                                          buckets=_LATENCY_BUCKETS, registry=r)

    def answered(self, route: str, status: int | str) -> None:
        """Count one answered request (label children are looked up once per route and status)."""
        key = (route, status)
        child = self._answered.get(key)
        if child is None:
            child = self._answered[key] = self.requests.labels(route, str(status))
        child.inc()

    def render(self) -> web.Response:
        response = web.Response(body=generate_latest(self.registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response
