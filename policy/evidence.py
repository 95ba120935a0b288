"""Settling a refusal no wording table knows, by evidence rather than by guess (policy layer, pure).

A provider answers 400 in words no table knows ("Request contains an invalid argument.") while
the call carries images this upstream format never accepted in the session: they are the
suspects. ``Evidence`` is the plan of the calls that settle it, each the same call with some
suspects left out (their placeholders in their place):

1. all of them out. A refusal again proves nothing about them: the provider's first answer goes
   back as it came, nothing is recorded (one extra call). A success proves the cause is among
   them; with one suspect it is that one, and this very answer goes to the client;
2. with several, a search for the one that is the cause: the first half of the candidates out; a
   success proves that half (it becomes the candidates), a refusal moves on to the other half,
   whose first half is tried next (a single candidate left is tried alone). What the last success
   proved is recorded, and the answer of the call that proved it goes to the client; when the
   calls that proved it and that came last differ, that call is sent once more.

At most ``MAX_CALLS`` extra calls in all, that last one included: a probe is made only while one
more would still fit after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

#: The most extra calls one refusal may cost: the first without every suspect, the search, and the
#: call that proved the cause sent once more when it is not the last one.
MAX_CALLS: Final = 5


class Probe(msgspec.Struct, frozen=True):
    """Next: send the call with these suspects out."""

    out: tuple[str, ...]


class Settle(msgspec.Struct, frozen=True):
    """Done: these suspects are the cause; record them. ``again``: the call that proved it is not
    the one just answered, so send it once more (else the answer just come goes to the client)."""

    out: tuple[str, ...]
    again: bool = False


class Unproven(msgspec.Struct, frozen=True):
    """Done: leaving every suspect out did not help; the first refusal goes back, nothing recorded."""


Next = Probe | Settle | Unproven


class Evidence:
    """The plan for one refusal's suspects (see the module's docstring), driven by the answers:
    ``first`` names the first call, ``answered`` each next step."""

    def __init__(self, suspects: Sequence[str], limit: int = MAX_CALLS) -> None:
        if not suspects:
            raise ValueError("evidence needs a suspect")
        self.suspects = tuple(dict.fromkeys(suspects))
        self.limit = max(1, limit)
        self.calls = 0
        #: The smallest set so far whose absence made the call succeed.
        self.proven: tuple[str, ...] | None = None
        #: The candidates the cause is searched among, and the ones out in the call in flight.
        self.candidates: tuple[str, ...] = self.suspects
        self.trying: tuple[str, ...] = ()

    def first(self) -> Probe:
        """The first call: every suspect out."""
        return self._probe(self.suspects)

    def answered(self, ok: bool) -> Next:
        """The next step, now that the call with ``trying`` out succeeded (``ok``) or not."""
        if self.proven is None and not ok:
            return Unproven()
        if ok:
            self.proven = self.candidates = self.trying
        else:  # the cause is not (only) among the ones tried: search the rest of the candidates
            self.candidates = self.candidates[len(self.trying):]
        assert self.proven is not None
        if len(self.proven) == 1 or not self.candidates or not self._room():
            return Settle(self.proven, again=not ok)
        return self._probe(self.candidates[:max(1, len(self.candidates) // 2)])

    def _room(self) -> bool:
        """Whether a probe fits the budget with one call left after it (the proven call again)."""
        return self.calls + 2 <= self.limit

    def _probe(self, out: tuple[str, ...]) -> Probe:
        self.calls += 1
        self.trying = out
        return Probe(out)
