"""In-memory AttachmentStore and SessionLog with the same contracts as the real backends."""

from __future__ import annotations

import asyncio
import hashlib

import msgspec
from collections.abc import Sequence

from projectionist.policy.errors import NOT_FOUND, AppendConflict, AttachmentError, Conflict, InvalidRequest
from projectionist.policy.events import (
    PASSIVE_TYPES,
    CallRecords,
    CheckpointEvent,
    Event,
    EventData,
    Forked,
    ForkedEvent,
    RequestEvent,
    ResponseEvent,
    UnknownEvent,
    envelope,
)
from projectionist.policy.model import StoredImage, check_id
from projectionist.policy.ports import StateRead
from projectionist.proxy.sessionlog.base import SessionStats, append_calls_as_events
from projectionist.proxy.stores.admission import header_info
from projectionist.proxy.stores.base import AttachmentMeta, UploadParts, check_upload, upload_opened


def image(data: bytes, media_type: str = "image/png", width: int = 4, height: int = 3) -> StoredImage:
    return StoredImage("sha256:" + hashlib.sha256(data).hexdigest(), media_type, len(data), width, height, data)


class MemoryStore:
    """A dict of verified images; ``admit`` parses headers like the real stores."""

    def __init__(self, *images: StoredImage) -> None:
        self.images = {i.id: i for i in images}
        self.blobs: dict[str, bytes] = {}
        self.grants: dict[tuple[str, str], str | None] = {}
        #: Uploads under way: name -> offset -> bytes, and the names closed.
        self.parts: dict[str, dict[int, bytes]] = {}
        self.closed: set[str] = set()

    async def read_image(self, attachment_id: str) -> StoredImage:
        check_id(attachment_id)
        await asyncio.sleep(0)
        if attachment_id not in self.images:
            raise AttachmentError(NOT_FOUND, attachment_id=attachment_id)
        return self.images[attachment_id]

    async def admit(self, data: bytes, declared_type: str | None = None, *, name: str | None = None,
                    publish: bool = False) -> StoredImage:
        info = header_info(data)
        stored = image(data, info.media_type, info.width, info.height)
        self.images[stored.id] = stored
        return stored

    async def stat(self, attachment_id: str) -> AttachmentMeta | None:
        i = self.images.get(attachment_id)
        return None if i is None else AttachmentMeta(i.id, i.media_type, i.bytes, i.width, i.height)

    async def list_admitted(self, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]:
        ids = sorted(i for i in self.images if after is None or i > after)[:limit]
        return [meta for i in ids if (meta := await self.stat(i)) is not None]

    async def delete(self, attachment_id: str) -> bool:
        return self.images.pop(attachment_id, None) is not None

    async def grant(self, tenant: str, attachment_id: str, name: str | None = None) -> None:
        self.grants.setdefault((tenant, attachment_id), name)

    async def granted(self, tenant: str, attachment_id: str) -> AttachmentMeta | None:
        meta = await self.stat(attachment_id)
        if meta is None or (tenant, attachment_id) not in self.grants:
            return None
        return msgspec.structs.replace(meta, name=self.grants[(tenant, attachment_id)])

    async def has_grant(self, tenant: str, attachment_id: str) -> bool:
        return (tenant, attachment_id) in self.grants

    async def list_granted(self, tenant: str, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]:
        ids = sorted(i for t, i in self.grants if t == tenant and (after is None or i > after))
        found = [meta for i in ids if (meta := await self.granted(tenant, i)) is not None]
        return found[:limit]

    async def put_blob(self, data: bytes) -> str:
        blob_id = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[blob_id] = data
        return blob_id

    async def get_blob(self, blob_id: str) -> bytes | None:
        return self.blobs.get(blob_id)

    async def put_part(self, upload: str, offset: int, data: bytes) -> bool:
        parts = self.parts.setdefault(check_upload(upload), {})
        if offset in parts:
            return False
        parts[offset] = data
        return True

    async def upload_parts(self, upload: str) -> UploadParts:
        parts = self.parts.get(check_upload(upload), {})
        return UploadParts(tuple(sorted((o, len(d)) for o, d in parts.items())), upload in self.closed)

    async def read_parts(self, upload: str, parts: Sequence[tuple[int, int]]) -> bytes | None:
        held = self.parts.get(check_upload(upload), {})
        if any(len(held.get(offset, b"")) != size or offset not in held for offset, size in parts):
            return None
        return b"".join(held[offset] for offset, _ in parts)

    async def close_upload(self, upload: str) -> bool:
        if check_upload(upload) in self.closed:
            return False
        self.closed.add(upload)
        return True

    async def drop_parts(self, upload: str) -> None:
        self.parts.pop(check_upload(upload), None)

    async def sweep_uploads(self, opened_before: int) -> int:
        expired = {n for n in self.parts.keys() | self.closed if (upload_opened(n) or 0) < opened_before}
        for name in expired:
            self.parts.pop(name, None)
            self.closed.discard(name)
        return len(expired)

    async def ping(self) -> None:
        pass

    async def close(self) -> None:
        pass


class MemoryLog:
    """Append-only per-session lists with the conditional append of the SessionLog contract
    (records and checkpoints after the expected seq never conflict)."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[Event]] = {}

    async def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        await asyncio.sleep(0)
        return [e for e in self.sessions.get(session_id, []) if e.seq > after_seq]

    async def read_state(self, session_id: str, after_seq: int = 0) -> StateRead:
        await asyncio.sleep(0)
        events = self.sessions.get(session_id, [])
        states = [e for e in events if e.seq > after_seq and not isinstance(e, (RequestEvent, ResponseEvent))]
        marks = [i for i, e in enumerate(states) if isinstance(e, CheckpointEvent)]
        return StateRead(states[marks[-1]:] if marks else states, len(events))

    async def append(
        self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *, durable: bool = True
    ) -> list[Event]:
        await asyncio.sleep(0)
        events = self.sessions.setdefault(session_id, [])
        if expected_seq is not None and (expected_seq > len(events) or any(
                (e.type if isinstance(e, UnknownEvent) else type(e).__struct_config__.tag) not in PASSIVE_TYPES
                for e in events[expected_seq:])):
            raise AppendConflict(session_id, expected_seq, len(events))
        new: list[Event] = [envelope(len(events) + i + 1, "t", d) for i, d in enumerate(data)]
        events.extend(new)
        return new

    async def append_calls(self, session_id: str, calls: CallRecords) -> int:
        return await append_calls_as_events(self, session_id, calls)

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

    async def session_stats(self, session: str | None = None, limit: int | None = None) -> list[SessionStats]:
        found = [SessionStats(sid, len(events), events[-1].seq, max(e.time for e in events))
                 for sid, events in self.sessions.items() if events and session in (None, sid)]
        found.sort(key=lambda s: s.session)
        found.sort(key=lambda s: s.last_time, reverse=True)
        return found[:limit]

    async def ping(self) -> None:
        pass

    async def close(self) -> None:
        pass
