"""Resumable upload sessions of the Gemini Files API: bounded per process, their bytes in the store (proxy layer).

A session is opened by a client that presented a client token and is then named only by its
token: the ``google-genai`` SDK sends the bytes to the upload URL with no key at all, so the token
(128 random bits and what its start declared, in the URL) is the credential, and it is good for
one upload. Each process's table is bounded: at most ``MAX_SESSIONS`` open at once,
``MAX_BYTES`` reserved by their declared sizes together, each at most ``TTL`` seconds old; an
expired session is gone, and one that would break a bound is refused with a retryable 503. One
client (its credentials, digested) holds at most a quarter of either bound, so one client cannot
take every slot for ``TTL``; before refusing, a process forgets the sessions it opened that
another process finished meanwhile (``reclaim``).

The token says what its start declared (type, size, name, owner, tenant, when), signed with a
key the processes share (``PROJECTIONIST_UPLOAD_KEY``: the ``--workers`` supervisor hands its
workers one; replicas behind a load balancer are given the same), so any worker or replica opens
the upload from the token. What was received lives in the attachment store, which every worker
and replica shares (``Store.put_part`` and the rest): each chunk is a part at its offset,
put-if-absent, so of two chunks racing for one offset on two processes one is written and the
other refused; the size received is what the parts say; the last chunk is never stored, only
joined to the parts when the upload finishes. Finishing or cancelling first creates the upload's
closed marker, put-if-absent, so exactly one finalize wins and a finished token opens no second
upload anywhere; then the parts are dropped. The parts and markers of uploads past their ``TTL``
are swept (``sweep``, at most once a ``SWEEP_EVERY`` per process, on an upload's start).
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
from dataclasses import dataclass
from typing import Final

import msgspec

from ...policy.errors import Code, InvalidRequest, NotFound, ProjectionistError, Unavailable
from ..observe.logger import get_logger
from ..stores.base import PARTS_MAX, Store, UploadParts, upload_name

#: The environment variable that holds the key the processes of one deployment sign tokens with.
KEY_ENV: Final = "PROJECTIONIST_UPLOAD_KEY"

MAX_SESSIONS: Final = 32
MAX_BYTES: Final = 256 * 1024 * 1024
TTL: Final = 600.0
#: How often (seconds) one process sweeps the store of expired uploads' parts and markers.
SWEEP_EVERY: Final = 60.0
#: Seconds past the TTL a swept upload is: another replica's clock may run behind this one's.
SWEEP_SKEW: Final = 60
#: The most sessions of its own table one start asks the store about before refusing it.
RECLAIM_MAX: Final = 8


@dataclass
class Upload:
    """One upload under way: what its start declared, and where the store keeps its parts."""

    media_type: str
    size: int
    name: str | None
    opened: float
    owner: str = ""
    #: The tenant that opened it, to whom the admitted image is granted (None: every tenant).
    tenant: str | None = None
    #: Its name in the store (``stores.base.upload_name``): its start's second and token's digest.
    stored: str = ""
    #: A chunk is being received here: another one at the same time is refused, not interleaved
    #: (across processes, the store's put-if-absent of a part decides).
    receiving: bool = False


def _gone() -> NotFound:
    return NotFound("no upload under way at this URL (finished, cancelled, expired, or started elsewhere)",
                    code=Code.UPLOAD_NOT_FOUND)


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
        #: Tokens finished or cancelled here (until their TTL): asked of the store only once.
        self._closed: dict[str, float] = {}
        self._swept = -SWEEP_EVERY  # on the clock; the first start sweeps

    def __len__(self) -> int:
        self._expire()
        return len(self._open)

    def _expire(self) -> None:
        oldest = self.clock() - self.ttl
        for token in [t for t, u in self._open.items() if u.opened < oldest]:
            del self._open[token]
        for token in [t for t, closed in self._closed.items() if closed < oldest]:
            del self._closed[token]

    def _refusal(self, size: int, owner: str) -> str | None:
        """Why opening ``size`` more bytes for ``owner`` would break a bound; None when it would not."""
        reserved = sum(u.size for u in self._open.values())
        if len(self._open) >= self.max_sessions or reserved + size > self.max_bytes:
            return "too many uploads under way; retry"
        own = [u for u in self._open.values() if u.owner == owner]
        if len(own) >= max(1, self.max_sessions // 4) or sum(u.size for u in own) + size > self.max_bytes // 4:
            return "this client has too many uploads under way; finish them or retry"
        return None

    def open(self, media_type: str, size: int, name: str | None, owner: str = "", tenant: str | None = None) -> str:
        """A new session's token; ``Unavailable(UPLOADS_BUSY)`` when it would break a bound, the
        whole table's or ``owner``'s share of it (a quarter)."""
        self._expire()
        refusal = self._refusal(size, owner)
        if refusal is not None:
            raise Unavailable(refusal, code=Code.UPLOADS_BUSY)
        opened = int(self.wall())
        payload = base64.urlsafe_b64encode(msgspec.json.encode(
            [media_type, size, name, owner, opened, secrets.token_hex(16), tenant])).decode().rstrip("=")
        token = f"{payload}.{self._mac(payload)}"
        self._open[token] = Upload(media_type, size, name, self.clock(), owner, tenant, _stored(opened, token))
        return token

    async def reclaim(self, store: Store, size: int, owner: str) -> None:
        """Before a start that a bound would refuse: forget the sessions of this table (``owner``'s
        first, the oldest first, at most ``RECLAIM_MAX``) that another process finished or
        cancelled meanwhile, as the store's markers say; their slots and bytes are free again."""
        self._expire()
        if self._refusal(size, owner) is None:
            return
        ordered = sorted(self._open.items(), key=lambda item: (item[1].owner != owner, item[1].opened))
        for token, upload in ordered[:RECLAIM_MAX]:
            if (await store.upload_parts(upload.stored)).closed:
                self.close(token)

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
            raise Unavailable("too many uploads under way; retry", code=Code.UPLOADS_BUSY)
        upload = Upload(media_type, size, name if isinstance(name, str) else None, self.clock() - age,
                        owner if isinstance(owner, str) else "", tenant if isinstance(tenant, str) else None,
                        _stored(opened, token))
        self._open[token] = upload
        return upload

    def get(self, token: str) -> Upload:
        """The open session of ``token`` as far as this process knows (its own table, else the
        signed token); ``NotFound(UPLOAD_NOT_FOUND)`` when there is none (never opened, finished
        or cancelled here, expired). Whether another process closed it is ``held``'s to ask."""
        self._expire()
        upload = self._open.get(token) or (self._from_token(token) if token not in self._closed else None)
        if upload is None:
            raise _gone()
        return upload

    def close(self, token: str) -> None:
        """Forget ``token`` here (the store's marker is ``finish``'s and ``cancel``'s to make)."""
        if self._open.pop(token, None) is not None:
            self._closed[token] = self.clock()

    # -- what the store holds of an upload: every worker and replica sees the same ------------------

    async def held(self, store: Store, token: str) -> tuple[Upload, UploadParts]:
        """The open upload of ``token`` and its parts in the store; ``NotFound(UPLOAD_NOT_FOUND)``
        when there is none, here or anywhere (finished or cancelled on another process)."""
        upload = self.get(token)
        parts = await store.upload_parts(upload.stored)
        if parts.closed:
            self.close(token)
            raise _gone()
        return upload, parts

    async def receive(self, store: Store, upload: Upload, parts: UploadParts, data: bytes) -> int:
        """Store ``data``, the chunk after ``parts``, as a part; the bytes received after it. A
        chunk past ``PARTS_MAX`` parts, or one that lost the race for its offset to another
        chunk (on any process), is ``InvalidRequest(INVALID_UPLOAD)``."""
        received = parts.size
        if not data:
            return received
        if len(parts.received) >= PARTS_MAX:
            raise InvalidRequest(f"the upload was sent in more than {PARTS_MAX} chunks; send larger ones",
                                 code=Code.INVALID_UPLOAD)
        if not await store.put_part(upload.stored, received, data):
            raise InvalidRequest(f"another chunk at offset {received} was received meanwhile", code=Code.INVALID_UPLOAD)
        return received + len(data)

    async def finish(self, store: Store, token: str, upload: Upload, parts: UploadParts, last: bytes) -> bytes:
        """Every byte of the upload, its parts and the ``last`` chunk joined, once this call has
        closed it (the store's marker: of racing finalizes on any processes one gets the bytes,
        the others ``UPLOAD_NOT_FOUND``). Closed whatever comes next (one upload per URL): a size
        other than the declared one is ``InvalidRequest(INVALID_UPLOAD)``. The caller drops the
        parts (``drop``) once it has used the bytes."""
        sent = parts.size + len(last)
        earlier: bytes | None = b""
        if parts.received and sent == upload.size:
            earlier = await store.read_parts(upload.stored, parts.received)
        if earlier is None:  # a part went meanwhile: the upload was closed on another process
            self.close(token)
            raise _gone()
        claimed = await store.close_upload(upload.stored)
        self.close(token)
        if not claimed:
            raise _gone()
        if sent != upload.size:
            await self.drop(store, upload)
            raise InvalidRequest(f"the upload declared {upload.size} bytes and sent {sent}", code=Code.INVALID_UPLOAD)
        return earlier + last

    async def cancel(self, store: Store, token: str) -> None:
        """Close the upload of ``token`` everywhere and drop its parts; ``UPLOAD_NOT_FOUND`` when
        it was closed already."""
        upload = self.get(token)
        claimed = await store.close_upload(upload.stored)
        self.close(token)
        if not claimed:
            raise _gone()
        await self.drop(store, upload)

    async def drop(self, store: Store, upload: Upload) -> None:
        """Drop a closed upload's parts; a store that fails leaves them to the sweep (logged)."""
        try:
            await store.drop_parts(upload.stored)
        except ProjectionistError as error:
            get_logger().warning("upload_parts_not_dropped", code=error.code)

    def sweep_due(self) -> bool:
        """Whether this process should sweep now (at most once a ``SWEEP_EVERY``); the answer
        True counts as the sweep's start."""
        now = self.clock()
        if now - self._swept < SWEEP_EVERY:
            return False
        self._swept = now
        return True

    async def sweep(self, store: Store) -> None:
        """Remove what the store holds of uploads opened more than ``TTL`` (and ``SWEEP_SKEW``)
        ago: their tokens are refused everywhere, so nothing will read their parts or markers."""
        try:
            await store.sweep_uploads(int(self.wall() - self.ttl) - SWEEP_SKEW)
        except ProjectionistError as error:
            get_logger().warning("uploads_not_swept", code=error.code)


def _stored(opened: int, token: str) -> str:
    return upload_name(max(0, opened), hashlib.sha256(token.encode()).hexdigest())
