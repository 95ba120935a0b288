"""When a retryable quarantine gets its probe (policy layer, pure: clocks are injected)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from .fold import SessionState


class Prober:
    """When a retryable quarantine gets its probe: ``after`` seconds after the quarantine's event,
    and after a failed probe, another full ``after`` later (this process remembers, for up to
    ``capacity`` objects). ``after`` of 0 turns probing off. Only a kind the failure table says is
    ``probed`` (``read_failed``) is: only an operator's verified recovery lifts the others; nor is
    a URL image's (``Quarantine.url``): the proxy never fetches it (``Quarantine.probed``)."""

    def __init__(self, after: float, *, now: Callable[[], datetime] | None = None,
                 monotonic: Callable[[], float] = time.monotonic, capacity: int = 10_000) -> None:
        self.after = after
        self._now = now or (lambda: datetime.now(UTC))
        self._monotonic = monotonic
        self._capacity = capacity
        self._failed: OrderedDict[str, float] = OrderedDict()

    def due(self, state: SessionState, ids: Iterable[str]) -> frozenset[str]:
        if self.after <= 0:
            return frozenset()
        now, clock = self._now(), self._monotonic()
        found = set()
        for aid in ids:
            quarantine = state.quarantined.get(aid)
            if quarantine is None or not quarantine.probed:
                continue  # a kind never probed, or a URL's image: the provider's to fetch, never a store read's
            failed = self._failed.get(aid)
            if failed is not None and clock - failed < self.after:
                continue
            since = _parse_time(state.since.get(aid, ""))
            if since is not None and (now - since).total_seconds() >= self.after:
                found.add(aid)
        return frozenset(found)

    def failed(self, attachment_id: str) -> None:
        self._failed[attachment_id] = self._monotonic()
        self._failed.move_to_end(attachment_id)
        while len(self._failed) > self._capacity:
            self._failed.popitem(last=False)


def _parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
