"""The verified-object cache: base64 of verified images, ready to splice (proxy layer).

Keyed by attachment id and bounded by total bytes (LRU). The id is the content digest, so a cached
entry is always the right bytes for that id; the cache only changes what a request costs, never
what it sends:

- the log still decides: a quarantined reference gets its placeholder (and is never looked up
  here), and a recovery reads and verifies the object again from the store;
- a hit checks the object's *stamp* (inode/size/mtime on the filesystem, ETag and metadata on S3),
  a ``stat`` or a ``HEAD`` instead of a read, a hash and a header parse, unless a check confirmed
  it less than ``stamp_ttl`` seconds ago. A deleted, replaced or rewritten object fails the check,
  drops out of the cache and gets the full verified read, which classifies the fault as usual: a
  storage fault made behind the proxy's back is noticed on the first request after it once the
  window has passed (``stamp_ttl = 0``: on the very next request). Within the window the cache
  serves the bytes it verified, which are the right bytes for that id whatever the store holds;
- a delete through this proxy (``delete``) drops the entry at once, and a read in flight meanwhile
  is served but not cached, so the next request reads the store and finds the object gone.

Entries hold the JSON values adapters splice (a data URL, or the bare base64 string) as
``msgspec.Raw``, so encoding a projected body copies them without re-scanning or re-encoding.
"""

from __future__ import annotations

import asyncio
import pybase64
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgspec

from ...policy.errors import AttachmentError
from ...policy.model import StoredImage
from ..observe.metrics import Metrics
from .base import StampedStore


class Splice:
    """One JSON form of an ``Encoded`` image, as it sits in a rendered body: the upstream encoder
    writes its base64 (``raw``), the record encoder its digest (``digest``)."""

    __slots__ = ("encoded", "form")

    def __init__(self, encoded: Encoded, form: str) -> None:
        self.encoded = encoded
        self.form = form

    def raw(self) -> msgspec.Raw:
        return self.encoded.raw(self.form)

    def digest(self) -> str:
        return self.encoded.digest(self.form)


class Encoded:
    """One verified image's base64 as the JSON values adapters splice: a data URL, or the bare
    string. Each is built on first use from whichever form exists, so an entry usually holds only
    the one form its clients' format needs. Adapters get ``Splice`` markers (``data_url()``,
    ``base64()``); the encoders resolve them.

    A marker is made for each call, never kept here: an ``Encoded`` that held its markers would
    be a reference cycle, freed only by the cyclic GC, and a cold read's base64 (one per image per
    request) would pile up between collections instead of going when its request does."""

    __slots__ = ("media_type", "_head", "_b64", "_url", "_bare", "_digests", "on_resize")

    def __init__(self, media_type: str, b64: bytes) -> None:
        self.media_type = media_type
        self._head = b'"data:' + media_type.encode() + b";base64,"
        self._b64: bytes | None = b64
        self._url: msgspec.Raw | None = None
        self._bare: msgspec.Raw | None = None
        self._digests: dict[str, str] = {}
        #: Told the change in ``size`` when a form is built (the cache keeps its byte total exact).
        self.on_resize: Callable[[Encoded, int], None] | None = None

    @classmethod
    def of(cls, image: StoredImage) -> Encoded:
        return cls(image.media_type, pybase64.b64encode(image.data))

    def _digits(self) -> bytes | memoryview:
        if self._b64 is not None:
            return self._b64
        if self._url is not None:
            return memoryview(self._url)[len(self._head):-1]
        assert self._bare is not None
        return memoryview(self._bare)[1:-1]

    def data_url(self) -> Splice:
        return Splice(self, "data_url")

    def base64(self) -> Splice:
        return Splice(self, "base64")

    def raw(self, form: str) -> msgspec.Raw:
        """The exact JSON bytes of ``form`` ("data_url" or "base64"), built once."""
        if form == "data_url":
            if self._url is None:
                before = self.size
                self._url = msgspec.Raw(b"".join((self._head, self._digits(), b'"')))
                self._b64 = None
                self._resized(before)
            return self._url
        if self._bare is None:
            before = self.size
            self._bare = msgspec.Raw(b"".join((b'"', self._digits(), b'"')))
            self._b64 = None
            self._resized(before)
        return self._bare

    def _resized(self, before: int) -> None:
        if self.on_resize is not None:
            self.on_resize(self, self.size - before)

    def digest(self, form: str) -> str:
        """sha256 of the exact JSON bytes of ``form``, computed once."""
        found = self._digests.get(form)
        if found is None:
            found = self._digests[form] = hashlib.sha256(memoryview(self.raw(form))).hexdigest()
        return found

    @property
    def size(self) -> int:
        return len(self._b64 or b"") + len(self._url or b"") + len(self._bare or b"")


class CachedImage(StoredImage, frozen=True):
    """A verified image served from the cache: ``data`` is empty, ``encoded`` holds its base64."""

    encoded: Any = None


class _Entry:
    __slots__ = ("image", "stamp", "checked")

    def __init__(self, image: CachedImage, stamp: str, checked: float) -> None:
        self.image = image
        self.stamp = stamp
        #: When (the cache's clock) the stamp was last seen in the store: the check or read that
        #: saw it was sent then.
        self.checked = checked

    @property
    def size(self) -> int:
        return int(self.image.encoded.size)


class VerifiedCache:
    """LRU of verified images by id, bounded by ``max_bytes`` of encoded forms (0 disables it)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, attachment_id: str) -> _Entry | None:
        entry = self._entries.get(attachment_id)
        if entry is not None:
            self._entries.move_to_end(attachment_id)
        return entry

    def put(self, image: StoredImage, stamp: str | None, checked: float = -math.inf) -> StoredImage:
        """Remember a freshly verified image whose ``stamp`` the store showed at ``checked``;
        returns what the caller should use."""
        encoded = Encoded.of(image)
        cached = CachedImage(image.id, image.media_type, image.bytes, image.width, image.height, b"", encoded)
        if stamp is None or encoded.size > self.max_bytes:
            return cached
        self.evict(image.id)
        self._entries[image.id] = _Entry(cached, stamp, checked)
        self.bytes += encoded.size
        encoded.on_resize = self._resized
        self._shrink()
        return cached

    def evict(self, attachment_id: str) -> None:
        entry = self._entries.pop(attachment_id, None)
        if entry is not None:
            self._forget(entry)

    def _forget(self, entry: _Entry) -> None:
        entry.image.encoded.on_resize = None  # whoever still holds it no longer counts against us
        self.bytes -= entry.size

    def _resized(self, encoded: Encoded, delta: int) -> None:
        # An entry grows when a second JSON form is built (a client of another format hit it).
        self.bytes += delta
        self._shrink()

    def _shrink(self) -> None:
        while self.bytes > self.max_bytes and self._entries:
            _, entry = self._entries.popitem(last=False)
            self._forget(entry)


class CachedStore:
    """The ``AttachmentStore`` the policy reads through: stamp-checked cache hits (a stamp
    confirmed less than ``stamp_ttl`` seconds ago is not checked again), verified reads on
    misses, and one read in flight per object however many requests want it. A read runs to
    its end (its own timeout bounds it) even when every request that wanted it has left: a
    blocked read cannot be stopped anyway, so a client that gives up and comes back joins the
    read it started instead of starting another. Deletes go through ``delete``, which drops
    the entry at once; everything else (admission, stat, blobs, recovery's fresh reads) uses
    the store itself."""

    def __init__(self, inner: StampedStore, cache: VerifiedCache, metrics: Metrics | None = None, *,
                 stamp_ttl: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.cache = cache
        self.metrics = metrics or Metrics()
        self.stamp_ttl = stamp_ttl
        self.clock = clock
        #: Deletes through this proxy begun or ended so far, and those going on: a read that
        #: overlaps one is not cached.
        self._deletions = 0
        self._deleting = 0
        self._pending: list[tuple[str, asyncio.Future[str | None]]] = []
        #: Stamp checks in flight by id, and when each was sent: concurrent hits share one.
        self._checks: dict[str, tuple[float, asyncio.Future[str | None]]] = {}
        self._flights: dict[str, asyncio.Task[StoredImage]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def _shared_stamp(self, attachment_id: str, entry: _Entry, now: float) -> str | None:
        """The object's stamp; a check of the same id already in flight is joined (the requests
        that find a window expired at once send one check, not one each). A check that confirms
        ``entry`` opens its next window, from when it was sent, before anyone resumes."""
        found = self._checks.get(attachment_id)
        if found is None:
            future = asyncio.ensure_future(self._stamp(attachment_id))
            found = self._checks[attachment_id] = (now, future)
            future.add_done_callback(lambda done: self._check_done(attachment_id, entry, now, done))
        return await asyncio.shield(found[1])

    def _check_done(self, attachment_id: str, entry: _Entry, sent: float, done: asyncio.Future[str | None]) -> None:
        current = self._checks.get(attachment_id)
        if current is not None and current[1] is done:
            del self._checks[attachment_id]
        if done.cancelled() or done.exception() is not None:  # seen here: never "unretrieved"
            return
        if done.result() == entry.stamp:
            entry.checked = max(entry.checked, sent)

    async def _stamp(self, attachment_id: str) -> str | None:
        """The object's stamp; checks asked for in the same loop iteration (the concurrent reads
        of one request) go to the store as one batch."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str | None] = loop.create_future()
        self._pending.append((attachment_id, future))
        if len(self._pending) == 1:
            loop.call_soon(self._send_stamps)
        return await future

    def _send_stamps(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._stamp_batch(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stamp_batch(self, batch: list[tuple[str, asyncio.Future[str | None]]]) -> None:
        try:
            found = await self.inner.stamps([aid for aid, _ in batch])
        except Exception:  # a failed, timed-out or refused check is a miss: the full read decides
            found = [None] * len(batch)
        for (_, future), stamp in zip(batch, found):
            if not future.done():
                future.set_result(stamp)

    async def read_image(self, attachment_id: str) -> StoredImage:
        entry = self.cache.get(attachment_id)
        if entry is not None:
            now = self.clock()
            if now - entry.checked < self.stamp_ttl:  # confirmed within the window: no store op
                self.metrics.cache_hits += 1
                return entry.image
            if await self._shared_stamp(attachment_id, entry, now) == entry.stamp:
                self.metrics.cache_hits += 1
                return entry.image
            self.cache.evict(attachment_id)
        self.metrics.cache_misses += 1
        flight = self._flights.get(attachment_id)
        if flight is None:
            flight = self._flights[attachment_id] = asyncio.get_running_loop().create_task(self._read(attachment_id))
            flight.add_done_callback(lambda done: self._landed(attachment_id, done))
        else:
            self.metrics.shared_reads += 1
        return await asyncio.shield(flight)

    async def _read(self, attachment_id: str) -> StoredImage:
        """The one verified read of an object in flight; its result enters the cache even if
        every request that wanted it has left."""
        started, deletions = self.clock(), self._deletions
        try:
            image, stamp = await self.inner.read_stamped(attachment_id)
        except AttachmentError as error:
            self.metrics.store_reads[error.code.removeprefix("ATTACHMENT_").lower()] += 1
            raise
        self.metrics.store_reads["ok"] += 1
        if deletions != self._deletions or self._deleting:
            stamp = None  # a delete overlapped the read: serve what verified, but do not remember it
        return self.cache.put(image, stamp, started)  # the stamp was taken before the read

    async def delete(self, attachment_id: str) -> bool:
        """Delete through the store and forget the cached entry at once (before and after, so a
        hit in between cannot outlive the delete, and a read in flight is not cached)."""
        self._deletions += 1
        self._deleting += 1
        self.cache.evict(attachment_id)
        try:
            return await self.inner.delete(attachment_id)
        finally:
            self._deletions += 1
            self._deleting -= 1
            self.cache.evict(attachment_id)

    def _landed(self, attachment_id: str, flight: asyncio.Task[StoredImage]) -> None:
        if self._flights.get(attachment_id) is flight:
            del self._flights[attachment_id]
        if not flight.cancelled():
            flight.exception()  # seen here, so an outcome nobody waited for is never "unretrieved"

    async def close(self) -> None:
        """Stop reads nobody waits for any more (the app is shutting down)."""
        for task in [*self._flights.values(), *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._flights.values(), *self._tasks, return_exceptions=True)


def inline(image: StoredImage) -> Any:
    """The adapters' ``Inliner`` for images that came through ``CachedStore``."""
    if isinstance(image, CachedImage):
        return image.encoded
    return Encoded.of(image)
