"""In-memory AttachmentStore and SessionLog for pure policy tests (same contracts as the backends)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from typing import Awaitable

from policy.errors import NOT_FOUND, AppendConflict, AttachmentError, Conflict, InvalidRequest
from policy.events import Event, EventData, Forked, ForkedEvent, envelope
from policy.model import StoredImage, check_id

Script = Callable[[str, int], Awaitable[None]]


def image(data: bytes, media_type: str = "image/png", width: int = 4, height: int = 3) -> StoredImage:
    return StoredImage("sha256:" + hashlib.sha256(data).hexdigest(), media_type, len(data), width, height, data)


class MemoryStore:
    """Holds images; ``script(id, n)`` runs before the n-th read of an id and may raise or sleep."""

    def __init__(self, *images: StoredImage) -> None:
        self.images = {i.id: i for i in images}
        self.reads: dict[str, int] = {}
        self.script: Script | None = None

    @property
    def total(self) -> int:
        return sum(self.reads.values())

    async def read_image(self, attachment_id: str) -> StoredImage:
        check_id(attachment_id)
        n = self.reads[attachment_id] = self.reads.get(attachment_id, 0) + 1
        await asyncio.sleep(0)
        if self.script is not None:
            await self.script(attachment_id, n)
        if attachment_id not in self.images:
            raise AttachmentError(NOT_FOUND, attachment_id=attachment_id)
        return self.images[attachment_id]


class MemoryLog:
    """Append-only per-session lists with the conditional append of the SessionLog contract."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[Event]] = {}
        self.appends = 0

    async def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        await asyncio.sleep(0)
        return [e for e in self.sessions.get(session_id, []) if e.seq > after_seq]

    async def append(self, session_id: str, expected_seq: int, data: Sequence[EventData]) -> list[Event]:
        await asyncio.sleep(0)
        events = self.sessions.setdefault(session_id, [])
        if len(events) != expected_seq:
            raise AppendConflict(session_id, expected_seq, len(events))
        new: list[Event] = [envelope(expected_seq + i + 1, "t", d) for i, d in enumerate(data)]
        events.extend(new)
        self.appends += 1
        return new

    async def fork(self, parent: str, child: str, at_seq: int | None = None) -> ForkedEvent:
        source = self.sessions.get(parent, [])
        at = len(source) if at_seq is None else at_seq
        if child in self.sessions or child == parent:
            raise Conflict("exists", code="SESSION_EXISTS")
        if not 0 <= at <= len(source):
            raise InvalidRequest("bad seq", code="INVALID_FORK_SEQ")
        marker = envelope(at + 1, "t", Forked(parent, at))
        assert isinstance(marker, ForkedEvent)
        self.sessions[child] = [*source[:at], marker]
        return marker
