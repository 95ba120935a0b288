"""Where the images a client inlined sit in its raw body, found without decoding their base64 (proxy layer).

An agent's request is mostly base64 that comes back unchanged every turn. Decoding it into
Python strings (and encoding those again to hash them) costs more than the proxy's whole relay.
``scan`` finds each base64 run in the raw bytes (after the wire format's ``INLINE_MARKERS``, up
to the closing quote: base64 holds no quote and no backslash), gives it its identity straight
from those bytes (``identity.Identities.of_run``), and decodes the body with each run cut out
(a marker string in its place, with a per-process nonce): a small document whose structure is
the body's. The adapters then find the client's images in it as in any body, each one standing
for its run, and only those runs are hashed. A run no image part accounts for (a ``"data"`` key
that is not an image's, a text that quotes a ``data:`` URL), an image's run that is not base64,
or more than ``MAX_RUNS`` runs make the scan ``complete = False``: the caller decodes the whole
body instead, as it would without a scan, so nothing a scan leaves out (a stand-in's nonce) ever
reaches a digest, a derived session or the upstream.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import msgspec

from ...adapters.base import Carried, WireFormat
from ...policy.errors import Code, InvalidRequest
from ..upstream.identity import MIN_CHARS

_decoder: Final = msgspec.json.Decoder()
#: What stands for a cut-out run in the small document: unguessable, never in a client's JSON.
_NONCE: Final = os.urandom(8).hex()
_MARK: Final = f"\\u0000{_NONCE}:".encode()
_MARK_TEXT: Final = f"\x00{_NONCE}:"
_WHITESPACE: Final = b" \t\r\n"
_BACKSLASH: Final = ord("\\")


class Run(NamedTuple):
    """One base64 run of the raw body: ``raw[start:end]``, and its identity (None: not base64)."""

    start: int
    end: int
    id: str | None


class Scanned(NamedTuple):
    """The body's structure without its base64 (``tree``), its runs in byte order, and the
    client's images found in ``tree`` with their identities (each ``Carried.value`` a marker
    string standing for its run). ``complete``: every run is an image the adapter found."""

    tree: Any
    runs: tuple[Run, ...]
    client: list[tuple[Carried, str]]
    complete: bool

    def run_of(self, data: str) -> Run | None:
        """The run a stand-in string of the small document stands for (None: no stand-in)."""
        number = _run_of(data)
        return self.runs[number] if number is not None and number < len(self.runs) else None

    def payload(self, raw: bytes, attachment_id: str) -> memoryview | None:
        """The base64 of the image with this identity, as the client sent it."""
        for run in self.runs:
            if run.id == attachment_id:
                return memoryview(raw)[run.start:run.end]
        return None


#: The most runs one body is cut into; a body with more is decoded whole instead (and its images
#: past ``body.MAX_CLIENT_IMAGES`` go as they came): cutting costs a little per run.
MAX_RUNS: Final = 2000


def runs(raw: bytes, markers: Sequence[bytes]) -> list[tuple[int, int]] | None:
    """Every base64 run after one of ``markers`` (for a key marker such as ``"data":``, after the
    whitespace and the opening quote), in byte order; runs shorter than ``MIN_CHARS`` or whose
    closing quote may be escaped (a backslash before it) are left in place. A run is not searched
    for a backslash within it (a pass over megabytes): cut out whole, one is still a JSON string
    in the small document, and it is no base64, so it gives no identity (the scan is then not
    ``complete``, and the caller decodes the whole body). None past ``MAX_RUNS`` of them."""
    found: list[tuple[int, int]] = []
    for marker in markers:
        key = marker.endswith(b":")
        at = raw.find(marker)
        while at >= 0:
            if len(found) >= MAX_RUNS:
                return None
            start = at + len(marker)
            if key:
                while start < len(raw) and raw[start] in _WHITESPACE:
                    start += 1
                if raw[start:start + 1] != b'"':
                    at = raw.find(marker, start)
                    continue
                start += 1
            end = raw.find(b'"', start)
            if end < 0:
                break
            if end - start >= MIN_CHARS and raw[end - 1] != _BACKSLASH:
                found.append((start, end))
            at = raw.find(marker, end + 1)
    found.sort()
    return found


def scan(fmt: WireFormat, raw: bytes, identify: Callable[[bytes, int, int], str | None],
         identify_text: Callable[[str], str | None],
         find: Callable[[WireFormat, Any], list[Carried]]) -> Scanned | None:
    """``raw`` scanned as the module docstring says; None when it holds no run at all (the caller
    decodes it, or needs not). ``find`` gives the client's images of a decoded body (the inlined
    ones of the adapter's ``find_slots``, bounded by the caller); an image left in place (short,
    or JSON-escaped) gets its identity from its decoded text (``identify_text``). The small document must be JSON, or
    the body is the client's error (``INVALID_JSON``), as for any body."""
    cuts = runs(raw, fmt.INLINE_MARKERS)
    if cuts is None:
        return Scanned(None, (), [], False)
    if not cuts:
        return None
    view = memoryview(raw)
    pieces: list[bytes | memoryview] = []
    last = 0
    for index, (start, end) in enumerate(cuts):
        if start < last:  # overlapping runs (two markers met one string): not a shape we cut
            return Scanned(None, (), [], False)
        pieces += [view[last:start], _MARK, str(index).encode()]
        last = end
    pieces.append(view[last:])
    try:
        tree = _decoder.decode(b"".join(pieces))
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest("request body is not valid JSON", code=Code.INVALID_JSON) from None
    client: list[tuple[Carried, str]] = []
    ids: dict[int, str] = {}
    for image in find(fmt, tree):
        aid: str | None
        number = _run_of(image.data)
        if number is None:  # left in place: its text is its own
            aid = identify_text(image.data)
        elif number < len(cuts):
            # only a run an image part stands on is hashed; one whose base64 gives no identity
            # leaves the body's structure unknown here (its stand-in would be all it says)
            aid = ids[number] = identify(raw, *cuts[number]) or ""
            if not aid:
                return Scanned(tree, (), [], False)
        else:
            return Scanned(tree, (), [], False)
        if aid is not None:
            client.append((image, aid))
    spans = tuple(Run(start, end, ids.get(index)) for index, (start, end) in enumerate(cuts))
    return Scanned(tree, spans, client, len(ids) == len(cuts))


def _run_of(data: str) -> int | None:
    if not data.startswith(_MARK_TEXT):
        return None
    number = data[len(_MARK_TEXT):]
    return int(number) if number.isascii() and number.isdigit() and len(number) < 9 else None
