"""Readiness: ``GET /readyz`` answers 200 only while the session log and the store both answer (proxy layer).

``/healthz`` is liveness (the process serves) and touches nothing; ``/readyz`` asks each backend
for its cheapest real round trip (``Log.ping``: a read on the log's read lane, or ``SELECT 1``
on a pooled connection; ``Store.ping``: a stat of the objects directory, or a list of one key)
and gives them ``[server] ready_timeout`` together. A check that errs or does not answer in time
makes it 503, naming which one. Open to all, like ``/healthz``, and quiet: it says "ok", a
timeout, or an error code, never a path or a driver's message.

A probe that does not answer keeps running (a hung disk holds its thread whatever we do), and
the next checks wait on that same probe instead of starting another: however often a load
balancer asks, each backend has at most one probe in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from ...policy.errors import ProjectionistError
from ..observe.logger import get_logger

OK = "ok"


class Readiness:
    """Named probes, each with at most one call in flight, checked together within ``timeout``."""

    def __init__(self, probes: Mapping[str, Callable[[], Awaitable[None]]], timeout: float) -> None:
        self.probes = dict(probes)
        self.timeout = timeout
        self._running: dict[str, asyncio.Future[None]] = {}
        self._failing: dict[str, str] = {}

    async def check(self) -> dict[str, str]:
        """Each probe's outcome: ``ok``, ``timeout`` or the error code it raised."""
        outcomes = dict(zip(self.probes, await asyncio.gather(*(self._one(name) for name in self.probes))))
        failing = {name: outcome for name, outcome in outcomes.items() if outcome != OK}
        if failing != self._failing:  # a change is worth a line; a probe every few seconds is not
            if failing:
                get_logger().warning("readiness_changed", ready=False, failing=failing)
            else:
                get_logger().info("readiness_changed", ready=True)
            self._failing = failing
        return outcomes

    async def _one(self, name: str) -> str:
        probe = self._running.get(name)
        if probe is None or probe.done():
            probe = self._running[name] = asyncio.ensure_future(self.probes[name]())
            probe.add_done_callback(_retrieve)
        try:
            await asyncio.wait_for(asyncio.shield(probe), self.timeout)
        except TimeoutError:
            return "timeout"
        except ProjectionistError as error:
            return error.code
        except Exception as exc:  # a probe's own failure is an answer, never a 500
            return type(exc).__name__
        return OK

    async def close(self) -> None:
        """Stop probes still in flight (before the backends they wait on close)."""
        for probe in self._running.values():
            probe.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        self._running.clear()


def _retrieve(probe: asyncio.Future[None]) -> None:
    """Mark a finished probe's exception as seen (nobody may be waiting on it any more)."""
    if not probe.cancelled():
        probe.exception()


READINESS = web.AppKey("readiness", Readiness)


async def readyz(request: web.Request) -> web.Response:
    """200 ``{"status": "ready", "checks": {...}}`` or 503 ``{"status": "unready", ...}``."""
    checks = await request.app[READINESS].check()
    ready = all(outcome == OK for outcome in checks.values())
    return web.json_response({"status": "ready" if ready else "unready", "checks": checks},
                             status=200 if ready else 503)
