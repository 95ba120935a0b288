"""Settling a refusal no wording table knows, by evidence rather than by guess (policy layer, pure).

A provider answers 400 in words no table knows ("Request contains an invalid argument.") while
the call carries images this upstream format never accepted in the session: they are the
suspects. ``Evidence`` is the plan of the calls that settle it, each the same call with some
suspects left out (their placeholders in their place):

1. all of them out. A refusal again proves nothing about them: the provider's first answer goes
   back as it came, nothing is recorded (one extra call). A success proves the cause is among
   them; with one suspect it is that one, and this very answer goes to the client;
2. with several, halves are tried, the first half out, then (if that is refused) the second: the
   smallest set whose absence made the call succeed is what is recorded, and the answer of the
   call that proved it goes to the client. When neither half alone suffices (both hold a cause),
   or the budget is spent, the last proven set stands and that call is sent once more.

At most ``MAX_CALLS`` extra calls in all, the last of them the one the client gets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

#: The most extra calls one refusal may cost: the first without every suspect, then halves.
MAX_CALLS: Final = 4


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
        self.trying: tuple[str, ...] = ()
        #: The other half of ``proven``, to try when ``trying`` (the first) fails.
        self.other: tuple[str, ...] = ()

    def first(self) -> Probe:
        """The first call: every suspect out."""
        return self._probe(self.suspects, ())

    def answered(self, ok: bool) -> Next:
        """The next step, now that the call with ``trying`` out succeeded (``ok``) or not."""
        if ok:
            self.proven = self.trying
            if len(self.proven) == 1 or not self._room(2):
                return Settle(self.proven)
            half = len(self.proven) // 2
            return self._probe(self.proven[:half], self.proven[half:])
        if self.proven is None:
            return Unproven()
        if self.other and self._room(2):
            return self._probe(self.other, ())
        return Settle(self.proven, again=True)

    def _room(self, calls: int) -> bool:
        """Whether ``calls`` more fit the budget (a probe that may fail needs one more to settle)."""
        return self.calls + calls <= self.limit

    def _probe(self, out: tuple[str, ...], other: tuple[str, ...]) -> Probe:
        self.calls += 1
        self.trying, self.other = out, other
        return Probe(out)
