"""Which cached folds are still current, as a shared log's change notices tell it (proxy layer).

A backend that can push a notice whenever a session's *state* changes (PostgreSQL's
LISTEN/NOTIFY: every append of a quarantine, recovery or fork notifies the session's id) lets a
replica skip the per-request state read of a session whose fold it already holds. ``StateWatch``
is the bookkeeping, no I/O: the backend calls ``notified`` for each notice, ``lost`` when its
listening connection is gone and ``renewed`` once it listens again; the fold cache takes a
``mark`` before each state read and asks ``unchanged`` later.

A mark vouches for a session only while the same listening connection has stayed up and no
notice for that session arrived since the mark was taken. So a lost connection, a notice, or a
notice this bounded memory forgot all send the next request back to the log. What may be stale:
another replica's state change reaches this replica's decisions when its notice arrives
(milliseconds), not before; a request decided in between records the log seq it decided on, so
replay folds the same prefix, and a quarantine it appends still meets the conditional append.

A backend that cannot push (SQLite) is polled instead (``PolledWatch``): each poll reads the state
changes logged since the last one, in the order they were committed. It vouches only while its
latest poll began less than ``max_age`` ago, so another process's state change reaches this
one's decisions within that (``max_age``), and a poller that is idle, slow or failing sends every
request back to the log. Nobody asking for a while lets the poller sleep (``demand``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple


class Mark(NamedTuple):
    """The watch's position when a state read was sent: the connection's generation and the
    number of notices seen so far."""

    generation: int
    notices: int


class StateWatch:
    """Notices of state changes per session, bounded to the ``capacity`` most recent sessions."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self.healthy = False
        self.generation = 0
        self.notices = 0
        self._last: OrderedDict[str, int] = OrderedDict()  # session -> notice count at its last notice
        self._forgotten = 0  # the highest notice count evicted from ``_last``

    def mark(self) -> Mark | None:
        """Where the watch stands now, or None when it cannot vouch for anything (not listening)."""
        return Mark(self.generation, self.notices) if self.healthy else None

    def unchanged(self, session_id: str, mark: Mark | None) -> bool:
        """True when nothing about ``session_id`` can have changed since ``mark`` was taken."""
        if mark is None or not self.healthy or mark.generation != self.generation:
            return False
        return self._last.get(session_id, self._forgotten) <= mark.notices

    def notified(self, session_id: str) -> None:
        self.notices += 1
        self._last[session_id] = self.notices
        self._last.move_to_end(session_id)
        while len(self._last) > self.capacity:
            _, count = self._last.popitem(last=False)
            self._forgotten = max(self._forgotten, count)

    def lost(self) -> None:
        """The listening connection is gone: vouch for nothing until ``renewed``."""
        self.healthy = False

    def renewed(self) -> None:
        """Listening (again): earlier marks stay void, as notices may have been missed meanwhile."""
        self.generation += 1
        self.healthy = True


class PolledWatch(StateWatch):
    """A ``StateWatch`` fed by polls (see the module's docstring); ``clock`` is monotonic seconds.
    The poller calls ``polled`` after each poll that read the changes, ``lost`` after one that
    failed, and waits on ``demand`` when ``idle``."""

    def __init__(self, clock: Callable[[], float], max_age: float, idle_after: float = 1.0,
                 capacity: int = 100_000) -> None:
        super().__init__(capacity)
        self.clock = clock
        self.max_age = max_age
        self.idle_after = idle_after
        self.polled_at = float("-inf")  # when the latest poll that read the changes began
        self.asked_at = float("-inf")
        self.demand = asyncio.Event()

    def current(self) -> bool:
        """Whether the polls are recent enough to vouch now (asking counts as demand)."""
        now = self.asked_at = self.clock()
        if now - self.polled_at <= self.max_age:
            return True
        self.demand.set()
        return False

    def mark(self) -> Mark | None:
        return super().mark() if self.current() else None

    def unchanged(self, session_id: str, mark: Mark | None) -> bool:
        return self.current() and super().unchanged(session_id, mark)

    @property
    def idle(self) -> bool:
        """Nobody asked for ``idle_after``: the poller may wait for ``demand``."""
        return self.clock() - self.asked_at > self.idle_after

    def polled(self, began: float, sessions: list[str], *, gap: bool = False, complete: bool = True) -> None:
        """A poll that began at ``began`` read changes since the previous one: a state change of
        each of ``sessions``; ``complete``: all of them (a poll read in chunks is current only
        once its last chunk is read). With ``gap`` some changes were lost (pruned before they
        were read, or the log restored from a copy): no earlier mark vouches for anything."""
        if gap or not self.healthy:
            self.renewed()
        for session_id in sessions:
            self.notified(session_id)
        if complete:
            self.polled_at = began
