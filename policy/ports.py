"""The two storage Protocols the policy talks through (policy layer, pure).

Backends live in ``proxy/`` (filesystem, SQLite; later S3, PostgreSQL). The policy never sees a
path, a connection or a bucket: only these calls and the error types of ``policy.errors``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from .events import CallRecords, Event, EventData, ForkedEvent
from .model import StoredImage
from .profile import Profile


class AttachmentStore(Protocol):
    async def read_image(self, attachment_id: str) -> StoredImage:
        """Return the verified image, or raise ``AttachmentError`` with exactly one of
        ATTACHMENT_NOT_FOUND, ATTACHMENT_CORRUPT, ATTACHMENT_READ_FAILED, INVALID_ATTACHMENT_REF.
        Cancellation propagates as ``asyncio.CancelledError``, never as a read error."""
        ...


class Varier(Protocol):
    async def __call__(self, image: StoredImage, profile: Profile, count: int) -> tuple[StoredImage, str]:
        """The stored variant of the verified ``image`` that fits ``profile`` in a request of
        ``count`` images (``profile.target(count)``), verified, and the name of the recipe that
        made it: made once per image and target, kept next to the original, never overwriting it.
        Raises anything when none can be made (the original is sent); cancellation propagates."""
        ...


class StateRead(msgspec.Struct, frozen=True):
    """What ``SessionLog.read_state`` returns: state events and the session's last seq."""

    events: list[Event]
    last_seq: int


class SessionLog(Protocol):
    async def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        """Events with ``seq > after_seq`` in seq order (empty for an unknown session).

        The whole log, records included: for the timeline and replay. Folding uses ``read_state``."""
        ...

    async def read_state(self, session_id: str, after_seq: int = 0) -> StateRead:
        """What the fold needs past ``after_seq``, without the records: the events with
        ``seq > after_seq`` whose type is not in ``events.RECORD_TYPES``, in seq order, starting
        at the latest ``session/checkpoint`` among them when there is one; and ``last_seq``, the
        session's last seq as of the same moment (records included: what a conditional append
        expects; 0 for an unknown session). ``fold.fold_states`` folds it.

        Reading after a cached state's last seq is the cheap freshness check: usually empty."""
        ...

    async def append(
        self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *, durable: bool = True
    ) -> list[Event]:
        """Append ``data`` after the session's last event, atomically, only if no *state* event
        (anything but a request/response record or a checkpoint, see ``events.PASSIVE_TYPES``)
        came after ``expected_seq``; otherwise raise ``AppendConflict``. Records and checkpoints
        others appended meanwhile never conflict: they decide nothing. ``expected_seq=None`` appends unconditionally (for
        records). The returned events carry the seqs they got, which may leave a gap after
        ``expected_seq`` (the records in between). ``durable`` appends are on disk before this
        returns; others keep their place in the log's order but may be flushed by the next
        durable append."""
        ...

    async def append_calls(self, session_id: str, calls: CallRecords) -> int:
        """Append the ``request/recorded`` events of ``calls`` (``events.CallRecords``: whole
        calls, their outcomes in them) after the session's last event, unconditionally and not
        durably, as ``append`` would append ``calls.records()``; returns the seq of the last. What
        a read gives back is the same events; a log may store them in fewer bytes."""
        ...

    async def fork(self, parent: str, child: str, at_seq: int | None = None) -> ForkedEvent:
        """Copy ``parent``'s events up to ``at_seq`` (default: all) verbatim into the new session
        ``child`` and append a ``session/forked`` marker. ``Conflict`` if ``child`` exists,
        ``InvalidRequest`` if ``at_seq`` is beyond the parent's last seq."""
        ...
