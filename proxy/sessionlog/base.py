"""What the proxy needs of a session log beyond the policy's Protocol, the log's clock, and the
records' group commit both backends share (proxy layer)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple, Protocol

import msgspec

from ...policy.errors import LogCorrupt
from ...policy.events import (CALLS_PREFIX, PRUNED_PREFIX, CallRecords, Event, EventData, RequestEvent,
                              ResponseEvent, calls_events, decode_event, encode_event, pruned_record)
from ...policy.ports import SessionLog


class SessionStats(NamedTuple):
    """One session as the log's index sees it, without reading an event: how many events it
    holds, its last seq and the latest time stored on any of them."""

    session: str
    events: int
    last_seq: int
    last_time: str


class Pruned(NamedTuple):
    """What a ``prune`` did: the records it pruned, in how many sessions, their bytes before and
    after (the log's own rows: what it stores, not what the file or table takes on disk)."""

    records: int = 0
    sessions: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    #: Rows that do not decode: left as they are (a read of them says ``LOG_CORRUPT``), the rest pruned.
    damaged: int = 0

    def __add__(self, other: object) -> Pruned:
        assert isinstance(other, Pruned)
        return Pruned(*(a + b for a, b in zip(self, other)))


#: Rows one transaction of a prune rewrites at most: appends wait for no more than that.
PRUNE_ROWS: Final = 256


class Log(SessionLog, Protocol):
    """A ``SessionLog`` with a lifetime: ``start`` opens it (schema included), ``close`` ends it;
    ``ping`` is the cheapest round trip that proves it answers (readiness); ``session_stats``
    counts every session (or one) in one query, the most recently active first, at most
    ``limit`` of them; ``prune`` turns every record stored before ``before`` (a time as the log
    writes them) into its ``PRUNED`` stand-in, in every session or in one, a bounded number of rows
    per transaction. Nothing else changes: no state event, no seq, no record stored since."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def ping(self) -> None: ...
    async def session_stats(self, session: str | None = None, limit: int | None = None) -> list[SessionStats]: ...
    async def prune(self, before: str, session: str | None = None) -> Pruned: ...


#: One append in a group commit: its session, its events' data and their types; or its session
#: and whole calls' records, types ``None`` (``SessionLog.append_calls``: the log gives back the
#: last seq, not events).
Item = tuple[str, list[EventData], list[str]] | tuple[str, CallRecords, None]


class GroupCommit:
    """Group commit for records: appends made while a batch is being written wait for the next
    one, and ``write`` writes each batch at once (one transaction, or one statement), so a busy
    proxy pays one commit for the records of many calls in many sessions. A caller still returns
    only once its records are written; a batch that fails fails every caller in it."""

    def __init__(self, write: Callable[[list[Item]], Awaitable[list[list[Event] | int]]]) -> None:
        self._write = write
        self._queue: list[tuple[Item, asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def append(self, session_id: str, items: list[EventData], types: list[str]) -> list[Event]:
        events: list[Event] = await self._join((session_id, items, types))
        return events

    async def append_calls(self, session_id: str, calls: CallRecords) -> int:
        """Whole calls' records in the next batch: the seq of the last of them."""
        last: int = await self._join((session_id, calls, None))
        return last

    async def _join(self, item: Item) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((item, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                written = await self._write([item for item, _ in batch])
            except BaseException as exc:  # every waiter of this batch learns why
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, future), events in zip(batch, written):
                if not future.done():
                    future.set_result(events)

    async def close(self) -> None:
        """Wait for the batch being written (appends already queued go with it)."""
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)


async def append_calls_as_events(log: SessionLog, session_id: str, calls: CallRecords) -> int:
    """``SessionLog.append_calls`` for a log that stores each record as an event of its own:
    the calls' records, appended (not durably) after the session's last event."""
    events = await log.append(session_id, None, calls.records(), durable=False)
    return events[-1].seq


def utc_now() -> str:
    """The default clock of every backend: UTC ISO-8601 with milliseconds and a ``Z`` suffix."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def join_records(encoded: list[bytes]) -> bytes:
    """The body of a row that holds several records: a JSON array of the events as each was
    encoded alone (``split_records`` gives each one's bytes back)."""
    return b"[" + b",".join(encoded) + b"]"


def split_records(body: bytes) -> list[bytes]:
    """The events' own bytes in a body of several records (``join_records``, or whole calls'
    records, ``events.encode_calls``: each event as it would be stored alone); a body of one
    event (a JSON object) is itself."""
    if body[:1] != b"[":
        return [body]
    if body.startswith(CALLS_PREFIX):
        return [encode_event(event) for event in calls_events(body)]
    return [bytes(raw) for raw in _rows_decoder.decode(body)]


_rows_decoder: Final = msgspec.json.Decoder(list[msgspec.Raw])


class _Stamp(msgspec.Struct):
    """What a pruned record keeps of one: its type and time (its data is skipped, not decoded)."""

    type: str
    time: str


_stamp: Final = msgspec.json.Decoder(_Stamp)


def pruned_row(seq: int, body: bytes) -> bytes | None:
    """A row of one record or several (``join_records``, the last at ``seq``) with every record
    in it pruned (``pruned_record``), in the row's own shape; None when it holds none to prune.
    ``msgspec.DecodeError`` for a row that does not decode."""
    parts = split_records(body)
    if all(part.startswith(PRUNED_PREFIX) for part in parts):
        return None
    first = seq - len(parts) + 1
    out = []
    for at, part in enumerate(parts, first):
        if not part.startswith(PRUNED_PREFIX):
            stamp = _stamp.decode(part)
            part = pruned_record(at, stamp.time, stamp.type)
        out.append(part)
    return join_records(out) if body[:1] == b"[" else out[0]


def decode_rows(session_id: str, after_seq: int, rows: Iterable[tuple[int, object]]) -> list[Event]:
    """The events of ``rows`` (seq, body) read after ``after_seq``: each must decode and the seqs
    must follow on without a gap, else ``LogCorrupt`` names the session and the seq. A row of
    several records (the SQLite log's, ``join_records``) stands under the seq of its last one and
    may begin at or before ``after_seq``: those of its events are left out."""
    events: list[Event] = []
    expected = after_seq + 1
    for seq, body in rows:
        if isinstance(body, (bytes, memoryview)) and body[:1] == b"[":
            parts = _parts(session_id, seq, bytes(body))
            first = seq - len(parts) + 1 if isinstance(seq, int) else seq
            if not isinstance(seq, int) or first > expected or seq < expected:
                raise LogCorrupt(session_id, expected, f"missing (the next event found is seq {first})")
            for at, part in enumerate(parts[expected - first:], expected):
                events.append(_decode(session_id, at, part))
            expected = seq + 1
            continue
        if not isinstance(seq, int) or seq != expected:
            raise LogCorrupt(session_id, expected, f"missing (the next event found is seq {seq})")
        events.append(_decode(session_id, seq, body))
        expected += 1
    return events


def _parts(session_id: str, seq: int, body: bytes) -> list[bytes] | list[Event]:
    """The records of a row of several: whole calls' events, decoded as the row reads
    (``events.encode_calls``), else each event's own bytes (``join_records``)."""
    try:
        parts: list[bytes] | list[Event] = calls_events(body) if body.startswith(CALLS_PREFIX) \
            else split_records(body)
    except msgspec.DecodeError:
        raise LogCorrupt(session_id, seq, "does not decode") from None
    if not parts:
        raise LogCorrupt(session_id, seq, "an empty row of records")
    return parts


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
    """The event stored as ``body`` at ``seq`` (or decoded already, from a row of whole calls)."""
    try:
        if isinstance(body, msgspec.Struct):
            event: Event = body  # type: ignore[assignment]
        elif not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"stored as {type(body).__name__}")  # a row someone edited by hand
        else:
            event = decode_event(bytes(body))
    except (msgspec.DecodeError, UnicodeDecodeError, TypeError, ValueError):
        raise LogCorrupt(session_id, seq, "does not decode") from None
    if event.seq != seq:
        raise LogCorrupt(session_id, seq, f"its body says seq {event.seq}")
    return event
