"""Which reference an upstream's image rejection was about, from the log (policy layer, pure).

An upstream that refuses an image answers the whole request with an error. The adapter reads
the error (``Rejection``: the provider's message, and the image part it names, if any); this
module decides which references to quarantine for that upstream's format:

- a named site is exact: the image inlined there;
- otherwise the suspects are the images this call inlined that this upstream format has never
  accepted in this session: the log's records say which images earlier successful calls
  carried. An image accepted before is never quarantined for a rejection;
- with several suspects, all are quarantined, each saying how many there were.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence

from projectionist.policy.events import Event, Quarantine, RequestEvent, ResponseEvent
from projectionist.policy.profile import Rejection


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


def accepted(events: Iterable[Event], upstream_format: str, format_of: Callable[[str], str | None]) -> set[str]:
    """The attachment ids an upstream of ``upstream_format`` accepted in this session: the
    references inlined in recorded calls (``format_of`` maps a record's adapter to its format)
    whose recorded response was a success (2xx)."""
    requests: dict[int, RequestEvent] = {}
    by_id: dict[str, RequestEvent] = {}
    found: set[str] = set()
    for event in events:
        if isinstance(event, RequestEvent):
            if format_of(event.data.adapter) == upstream_format:
                requests[event.seq] = event
                by_id[event.data.request_id] = event
        elif isinstance(event, ResponseEvent):
            answer = event.data
            if answer.status is None or not 200 <= answer.status < 300:
                continue
            request = requests.get(answer.request_seq) if answer.request_seq else by_id.get(answer.request_id)
            if request is not None:
                found.update(ref.attachment_id for ref in request.data.refs if ref.outcome == "inlined")
    return found


def message_digest(message: str) -> str:
    return "sha256:" + hashlib.sha256(message.encode("utf-8", "replace")).hexdigest()


def quarantines(rejection: Rejection, ids: Sequence[str], upstream_format: str,
                names: Mapping[str, str | None]) -> tuple[Quarantine, ...]:
    """The ``rejected`` quarantines that record ``rejection`` of ``ids`` by ``upstream_format``."""
    digest = message_digest(rejection.message)
    return tuple(Quarantine(aid, "rejected", retryable=False, name=names.get(aid), format=upstream_format,
                            suspects=len(ids), message_digest=digest) for aid in ids)
