"""What the proxy needs of a session log beyond the policy's Protocol, and the log's clock (proxy layer)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Protocol

import msgspec

from projectionist.policy.errors import LogCorrupt
from projectionist.policy.events import Event, decode_event
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
        try:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise TypeError(f"stored as {type(body).__name__}")  # a row someone edited by hand
            event = decode_event(bytes(body))
        except (msgspec.DecodeError, UnicodeDecodeError, TypeError, ValueError):
            raise LogCorrupt(session_id, seq, "does not decode") from None
        if event.seq != seq:
            raise LogCorrupt(session_id, seq, f"its body says seq {event.seq}")
        events.append(event)
        expected += 1
    return events
