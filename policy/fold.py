"""The quarantine fold and the placeholder text (policy layer, pure).

``fold`` turns a session's events into ``SessionState``: which attachments are quarantined, by
which event. A later ``attachment/recovered`` lifts a quarantine. The placeholder is a pure
function of the reference as written and the quarantine event, never of current store state, so
the same log and the same request always project to the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

import msgspec

from projectionist.policy.events import Event, Quarantine, QuarantineEvent, RecoveredEvent
from projectionist.policy.model import ImageRef


class SessionState(msgspec.Struct, frozen=True):
    """Folded view of one session's log up to ``last_seq``; ``since`` holds the time of the event
    behind each quarantine (what a retryable quarantine's probe waits on)."""

    last_seq: int = 0
    quarantined: Mapping[str, Quarantine] = MappingProxyType({})
    since: Mapping[str, str] = MappingProxyType({})


EMPTY = SessionState()


def fold(events: Iterable[Event], state: SessionState = EMPTY) -> SessionState:
    """Apply ``events`` (in seq order, all after ``state.last_seq``) to ``state``.

    Promises: folding a log in one go or in any split of consecutive chunks gives equal states;
    event types the fold does not know only advance ``last_seq``.
    """
    quarantined = dict(state.quarantined)
    since = dict(state.since)
    last = state.last_seq
    for event in events:
        if event.seq != last + 1:
            raise ValueError(f"event seq {event.seq} does not follow {last}")
        last = event.seq
        if isinstance(event, QuarantineEvent):
            quarantined[event.data.attachment_id] = event.data
            since[event.data.attachment_id] = event.time
        elif isinstance(event, RecoveredEvent):
            quarantined.pop(event.data.attachment_id, None)
            since.pop(event.data.attachment_id, None)
    return SessionState(last, MappingProxyType(quarantined), MappingProxyType(since))


def placeholder(ref: ImageRef, quarantine: Quarantine) -> str:
    """The text that stands in for an unavailable image.

    Names the failure class, the display name when known (the reference's own name first, else
    the one recorded with the quarantine; JSON-quoted) and the id prefix ``sha256:`` + 8 hex.
    Example: ``[image unavailable: not_found; "shot.png" (sha256:1a2b3c4d)]``.
    """
    name = ref.name if ref.name is not None else quarantine.name
    short = ref.id[: len("sha256:") + 8]
    if name:
        quoted = msgspec.json.encode(name).decode()
        return f"[image unavailable: {quarantine.failure}; {quoted} ({short})]"
    return f"[image unavailable: {quarantine.failure} ({short})]"
