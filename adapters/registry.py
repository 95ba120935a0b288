"""The one registry of wire formats: the adapters, by name; the one that speaks for each upstream
format, and its facts; which adapter projects a path (adapters layer, pure).

A new format is one adapter module (its ``FACTS``, ``CALLS`` and functions: ``base.WireFormat``)
and one entry in ``MODULES``. Everything the proxy does by format reads these tables, never a
format's name. ``index`` fills them in place: whoever imported a table holds the very object.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Final

from . import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from .base import WireFormat
from .facts import FormatFacts, Spoken

#: Every adapter, in the order routing asks its format's hints; the first adapter of each format
#: speaks for it (its errors, its Files API) and declares its facts.
MODULES: Final[tuple[WireFormat, ...]] = (openai_chat, openai_responses, anthropic_messages, anthropic_batches, gemini)

#: Every adapter, by the name records and replay use.
ADAPTERS: Final[dict[str, WireFormat]] = {}
#: The adapter that speaks for each upstream format: its errors (and, where it has one, its Files API).
SPEAKS: Final[dict[str, WireFormat]] = {}
#: Each upstream format's facts, in registry order: the formats a config may name.
FORMATS: Final[dict[str, FormatFacts]] = {}
#: The formats a request that names no upstream may speak, with their hints, in the order they
#: are asked: the one that claims every other request (``Spoken.otherwise``) last.
SPOKEN: Final[list[tuple[str, Spoken]]] = []
#: What the headers and the query of a request may still say of its format (``claims``): each
#: format that may, with the header names and the query parameters that would claim it.
Claims = tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]


def index(modules: Iterable[WireFormat]) -> None:
    """Fill the tables from ``modules`` (``MODULES``, or a test's own list), in place, once
    ``check`` finds them consistent."""
    adapters = {m.NAME: m for m in modules}
    speaks: dict[str, WireFormat] = {}
    for adapter in adapters.values():
        speaks.setdefault(adapter.FORMAT, adapter)
    check(adapters.values(), speaks)
    ADAPTERS.clear()
    ADAPTERS.update(adapters)
    SPEAKS.clear()
    SPEAKS.update(speaks)
    FORMATS.clear()
    FORMATS.update((name, adapter.FACTS) for name, adapter in speaks.items())
    spoken = [(name, facts.spoken) for name, facts in FORMATS.items() if facts.spoken is not None]
    SPOKEN[:] = sorted(spoken, key=lambda entry: entry[1].otherwise)
    claims.cache_clear()


def check(adapters: Iterable[WireFormat], speaks: dict[str, WireFormat]) -> None:
    """A format's adapters share its facts (its speaker's), one format (exactly) claims what no
    other does, and a format whose upstream signs each request has no WebSocket route (a
    handshake is not signed): else ``ValueError``."""
    for adapter in adapters:
        if adapter.FACTS is not speaks[adapter.FORMAT].FACTS or adapter.FACTS.name != adapter.FORMAT:
            raise ValueError(f"adapter {adapter.NAME!r}: its FACTS are not its format's ({adapter.FORMAT!r})")
    facts = [adapter.FACTS for adapter in speaks.values()]
    if [f.spoken.otherwise for f in facts if f.spoken is not None].count(True) != 1:
        raise ValueError("exactly one format claims the requests no other format does (Spoken.otherwise)")
    if any(f.signs_request and f.sockets for f in facts):
        raise ValueError("a format whose upstream signs each request has no WebSocket route")



@functools.lru_cache(maxsize=256)
def claims(path: str) -> tuple[Claims, str]:
    """What ``path`` says of the format a request to it speaks, by the hints in ``SPOKEN``'s
    order: the first format whose path hints claim it (else the one that claims every other
    request), and the formats before it that the request's headers or query may still claim
    (``Claims``). A pure function of the path and the tables, asked of every request that names
    no upstream: the answers for the latest 256 paths are kept (``index`` forgets them)."""
    before: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
    for name, spoken in SPOKEN:
        if (spoken.otherwise or path in spoken.paths or path.startswith(spoken.prefixes)
                or (spoken.pattern is not None and spoken.pattern.fullmatch(path) is not None)):
            return tuple(before), name
        if spoken.headers or spoken.query:
            before.append((name, spoken.headers, spoken.query))
    raise AssertionError("no format claims every other request")  # never: ``check`` refuses that


def projecting(upstream_format: str, method: str, path: str) -> WireFormat | None:
    """The adapter that projects a ``method`` ``path`` on an upstream of ``upstream_format``: a
    POST to one of its ``PATHS`` (generation and the token counting that takes the same body)."""
    if method != "POST":
        return None
    for adapter in ADAPTERS.values():
        if adapter.FORMAT == upstream_format and adapter.PATHS.fullmatch(path):
            return adapter
    return None


index(MODULES)
