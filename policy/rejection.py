"""Which reference an upstream's image rejection was about, from the log (policy layer, pure).

An upstream that refuses an image answers the whole request with an error. The adapter reads
the error (``Rejection``: the provider's message, and the image part it names, if any); this
module decides which references to quarantine for that upstream's format:

- a named site is exact: the image inlined there;
- otherwise the suspects are the images this call inlined that this upstream format has never
  accepted in this session: the log's records say which images earlier successful calls
  carried. An image accepted before is never quarantined for a rejection;
- with several suspects, all are quarantined, each saying how many there were.

A "could not fetch" answer about an image the provider fetches by URL (``Rejection.failure`` is
``not_found`` or ``read_failed``) is attributed among the call's URL images instead
(``unreachable``): the one at the named site, else the URL the message quotes, else each of them.
Having been fetched before clears no URL (presigned links expire), and it is recorded as an
``attachment/quarantine`` (``url``) that holds for every upstream: the URL is gone for all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from .events import Event, Learnt, Quarantine, Rejected, RequestEvent, ResponseEvent, ResponseRecorded
from .failures import FAILURES
from .profile import Rejection


def _within(path: str, site: str) -> bool:
    return path == site or path.startswith(site + "/")


def suspects(rejection: Rejection, carried: Sequence[tuple[str, str]], accepted: Iterable[str]) -> tuple[str, ...]:
    """The attachment ids to quarantine for ``rejection``, in document order, each once.

    ``carried`` is every inlined image of the refused call: (JSON pointer of the value inside the
    upstream body, attachment id). ``accepted`` holds the ids this upstream format took before
    in this session. A site that names no carried image, or only accepted ones, gives none."""
    known = set(accepted)
    if rejection.site is not None:
        named = [aid for path, aid in carried if _within(path, rejection.site)]
    else:
        named = [aid for _, aid in carried]
    return tuple(dict.fromkeys(aid for aid in named if aid not in known))


#: The outcomes of a recorded image that went upstream: inlined by the proxy, or the client's own.
_SENT: Final = frozenset({"inlined", "client"})


class Acceptance:
    """The attachment ids an upstream of ``upstream_format`` accepted in one session, folded from
    its events as they come (``add`` the events past ``last_seq``): the images inlined in
    recorded calls (by the proxy, or by the client itself) (``format_of`` maps a record's adapter to its format) whose recorded response
    was a success (2xx). Calls still waiting for their response are kept, the oldest dropped past
    ``pending_max``."""

    def __init__(self, upstream_format: str, format_of: Callable[[str], str | None], pending_max: int = 10_000) -> None:
        self.upstream_format = upstream_format
        self.format_of = format_of
        self.pending_max = pending_max
        self.last_seq = 0
        self.accepted: set[str] = set()
        self._by_seq: dict[int, tuple[str, frozenset[str]]] = {}
        self._by_id: dict[str, int] = {}

    def add(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.seq <= self.last_seq:
                continue
            self.last_seq = event.seq
            if isinstance(event, RequestEvent):
                if self.format_of(event.data.adapter) == self.upstream_format:
                    inlined = frozenset(r.attachment_id for r in event.data.refs if r.outcome in _SENT)
                    if event.data.response is not None:  # the call's outcome in the same record
                        if _accepted(event.data.response):
                            self.accepted |= inlined
                        continue
                    self._by_seq[event.seq] = (event.data.request_id, inlined)
                    self._by_id[event.data.request_id] = event.seq
                    if len(self._by_seq) > self.pending_max:
                        oldest = next(iter(self._by_seq))
                        self._by_id.pop(self._by_seq.pop(oldest)[0], None)
            elif isinstance(event, ResponseEvent):
                answer = event.data
                seq = answer.request_seq or self._by_id.get(answer.request_id)
                found = self._by_seq.pop(seq, None) if seq is not None else None
                if found is None:
                    continue
                self._by_id.pop(found[0], None)
                if _accepted(answer):
                    self.accepted |= found[1]


def _accepted(answer: ResponseRecorded) -> bool:
    return answer.status is not None and 200 <= answer.status < 300


def message_digest(message: str) -> str:
    return "sha256:" + hashlib.sha256(message.encode("utf-8", "replace")).hexdigest()


def quarantines(rejection: Rejection, ids: Sequence[str], upstream_format: str,
                names: Mapping[str, str | None], forms: Mapping[str, str] | None = None) -> tuple[Rejected, ...]:
    """The ``attachment/rejected`` events that record ``rejection`` of ``ids`` by ``upstream_format``,
    each for the form its image was sent in (``forms``: the ones sent in a spelling of their own)."""
    digest = message_digest(rejection.message)
    forms = forms or {}
    return tuple(Rejected(aid, upstream_format, len(ids), digest, names.get(aid), forms.get(aid, "")) for aid in ids)


def unreachable(rejection: Rejection, linked: Sequence[tuple[str, str, str]]) -> tuple[str, ...]:
    """The ids of the URL images a "could not fetch" answer is about, in document order, each once.

    ``linked`` is every image of the refused call that went upstream as a URL for the provider to
    fetch: (JSON pointer of its part in the upstream body, its id, its URL). A named site is exact:
    the URL images there (none there: the answer is about no URL image of this call). Else the
    URLs the message quotes, where one quoted URL that is merely part of another (``.../a.png`` in
    ``.../a.png?sig=...``, or in an image proxy's ``...?url=.../a.png``) is the longer one. Else,
    when it quotes none of them, every one is a suspect."""
    if rejection.site is not None:
        return tuple(dict.fromkeys(aid for path, aid, _ in linked if _within(path, rejection.site)))
    message = rejection.message
    quoted = {url for _, _, url in linked if url in message}
    quoted = {url for url in quoted if not any(other != url and url in other for other in quoted)}
    named = [aid for _, aid, url in linked if url in quoted] if quoted else [aid for _, aid, _ in linked]
    return tuple(dict.fromkeys(named))


def unfetched(rejection: Rejection, ids: Sequence[str], names: Mapping[str, str | None]) -> tuple[Quarantine, ...]:
    """The ``attachment/quarantine`` events (``url``) that record ``rejection``, a "could not
    fetch" answer, for the URL images ``ids``: its failure, retryable as its row says (``read_failed``)."""
    row = FAILURES[rejection.failure]
    if not row.fetched:
        raise ValueError("a refusal of an image's content is recorded by ``quarantines``")
    return tuple(Quarantine(aid, row.name, retryable=row.retryable, name=names.get(aid), url=True,
                            suspects=len(ids)) for aid in ids)


def learnt(rejection: Rejection, upstream: str, model: str | None, images: int) -> Learnt | None:
    """The rule a refusal about the context of the images teaches for ``upstream`` and ``model``
    (a request of ``images`` images was refused), or None when it says too little to act on (a
    many-image or size rule without its number)."""
    rule = rejection.context
    digest = message_digest(rejection.message)
    if rule == "no_images":
        return Learnt(upstream, model or "", rule, message_digest=digest)
    if rule == "many_images" and rejection.side > 0 and images > 0:
        return Learnt(upstream, model or "", rule, images=images, side=rejection.side, message_digest=digest)
    if rule == "image_side" and rejection.side > 0:
        return Learnt(upstream, model or "", rule, side=rejection.side, message_digest=digest)
    if rule == "image_bytes" and rejection.bytes > 0:
        return Learnt(upstream, model or "", rule, bytes=rejection.bytes, message_digest=digest)
    return None


def stands(rule: Learnt, known: Learnt | None) -> bool:
    """Whether ``known``, the rule learnt before for the same upstream, model and kind, is at
    least as strict as ``rule`` (then learning ``rule`` changes nothing)."""
    if known is None:
        return False
    return (known.images <= rule.images or rule.images == 0) and (known.side <= rule.side or rule.side == 0) \
        and (known.bytes <= rule.bytes or rule.bytes == 0)
