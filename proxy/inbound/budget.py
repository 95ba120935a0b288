"""The proxy's memory budget: a bound on the bytes its requests hold at once (proxy layer,
inbound sublayer).

What a client sends is held in memory while its call is under way: a request body (and what it
decodes to), the body the projection builds from it, a WebSocket message and, for a
``response.create``, that message and the body built from it until the call ends (it is kept for
a re-send). Each is bounded on its own (``client_max_size``, ``websocket_max_message``); this
bounds them all together, per process: ``[server] memory_budget`` bytes. A request whose bytes
would take the total past it is refused before they are read where their size is known
(``Content-Length``), else as they arrive, with 503 ``MEMORY_BUSY`` (``Retry-After``): the
bytes held by the calls under way are never touched. A WebSocket message past it gets an
``error`` event (Responses) or closes its socket with 1013, try again later (Realtime): aiohttp
has read that one message by then, and it goes at once.

``Held`` is what one request (or message) holds: it grows as its bytes come and is released once,
when the request ends. A decoded body grows on a worker thread, so the count is under a lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Final, Protocol

from ...policy.errors import Code, Unavailable


#: What a client reads of a refusal.
SPENT: Final = "the proxy holds as many request bytes as its memory budget allows; retry"


class MemoryBusy(Unavailable):
    default_code = Code.MEMORY_BUSY


class Budget:
    """``limit`` bytes, shared by every request of the process; ``held`` are taken now.
    ``refused`` counts refusals by what was refused (``body``, ``decoded``, ``built``, ``message``).
    ``idle``: the seconds a request may send no byte of a body it holds (``bodies.read_raw``), so
    a client that declares a body and never sends it cannot keep its bytes held."""

    def __init__(self, limit: int, idle: float = 60.0) -> None:
        self.limit = limit
        self.idle = idle
        self.held = 0
        self.refused: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, size: int, what: str) -> Held:
        """``size`` bytes held until the result is released; ``MemoryBusy`` when they do not fit."""
        self._add(size, what)
        return Held(self, size)

    def _add(self, size: int, what: str) -> None:
        with self._lock:
            if self.held + size > self.limit:
                self.refused[what] += 1
                raise MemoryBusy(SPENT)
            self.held += size


class Held:
    """The bytes one request holds of a ``Budget``: ``grow`` as more come, ``release`` at its end
    (once; later calls do nothing). A released ``Held`` grows no more: a decode on a worker thread
    that outlives its request (cancelled, the client gone) is refused its next step instead of
    holding bytes no one will give back. On the path of every call: few steps each."""

    __slots__ = ("_budget", "size", "open")

    def __init__(self, budget: Budget, size: int = 0) -> None:
        self._budget = budget
        self.size = size
        self.open = True

    def grow(self, size: int, what: str) -> None:
        if size <= 0:
            return
        budget = self._budget
        with budget._lock:  # noqa: SLF001 (the two are one piece)
            if not self.open:
                raise MemoryBusy("the request ended: its bytes were given back")
            if budget.held + size > budget.limit:
                budget.refused[what] += 1
                raise MemoryBusy(SPENT)
            budget.held += size
            self.size += size

    def less(self, size: int) -> None:
        """Give back ``size`` of the bytes held (at most all of them)."""
        budget = self._budget
        with budget._lock:  # noqa: SLF001
            size = min(size, self.size)
            if size > 0:
                self.size -= size
                budget.held -= size

    def release(self) -> None:
        budget = self._budget
        with budget._lock:  # noqa: SLF001
            self.open = False
            budget.held -= self.size
            self.size = 0


class Holder(Protocol):
    """What keeps a request's ``Held`` (its ``inbound.context.Context``)."""

    held: Held | None


def hold(ctx: Holder, budget: Budget, size: int, what: str) -> Held:
    """``size`` more bytes held by the request of ``ctx`` (released at its end); ``MemoryBusy``
    when they do not fit."""
    held = ctx.held
    if held is None:
        budget._add(size, what)  # noqa: SLF001
        held = ctx.held = Held(budget, size)
    else:
        held.grow(size, what)
    return held
