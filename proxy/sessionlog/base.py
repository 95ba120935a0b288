"""What the proxy needs of a session log beyond the policy's Protocol, and the log's clock (proxy layer)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Protocol

import msgspec

from projectionist.policy.errors import LogCorrupt
from projectionist.policy.events import Event, RequestEvent, ResponseEvent, decode_event
from projectionist.policy.ports import SessionLog


class Log(SessionLog, Protocol):
    """A ``SessionLog`` with a lifetime: ``start`` opens it (schema included), ``close`` ends it."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...


def utc_now() -> str:
    """The default clock of every backend: UTC ISO-8601 with milliseconds and a ``Z`` suffix."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def decode_rows(session_id: str, after_seq: int, rows: Iterable[tuple[int, object]]) -> list[Event]:
    """The events of ``rows`` (seq, body) read after ``after_seq``: each must decode and the seqs
    must follow on without a gap, else ``LogCorrupt`` names the session and the seq."""
    events: list[Event] = []
    expected = after_seq + 1
    for seq, body in rows:
        if not isinstance(seq, int) or seq != expected:
            raise LogCorrupt(session_id, expected, f"missing (the next event found is seq {seq})")
        events.append(_decode(session_id, seq, body))
        expected += 1
    return events


def decode_states(session_id: str, after_seq: int, rows: Iterable[tuple[int, object]]) -> list[Event]:
    """The events of a state read (``SessionLog.read_state``): seqs rise past ``after_seq`` with
    the records' gaps between them; each must decode, and none may be a record."""
    events: list[Event] = []
    last = after_seq
    for seq, body in rows:
        if not isinstance(seq, int) or seq <= last:
            raise LogCorrupt(session_id, last + 1, f"out of order (seq {seq} follows {last})")
        event = _decode(session_id, seq, body)
        if isinstance(event, (RequestEvent, ResponseEvent)):
            raise LogCorrupt(session_id, seq, "a record stored under a state type")
        events.append(event)
        last = seq
    return events


def _decode(session_id: str, seq: int, body: object) -> Event:
    try:
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"stored as {type(body).__name__}")  # a row someone edited by hand
        event = decode_event(bytes(body))
    except (msgspec.DecodeError, UnicodeDecodeError, TypeError, ValueError):
        raise LogCorrupt(session_id, seq, "does not decode") from None
    if event.seq != seq:
        raise LogCorrupt(session_id, seq, f"its body says seq {event.seq}")
    return event
