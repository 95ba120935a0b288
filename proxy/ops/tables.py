"""Readable tables for the CLI: the sessions list and a session's timeline, one line per event (proxy layer).

Each event type gets a short human summary of its own; nothing here prints a body, a base64
payload or a blob's content, only ids (shortened to ``sha256:`` + 8 hex), counts and names
(JSON-quoted, as the placeholder quotes them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec

from ...policy.events import (
    CheckpointEvent,
    Event,
    ForkedEvent,
    QuarantineEvent,
    RecoveredEvent,
    RejectedEvent,
    RequestEvent,
    ResponseEvent,
    ResponseRecorded,
    VariantEvent,
    type_of,
)
from ...policy.model import short_id as short
from ..sessionlog.summary import SessionSummary


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> str:
    """Columns padded to their widest cell, two spaces apart; columns in ``right`` (numbers) are
    right-aligned; the last column is never padded."""
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    last = len(headers) - 1

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell if i == last and i not in right else
                         cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                         for i, cell in enumerate(cells)).rstrip()

    return "\n".join([line(headers), *(line(row) for row in rows)])


def sessions_table(found: Sequence[SessionSummary]) -> str:
    rows = [(s.session, str(s.events), str(s.quarantined), s.last_activity) for s in found]
    return table(("SESSION", "EVENTS", "QUARANTINED", "LAST ACTIVITY"), rows, right=frozenset({1, 2}))


def timeline_table(events: Sequence[Event]) -> str:
    rows = [(str(e.seq), e.time, type_of(e), describe(e)) for e in events]
    return table(("SEQ", "TIME", "TYPE", "SUMMARY"), rows, right=frozenset({0}))


def _name(name: str | None) -> str:
    return f" {msgspec.json.encode(name).decode()}" if name else ""


def _clean(text: str) -> str:
    """Printable as it is; anything else escaped (a terminal never gets a control character)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _outcome(r: ResponseRecorded) -> str:
    parts = [f"HTTP {r.status}" if r.status is not None else "no status", f"{r.latency_ms:.0f} ms"]
    if r.error_code:
        parts.append(r.error_code)
    usage = " ".join(f"{k}={v}" for k, v in (r.usage or {}).items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool))
    if usage:
        parts.append(f"usage {_clean(usage)}")
    if r.response_blob:
        parts.append("body recorded" + (" (truncated)" if r.response_truncated else ""))
    return "; ".join(parts)


def describe(event: Event) -> str:
    """One short line about ``event``: what a reader of the timeline needs, never a body."""
    if isinstance(event, RequestEvent):
        d = event.data
        outcomes = Counter(ref.outcome for ref in d.refs)
        refs = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items())) or "none"
        call = f"{d.method} {_clean(d.path)} -> {d.upstream} ({d.adapter}); refs: {refs}"
        if d.response is not None:  # the call's outcome in the same record
            call += f" => {_outcome(d.response)}"
        return f"{call}; request {d.request_id}"
    if isinstance(event, ResponseEvent):
        return f"{_outcome(event.data)}; request {event.data.request_id}"
    if isinstance(event, QuarantineEvent):
        q = event.data
        return f"{short(q.attachment_id)} {q.failure}{_name(q.name)}" + (" (retryable)" if q.retryable else "")
    if isinstance(event, RejectedEvent):
        j = event.data
        return (f"{short(j.attachment_id)} refused by {j.format} upstreams{_name(j.name)}; "
                f"{j.suspects} suspect{'s' if j.suspects != 1 else ''}")
    if isinstance(event, RecoveredEvent):
        v = event.data
        return (f"{short(v.attachment_id)} verified: {v.media_type} {v.width}x{v.height}, {v.bytes} bytes"
                + (" (automatic)" if v.automatic else ""))
    if isinstance(event, VariantEvent):
        w = event.data
        return (f"{short(w.attachment_id)} -> {short(w.variant_id)} for {w.target}: "
                f"{w.media_type} {w.width}x{w.height}, {w.bytes} bytes")
    if isinstance(event, ForkedEvent):
        return f"from {event.data.parent} at seq {event.data.at_seq}"
    if isinstance(event, CheckpointEvent):
        c = event.data
        return (f"state at seq {c.state_seq}: {len(c.quarantined)} quarantined, {len(c.rejected)} rejected, "
                f"{len(c.variants)} variants")
    return "a type this version does not know"
