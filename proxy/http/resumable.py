"""Resumable upload sessions of the Gemini Files API, held in memory (proxy layer).

A session is opened by a client that presented a client token and is then named only by its
token: the ``google-genai`` SDK sends the bytes to the upload URL with no key at all, so the token
(256 random bits, in the URL) is the credential, and it is good for one upload. The table is
bounded: at most ``MAX_SESSIONS`` open at once, ``MAX_BYTES`` reserved by their declared sizes
together, each at most ``TTL`` seconds old; an expired session is gone, and one that would break a
bound is refused with a retryable 503. One client (its credentials, digested) holds at most a
quarter of either bound, so one client cannot take every slot for ``TTL``. Nothing is shared
between replicas or workers: a resumable upload must finish on the process that started it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from projectionist.policy.errors import NotFound, Unavailable

MAX_SESSIONS: Final = 32
MAX_BYTES: Final = 256 * 1024 * 1024
TTL: Final = 600.0


@dataclass
class Upload:
    """One upload under way: what its start declared, and the bytes received so far."""

    media_type: str
    size: int
    name: str | None
    opened: float
    owner: str = ""
    data: bytearray = field(default_factory=bytearray)
    #: A chunk is being received: another one at the same time is refused, not interleaved.
    receiving: bool = False


class Uploads:
    def __init__(self, max_sessions: int = MAX_SESSIONS, max_bytes: int = MAX_BYTES, ttl: float = TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_sessions, self.max_bytes, self.ttl, self.clock = max_sessions, max_bytes, ttl, clock
        self._open: dict[str, Upload] = {}

    def __len__(self) -> int:
        self._expire()
        return len(self._open)

    def _expire(self) -> None:
        oldest = self.clock() - self.ttl
        for token in [t for t, u in self._open.items() if u.opened < oldest]:
            del self._open[token]

    def open(self, media_type: str, size: int, name: str | None, owner: str = "") -> str:
        """A new session's token; ``Unavailable(UPLOADS_BUSY)`` when it would break a bound, the
        whole table's or ``owner``'s share of it (a quarter)."""
        self._expire()
        reserved = sum(u.size for u in self._open.values())
        if len(self._open) >= self.max_sessions or reserved + size > self.max_bytes:
            raise Unavailable("too many uploads under way; retry", code="UPLOADS_BUSY")
        own = [u for u in self._open.values() if u.owner == owner]
        if len(own) >= max(1, self.max_sessions // 4) or sum(u.size for u in own) + size > self.max_bytes // 4:
            raise Unavailable("this client has too many uploads under way; finish them or retry", code="UPLOADS_BUSY")
        token = secrets.token_urlsafe(32)
        self._open[token] = Upload(media_type, size, name, self.clock(), owner)
        return token

    def get(self, token: str) -> Upload:
        """The open session of ``token``; ``NotFound(UPLOAD_NOT_FOUND)`` when there is none (never
        opened, finished, cancelled, expired, or opened on another replica)."""
        self._expire()
        upload = self._open.get(token)
        if upload is None:
            raise NotFound("no upload under way at this URL (finished, expired, or started on another replica)",
                           code="UPLOAD_NOT_FOUND")
        return upload

    def close(self, token: str) -> None:
        self._open.pop(token, None)
