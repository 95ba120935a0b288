"""The images a client inlined, as the policy sees them and as they go upstream (proxy layer).

``inlined`` gives each of the client's images of a body what the policy decides it by: its
identity, what its bytes are (kept by the identity cache since the identity was found, else read
now) and the form the client spelled it in (``form_of``: a label that is not its type, base64
spelled another way than the canonical one). ``client_outcomes`` turns what the policy decided
into what an adapter renders: a variant is an image like any, a respelled one is the client's own
base64 under its true type (``Respelling``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pybase64

from ...adapters.base import Carried, Inline
from ...policy.model import ImageFacts, Inlined, InlineOutcome, Outcome, Resolved, Respelled, StoredImage
from ..stores.admission import normalize_declared_type
from ..upstream.identity import Identities, canonical, decoded_bytes
from .scan import Scanned


def client_outcomes(client: list[tuple[Carried, str]], held: tuple[InlineOutcome, ...], inline: list[Inlined],
                     origin: dict[int, str]) -> tuple[list[Outcome], dict[int, Inline]]:
    """The outcomes to render for the client's images that change (all but the ones sent as they
    came), and the ``Inline`` of each respelled one (by the id of the stand-in image rendered for
    it: the client's own base64 under its true type, spelled canonically). A variant stands for
    its original (``origin``)."""
    outcomes: list[Outcome] = []
    respelled: dict[int, Inline] = {}
    facts = {image.id: image.facts for image in inline}
    for (found, aid), outcome in zip(client, held):
        if outcome is None:
            continue
        if isinstance(outcome, Respelled):
            fact = facts[aid]
            stand_in = StoredImage(aid, outcome.media_type, fact.bytes, fact.width, fact.height, b"")
            respelled[id(stand_in)] = Respelling(outcome.media_type, found.data)
            outcome = Resolved(stand_in)
        elif isinstance(outcome, Resolved):
            origin[id(outcome.image)] = aid
        outcomes.append(outcome)
    return outcomes, respelled


class Respelling:
    """The ``Inline`` of an image the client inlined, respelled: its own base64 (canonical: decoded
    and encoded again where the client's spelling was another) under its true media type."""

    __slots__ = ("media_type", "_b64")

    def __init__(self, media_type: str, data: str) -> None:
        self.media_type = media_type
        self._b64 = data if canonical(data) else pybase64.b64encode(pybase64.b64decode(data, validate=True)).decode()

    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{self._b64}"

    def base64(self) -> str:
        return self._b64


def inlined(client: list[tuple[Carried, str]], identities: Identities, payload: Callable[[str], Any],
            scanned: Scanned | None, raw: bytes) -> list[Inlined]:
    """The client's images as the policy sees them: identity, what the bytes are (kept since the
    identity was found; sniffed now when not), and the form the client spelled them in."""
    found: list[Inlined] = []
    unknown = ImageFacts(None, 0)
    for image, aid in client:
        facts = identities.facts(aid, lambda: _decoded(payload(aid))) or unknown
        found.append(Inlined(aid, facts, form_of(image.declared, facts.media_type, _tail(image.data, scanned, raw))))
    return found


def form_of(declared: str | None, media_type: str | None, tail: str | bytes) -> str:
    """How an image was spelled when that is not canonically (``Inlined.form``): labelled with
    another media type than its bytes are, and/or base64 spelled otherwise than the one way."""
    labelled = declared == media_type or media_type is None or normalize_declared_type(declared or "") == media_type
    if labelled and canonical(tail):
        return ""
    parts = [] if labelled else [f"labelled {(declared or 'nothing')[:64]}"]
    if not canonical(tail):
        parts.append("non-canonical base64")
    return "; ".join(parts)


def _tail(data: str, scanned: Scanned | None, raw: bytes) -> str | bytes:
    """The last characters of an image's base64: of its string, or, for a run the scan cut out
    (``data`` its stand-in), of the run in ``raw``."""
    run = scanned.run_of(data) if scanned is not None else None
    return raw[max(run.start, run.end - 3):run.end] if run is not None else data[-3:]


def _decoded(data: Any) -> bytes | None:
    return decoded_bytes(data) if data is not None else None


def loader(payload: Callable[[str], Any]) -> Callable[[str], bytes | None]:
    """The decoded bytes of the client's image with an identity, from its base64 in the body."""
    return lambda aid: _decoded(payload(aid))
