"""Resumable upload sessions of the Gemini Files API, held in memory (proxy layer).

A session is opened by a client that presented a client token and is then named only by its
token: the ``google-genai`` SDK sends the bytes to the upload URL with no key at all, so the token
(256 random bits, in the URL) is the credential, and it is good for one upload. The table is
bounded: at most ``MAX_SESSIONS`` open at once, ``MAX_BYTES`` reserved by their declared sizes
together, each at most ``TTL`` seconds old; an expired session is gone, and one that would break a
bound is refused with a retryable 503. One client (its credentials, digested) holds at most a
quarter of either bound, so one client cannot take every slot for ``TTL``.

The token also says what its start declared (type, size, name, owner, tenant, when), signed with a key
the processes share (``PROJECTIONIST_UPLOAD_KEY``: the ``--workers`` supervisor hands its
workers one; replicas behind a load balancer are given the same), so the bytes may arrive at
another worker or replica than the start did: it opens the upload from the token. An upload sent
in one request (``upload, finalize``, what ``google-genai`` does below its 8 MB chunk) finishes
anywhere; one sent in several chunks must send them to one process, and "good for one upload"
holds per process.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from projectionist.policy.errors import NotFound, Unavailable

#: The environment variable that holds the key the processes of one deployment sign tokens with.
KEY_ENV: Final = "PROJECTIONIST_UPLOAD_KEY"

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
    #: The tenant that opened it, to whom the admitted image is granted (None: every tenant).
    tenant: str | None = None
    data: bytearray = field(default_factory=bytearray)
    #: A chunk is being received: another one at the same time is refused, not interleaved.
    receiving: bool = False


def upload_key() -> bytes:
    """The deployment's token key (``KEY_ENV``), else one of this process's own."""
    shared = os.environ.get(KEY_ENV, "")
    return shared.encode() if shared else secrets.token_bytes(32)


class Uploads:
    def __init__(self, max_sessions: int = MAX_SESSIONS, max_bytes: int = MAX_BYTES, ttl: float = TTL,
                 clock: Callable[[], float] = time.monotonic, key: bytes | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.max_sessions, self.max_bytes, self.ttl, self.clock = max_sessions, max_bytes, ttl, clock
        self.key = key if key is not None else upload_key()
        self.wall = wall
        self._open: dict[str, Upload] = {}
        #: Tokens finished or cancelled here (until their TTL): a signed token opens no upload twice.
        self._closed: dict[str, float] = {}

    def __len__(self) -> int:
        self._expire()
        return len(self._open)

    def _expire(self) -> None:
        oldest = self.clock() - self.ttl
        for token in [t for t, u in self._open.items() if u.opened < oldest]:
            del self._open[token]
        for token in [t for t, closed in self._closed.items() if closed < oldest]:
            del self._closed[token]

    def open(self, media_type: str, size: int, name: str | None, owner: str = "", tenant: str | None = None) -> str:
        """A new session's token; ``Unavailable(UPLOADS_BUSY)`` when it would break a bound, the
        whole table's or ``owner``'s share of it (a quarter)."""
        self._expire()
        reserved = sum(u.size for u in self._open.values())
        if len(self._open) >= self.max_sessions or reserved + size > self.max_bytes:
            raise Unavailable("too many uploads under way; retry", code="UPLOADS_BUSY")
        own = [u for u in self._open.values() if u.owner == owner]
        if len(own) >= max(1, self.max_sessions // 4) or sum(u.size for u in own) + size > self.max_bytes // 4:
            raise Unavailable("this client has too many uploads under way; finish them or retry", code="UPLOADS_BUSY")
        payload = base64.urlsafe_b64encode(msgspec.json.encode(
            [media_type, size, name, owner, int(self.wall()), secrets.token_hex(16), tenant])).decode().rstrip("=")
        token = f"{payload}.{self._mac(payload)}"
        self._open[token] = Upload(media_type, size, name, self.clock(), owner, tenant)
        return token

    def _mac(self, payload: str) -> str:
        return hmac.new(self.key, payload.encode(), hashlib.sha256).hexdigest()[:32]

    def _from_token(self, token: str) -> Upload | None:
        """The upload a token another process of this deployment issued declares, or None."""
        payload, _, mac = token.rpartition(".")
        if not payload or len(token) > 2048 or not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        try:
            media_type, size, name, owner, opened, _, tenant = msgspec.json.decode(
                base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (ValueError, binascii.Error, msgspec.DecodeError, TypeError):
            return None
        age = self.wall() - opened if isinstance(opened, int) else self.ttl + 1
        if not (0 <= age <= self.ttl and isinstance(media_type, str) and isinstance(size, int)):
            return None
        if len(self._open) >= self.max_sessions:
            raise Unavailable("too many uploads under way; retry", code="UPLOADS_BUSY")
        upload = Upload(media_type, size, name if isinstance(name, str) else None, self.clock() - age,
                        owner if isinstance(owner, str) else "", tenant if isinstance(tenant, str) else None)
        self._open[token] = upload
        return upload

    def get(self, token: str) -> Upload:
        """The open session of ``token``; ``NotFound(UPLOAD_NOT_FOUND)`` when there is none (never
        opened, finished, cancelled, expired, or opened on another replica)."""
        self._expire()
        upload = self._open.get(token) or (self._from_token(token) if token not in self._closed else None)
        if upload is None:
            raise NotFound("no upload under way at this URL (finished, expired, or started on another replica)",
                           code="UPLOAD_NOT_FOUND")
        return upload

    def close(self, token: str) -> None:
        if self._open.pop(token, None) is not None:
            self._closed[token] = self.clock()
