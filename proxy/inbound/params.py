"""Numbers a client writes in a query, a header or a cookie, read without ever a 500 (proxy layer).

``int()`` refuses a string of more than 4,300 digits with a ``ValueError`` (CPython's guard
against quadratic conversion), which an unguarded handler turned into 500 ``UNCLASSIFIED_ERROR``.
Every count, seq, size and expiry the proxy reads from a client goes through ``natural``.
"""

from __future__ import annotations

from typing import Final

#: The most digits a number from a client may have: every one the proxy reads fits in 63 bits.
DIGITS_MAX: Final = 18


def natural(raw: str | None) -> int | None:
    """The non-negative integer ``raw`` spells in ASCII digits (at most ``DIGITS_MAX``), or None."""
    if raw is None or not 0 < len(raw) <= DIGITS_MAX or not (raw.isascii() and raw.isdigit()):
        return None
    return int(raw)
