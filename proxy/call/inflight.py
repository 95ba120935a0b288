"""What the calls of this process know of each other: each session's acceptances and the images
of calls in flight (proxy layer, call sublayer). ``send`` marks what a call carries while it is
in flight, ``resend`` reads both to decide which image an upstream refused; the edge makes one of
each for the app's ``Services``, which names them by protocol."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from ...adapters.registry import ADAPTERS
from ...policy import rejection as attribution
from ...policy.ports import SessionLog
from ..inbound.context import Timing


def _format_of(adapter: str) -> str | None:
    found = ADAPTERS.get(adapter)
    return found.FORMAT if found is not None else None


class Acceptances:
    """What each upstream format accepted in each session, folded incrementally from the log
    (``policy.rejection.Acceptance``); at most ``size`` sessions kept, least recently used out."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._folds: OrderedDict[tuple[str, str], attribution.Acceptance] = OrderedDict()

    async def of(self, log: SessionLog, session_id: str, upstream_format: str) -> set[str]:
        key = (session_id, upstream_format)
        fold = self._folds.get(key)
        if fold is None:
            fold = self._folds[key] = attribution.Acceptance(upstream_format, _format_of)
        self._folds.move_to_end(key)
        while len(self._folds) > self.size:
            self._folds.popitem(last=False)
        fold.add(await log.read(session_id, fold.last_seq))
        return fold.accepted


class InFlight:
    """The images each call of this process carries while it is in flight, by session and
    upstream format: a call whose upstream answered with a success (2xx) is accepting them at
    that moment, so a concurrent unnamed refusal is not put down to them."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str], dict[int, Carrying]] = {}

    def carrying(self, session_id: str, upstream_format: str, ids: Iterable[str], timing: Timing) -> Carrying:
        """While the returned ``Carrying`` is entered (a context manager), the call timed by
        ``timing`` carries ``ids`` (a re-send sets what the new call carries: ``Carrying.ids``)."""
        return Carrying(timing, frozenset(ids), self._calls, (session_id, upstream_format))

    def accepting(self, session_id: str, upstream_format: str) -> set[str]:
        """The ids carried by this session's calls in flight whose upstream answered 2xx."""
        accepted: set[str] = set()
        for call in self._calls.get((session_id, upstream_format), {}).values():
            if call.timing.status is not None and 200 <= call.timing.status < 300:
                accepted |= call.ids
        return accepted


class Carrying:
    """One call in flight: its timing (whose ``status`` says how its upstream answered) and the
    images its body carries."""

    __slots__ = ("timing", "ids", "_calls", "_key")

    def __init__(self, timing: Timing, ids: frozenset[str], calls: dict[tuple[str, str], dict[int, Carrying]],
                 key: tuple[str, str]) -> None:
        self.timing = timing
        self.ids = ids
        self._calls = calls
        self._key = key

    def __enter__(self) -> Carrying:
        self._calls.setdefault(self._key, {})[id(self.timing)] = self
        return self

    def __exit__(self, *exc: object) -> None:
        calls = self._calls.get(self._key)
        if calls is not None:
            calls.pop(id(self.timing), None)
            if not calls:
                del self._calls[self._key]
