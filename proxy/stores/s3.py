"""S3-compatible attachment store for many replicas (proxy layer).

Content-addressed keys ``{prefix}objects/<hex[:2]>/<hex>``; the admission record travels with the
object as user metadata. Verified reads map faults to exactly the policy's codes: 404/NoSuchKey is
ATTACHMENT_NOT_FOUND; a digest, size, type or dimension mismatch is ATTACHMENT_CORRUPT (``verify``);
any other fault or a timeout is ATTACHMENT_READ_FAILED; cancellation propagates. botocore's,
aiobotocore's and the network's exceptions are one table (``S3_ERRORS``), applied once at each
operation's boundary (``faults.map_exceptions``). Memory stays bounded: the
size on record (never more than ``max_bytes``) is checked against ``Content-Length`` before a byte
is read, and the body is read in chunks up to that size. Every request the client sends is
counted in ``ops`` by a ``before-send`` hook on that one client.

The variant index is one small object per original and target, ``{prefix}variants/<hex[:2]>/<hex>/
<target>``, holding the variant's id; it is created with a conditional put (``If-None-Match: *``,
which AWS S3 and SeaweedFS honour atomically) and replaced only with ``If-Match`` on the stale
entry's ETag. A bucket that ignored those headers would let racing replicas overwrite each other
(each still gets a variant that fits; the index keeps the last).

The chunks of an upload under way (``http.resumable``) are ``{prefix}uploads/<name>/<offset>``
(twelve digits) beside ``{prefix}uploads/<name>/closed`` once it finished or was cancelled, both
created with ``If-None-Match: *`` (of racing chunks at one offset, or racing finalizes, one wins on
every replica); one listing of ``<name>/`` answers what was received. Names begin with the second
the upload was opened, so the expired ones list first and a sweep reads one page.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from functools import partial
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import quote, unquote

import aiohttp
import msgspec
import botocore.exceptions
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from ...policy.errors import CORRUPT, NOT_FOUND, READ_FAILED, AttachmentError, Code
from ...policy.model import ID_PREFIX, StoredImage, check_id, check_tenant, is_valid_id, short_id
from .admission import inspect_image
from ..config import ImageLimits, LanesConfig
from ..faults import FAILED, LOST, MISSING, OS_FAULTS, TIMEOUT, Table, describe, map_exceptions
from ..lanes import AsyncLane, Busy, Lane
from ..observe.metrics import OpCounter
from .base import (
    LIST_MAX,
    PARTS_MAX,
    AttachmentMeta,
    UploadParts,
    check_target,
    check_upload,
    is_valid_target,
    upload_opened,
)
from .verify import verify

WRITE_FAILED: Final = Code.ATTACHMENT_WRITE_FAILED
UNAVAILABLE: Final = Code.STORE_UNAVAILABLE
CHUNK: Final = 256 * 1024
#: Above this size hashing and header parsing move off the event loop.
INLINE_LIMIT: Final = 256 * 1024
_MISSING: Final = ("NoSuchKey", "404", "NotFound")
#: A conditional put that lost: the entry exists (If-None-Match) or changed (If-Match).
_LOST_RACE: Final = ("PreconditionFailed", "412", "ConditionalRequestConflict")
#: An index entry is an id (71 bytes); anything much longer is damage, never read whole.
_ENTRY_MAX: Final = 1024
_HEX: Final = re.compile(r"[0-9a-f]{64}")
#: A part of an upload under way: its offset, twelve digits (``uploads/<name>/<offset>``).
_OFFSET: Final = re.compile(r"[0-9]{12}")
_CLOSED: Final = "closed"
_T = TypeVar("_T")
#: S3 operations by their HTTP verb (the rest are counted by their own name, lowercased).
_VERBS: Final = {"GetObject": "get", "HeadObject": "head", "PutObject": "put", "DeleteObject": "delete",
                 "ListObjectsV2": "list", "ListObjects": "list"}


class S3Store:
    """``AttachmentStore`` + admission on an S3-compatible bucket (aiobotocore, one client per store)."""

    def __init__(
        self,
        *,
        endpoint: str,
        bucket: str,
        region: str = "us-east-1",
        access_key: str = "",
        secret_key: str = "",
        prefix: str = "",
        limits: ImageLimits = ImageLimits(),
        read_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        lanes: LanesConfig = LanesConfig(),
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.limits = limits
        self.read_timeout = read_timeout
        self.reads = AsyncLane("reads", lanes.reads, read_timeout, lanes.queue_timeout)
        self.stamp_lane = AsyncLane("stamps", lanes.stamps, lanes.stamp_timeout, lanes.queue_timeout)
        self.writes = AsyncLane("writes", lanes.writes, lanes.write_timeout, lanes.queue_timeout)
        #: Admission's full decode (CPU and up to ~128 MB per image at the pixel limits): as many
        #: at once as the write lane has places, never an unbounded thread pool.
        self.decodes = Lane("admission", lanes.writes, lanes.write_timeout, lanes.queue_timeout)
        self._client_args: dict[str, Any] = {
            "endpoint_url": endpoint or None,
            "region_name": region,
            "aws_access_key_id": access_key or None,
            "aws_secret_access_key": secret_key or None,
            # a connection for every place in every lane: a call that has its place never queues
            # for a connection behind calls that hang
            "config": AioConfig(connect_timeout=connect_timeout, read_timeout=read_timeout,
                                max_pool_connections=lanes.reads + lanes.stamps + lanes.writes,
                                retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
        }
        #: Every request sent to the bucket, by verb (get, head, put, delete, list, ...).
        self.ops = OpCounter()
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._opening = asyncio.Lock()

    def key(self, hex_digest: str) -> str:
        return f"{self.prefix}objects/{hex_digest[:2]}/{hex_digest}"

    def variants_key(self, hex_digest: str) -> str:
        """The key prefix of one original's variant index entries."""
        return f"{self.prefix}variants/{hex_digest[:2]}/{hex_digest}/"

    async def client(self) -> Any:
        if self._client is None:
            async with self._opening:
                if self._client is None:
                    session = get_session()
                    client = await self._stack.enter_async_context(session.create_client("s3", **self._client_args))
                    client.meta.events.register("before-send.s3", self._sent)
                    self._client = client
        return self._client

    def _sent(self, event_name: str = "", **_: Any) -> None:
        """The one place every request leaves (``before-send``, once per attempt): count it. Returns
        None, so botocore sends the request itself."""
        name = event_name.rsplit(".", 1)[-1]
        self.ops.add(_VERBS.get(name, name.lower()))

    async def close(self) -> None:
        self._client = None
        self.decodes.close()
        await self._stack.aclose()

    # -- reads -----------------------------------------------------------------------------------

    async def read_image(self, attachment_id: str) -> StoredImage:
        return (await self.read_stamped(attachment_id))[0]

    async def stamps(self, attachment_ids: Sequence[str]) -> list[str | None]:
        """``stamp`` of each id, the HEADs sent concurrently."""
        return list(await asyncio.gather(*(self.stamp(aid) for aid in attachment_ids)))

    async def stamp(self, attachment_id: str) -> str | None:
        """A cheap token (ETag, Last-Modified, metadata from a HEAD) that changes whenever the
        object is replaced or removed; None when absent or unreadable."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        async def fetch_head() -> Any:
            return await (await self.client()).head_object(Bucket=self.bucket, Key=self.key(hex_digest))

        try:
            head = await self.stamp_lane.run(fetch_head)
        except Exception as exc:
            if S3_ERRORS.classify(exc) is None and not isinstance(exc, Busy):
                raise
            return None  # a failed check is a miss: the full read classifies the fault
        return _stamp(head)

    async def read_stamped(self, attachment_id: str) -> tuple[StoredImage, str | None]:
        """``read_image`` plus the object's stamp from the same GET (see ``stamp``)."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        with map_exceptions(S3_ERRORS, READ_FAILED, short_id(attachment_id), missing=NOT_FOUND,
                            attachment_id=attachment_id):
            return await self.reads.run(lambda: self._read(hex_digest))

    async def _read(self, hex_digest: str) -> tuple[StoredImage, str]:
        """The GET, its record's checks before a byte is read, the body in chunks, then ``verify``
        (off the loop when large)."""
        attachment_id = ID_PREFIX + hex_digest

        def corrupt(why: str) -> AttachmentError:
            return AttachmentError(CORRUPT, f"{CORRUPT}: {short_id(attachment_id)} {why}", attachment_id=attachment_id)

        client = await self.client()
        response = await client.get_object(Bucket=self.bucket, Key=self.key(hex_digest))
        body = response["Body"]
        try:
            meta = _record(response.get("Metadata") or {})
            if meta is None:
                raise corrupt("has no valid admission record")
            length = int(response.get("ContentLength", -1))
            if meta.bytes > self.limits.max_bytes or length != meta.bytes:
                raise corrupt(f"size {length} disagrees with its record ({meta.bytes})")
            data = bytearray()
            async for chunk in body.iter_chunks(CHUNK):
                data += chunk
                if len(data) > meta.bytes:
                    raise corrupt("is longer than its record")
        finally:
            body.close()
        image: StoredImage = await _off_loop(len(data), verify, attachment_id, bytes(data), meta)
        return image, _stamp(response)

    async def stat(self, attachment_id: str) -> AttachmentMeta | None:
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]

        async def fetch() -> Any:
            return await (await self.client()).head_object(Bucket=self.bucket, Key=self.key(hex_digest))

        head = await _unless_missing(self.stamp_lane.run(fetch), f"{short_id(attachment_id)} stat")
        if head is None:
            return None
        record = _record(head.get("Metadata") or {})
        return None if record is None else msgspec.structs.replace(record, id=attachment_id)

    async def start(self) -> None:
        """Start-up: the S3 client now (botocore loads its service model), so a process's first
        request does not build it; nothing is sent."""
        await self.client()

    async def ping(self) -> None:
        """Readiness: a list of at most one key on the stamp lane. Unlike a HEAD of an absent key
        (a 404 either way), it fails when the bucket is missing or the credentials are refused."""
        async def list_one() -> Any:
            return await (await self.client()).list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}objects/",
                                                               MaxKeys=1)

        with map_exceptions(S3_ERRORS, UNAVAILABLE, "bucket"):
            await self.stamp_lane.run(list_one)

    async def list_admitted(self, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]:
        """Admission records of present objects after ``after``, in id order (see ``Store``): key
        order is id order, so one ``ListObjectsV2`` page (``StartAfter``) and one HEAD per object."""
        limit = max(0, min(limit, LIST_MAX))
        start = self.key(check_id(after)[len(ID_PREFIX):]) if after is not None else ""

        def digest_of(key: str) -> str | None:
            hex_digest = key.rsplit("/", 1)[-1]
            return hex_digest if _HEX.fullmatch(hex_digest) and key == self.key(hex_digest) else None

        return await self._listed(f"{self.prefix}objects/", start, limit, digest_of, self._head_record)

    async def _listed(self, prefix: str, start: str, limit: int, digest_of: Callable[[str], str | None],
                      meta_of: Callable[[Any, str], Awaitable[AttachmentMeta | None]]) -> list[AttachmentMeta]:
        """Up to ``limit`` records of the keys under ``prefix`` after ``start``, in key order:
        ``ListObjectsV2`` pages (``StartAfter``), each key's digest by ``digest_of`` (None: not
        one), its record by ``meta_of`` (None: gone meanwhile), on the stamp lane."""
        async def fetch() -> list[AttachmentMeta]:
            client = await self.client()
            found: list[AttachmentMeta] = []
            token = start
            while len(found) < limit:
                page = {"StartAfter": token} if token else {}
                listing = await client.list_objects_v2(Bucket=self.bucket, Prefix=prefix,
                                                       MaxKeys=limit - len(found), **page)
                keys = [str(item["Key"]) for item in listing.get("Contents") or ()]
                for key in keys:
                    hex_digest = digest_of(key)
                    if hex_digest is not None:
                        meta = await meta_of(client, hex_digest)
                        found += [meta] if meta is not None else []
                if not keys or not listing.get("IsTruncated"):
                    break
                token = keys[-1]
            return found

        return await _unless_missing(self.stamp_lane.run(fetch), "listing") or []

    async def _head_record(self, client: Any, hex_digest: str) -> AttachmentMeta | None:
        """The admission record of one listed object; None when it went meanwhile or has none."""
        head = await _unless(MISSING, client.head_object(Bucket=self.bucket, Key=self.key(hex_digest)))
        if head is None:
            return None
        record = _record(head.get("Metadata") or {})
        return None if record is None else msgspec.structs.replace(record, id=ID_PREFIX + hex_digest)

    # -- grants: what each tenant admitted (``stores.tenancy``) ------------------------------------

    def grant_key(self, tenant: str, hex_digest: str = "") -> str:
        """``grants/<tenant>/<hex>`` (the tenant's prefix without a digest)."""
        return f"{self.prefix}grants/{check_tenant(tenant)}/{hex_digest}"

    async def grant(self, tenant: str, attachment_id: str, name: str | None = None) -> None:
        """Record that ``tenant`` admitted ``attachment_id``: an empty object whose metadata holds
        the name and time; put-if-absent, so the first admission's name stays."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        metadata = {"created-at": str(int(time.time()))}
        if name:
            metadata["name"] = quote(name, safe="")

        async def put() -> Any:  # a put that lost: granted already
            return await _unless(LOST, (await self.client()).put_object(
                Bucket=self.bucket, Key=self.grant_key(tenant, hex_digest), Body=b"", Metadata=metadata,
                IfNoneMatch="*"))

        with map_exceptions(S3_ERRORS, WRITE_FAILED, f"{short_id(attachment_id)} grant"):
            await self.writes.run(put)

    async def granted(self, tenant: str, attachment_id: str) -> AttachmentMeta | None:
        """The record of a present object ``tenant`` admitted, with its own name and time."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]

        async def fetch() -> AttachmentMeta | None:
            return await self._granted(await self.client(), tenant, hex_digest)

        return await _unless_missing(self.stamp_lane.run(fetch), f"{short_id(attachment_id)} grant")

    async def has_grant(self, tenant: str, attachment_id: str) -> bool:
        """Whether ``tenant`` admitted ``attachment_id``: one HEAD of its grant, nothing of the object."""
        key = self.grant_key(tenant, check_id(attachment_id)[len(ID_PREFIX):])

        async def fetch() -> Any:
            return await (await self.client()).head_object(Bucket=self.bucket, Key=key)

        return await _unless_missing(self.stamp_lane.run(fetch), f"{short_id(attachment_id)} grant lookup") is not None

    async def _granted(self, client: Any, tenant: str, hex_digest: str) -> AttachmentMeta | None:
        head = await _unless(MISSING, client.head_object(Bucket=self.bucket, Key=self.grant_key(tenant, hex_digest)))
        if head is None:
            return None
        meta = await self._head_record(client, hex_digest)
        if meta is None:
            return None
        grant = head.get("Metadata") or {}
        name = unquote(grant["name"]) if "name" in grant else None
        created = grant.get("created-at", "0")
        return msgspec.structs.replace(meta, name=name, created_at=int(created) if created.isdigit() else 0)

    async def list_granted(self, tenant: str, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]:
        """``list_admitted`` for what ``tenant`` admitted: its grants' keys in id order."""
        limit = max(0, min(limit, LIST_MAX))
        prefix = self.grant_key(tenant)
        start = prefix + check_id(after)[len(ID_PREFIX):] if after is not None else ""

        def digest_of(key: str) -> str | None:
            hex_digest = key[len(prefix):]
            return hex_digest if _HEX.fullmatch(hex_digest) else None

        async def granted(client: Any, hex_digest: str) -> AttachmentMeta | None:
            return await self._granted(client, tenant, hex_digest)

        return await self._listed(prefix, start, limit, digest_of, granted)

    # -- writes ----------------------------------------------------------------------------------

    async def admit(self, data: bytes, declared_type: str | None = None, *, name: str | None = None,
                    publish: bool = False) -> StoredImage:
        """Validate and store; idempotent (a verified existing object is left alone); re-admitting
        the right bytes repairs a missing or corrupt object. With ``publish`` the bytes are put
        whether or not a copy is there (the first admission's name and time kept, from a HEAD
        asked either way): the same requests either way, so their time tells no one whether it was."""
        with map_exceptions(S3_ERRORS, WRITE_FAILED, "admission"):
            # Always a thread: admission decodes every pixel, and a few KB can hold millions of them.
            info = await self.decodes.run(partial(inspect_image, data, declared_type, self.limits))
            hex_digest = await _off_loop(len(data), lambda: hashlib.sha256(data).hexdigest())
            first: AttachmentMeta | None = None
            if publish:
                first = await self.stat(ID_PREFIX + hex_digest)
            else:
                try:
                    return await self.read_image(ID_PREFIX + hex_digest)
                except AttachmentError:
                    pass  # absent, corrupt or unreadable: (re)publish
            metadata = {"media-type": info.media_type, "bytes": str(len(data)), "width": str(info.width),
                        "height": str(info.height),
                        "created-at": str(first.created_at if first is not None else int(time.time()))}
            name = first.name if first is not None else name
            if name:
                metadata["name"] = quote(name, safe="")

            async def put() -> Any:
                return await (await self.client()).put_object(Bucket=self.bucket, Key=self.key(hex_digest), Body=data,
                                                              ContentType=info.media_type, Metadata=metadata)

            await self.writes.run(put)
        return StoredImage(ID_PREFIX + hex_digest, info.media_type, len(data), info.width, info.height, data)

    def blob_key(self, hex_digest: str) -> str:
        return f"{self.prefix}blobs/{hex_digest[:2]}/{hex_digest}"

    async def put_blob(self, data: bytes) -> str:
        """Store opaque bytes (recorded bodies) content-addressed; returns ``sha256:<hex>``."""
        hex_digest: str = await _off_loop(len(data), lambda: hashlib.sha256(data).hexdigest())
        async def put() -> Any:
            return await (await self.client()).put_object(Bucket=self.bucket, Key=self.blob_key(hex_digest), Body=data)

        with map_exceptions(S3_ERRORS, WRITE_FAILED, "blob"):
            await self.writes.run(put)
        return ID_PREFIX + hex_digest

    async def get_blob(self, blob_id: str) -> bytes | None:
        hex_digest = check_id(blob_id)[len(ID_PREFIX):]

        async def fetch() -> bytes:
            response = await (await self.client()).get_object(Bucket=self.bucket, Key=self.blob_key(hex_digest))
            async with response["Body"] as body:
                data: bytes = await body.read()
            return data

        return await _unless_missing(self.reads.run(fetch), f"blob {short_id(blob_id)}")

    async def delete(self, attachment_id: str) -> bool:
        """Remove the object and its variant index entries (not its variants' objects); True if
        the object was there (whatever state its record was in)."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        key = self.key(hex_digest)

        async def remove() -> bool:
            client = await self.client()
            found = await _unless(MISSING, client.head_object(Bucket=self.bucket, Key=key)) is not None
            if found:
                await client.delete_object(Bucket=self.bucket, Key=key)
            # its index entries go too; its variants are objects in their own right and stay
            for entry in await self._entry_keys(client, hex_digest):
                await client.delete_object(Bucket=self.bucket, Key=entry)
            return found

        with map_exceptions(S3_ERRORS, WRITE_FAILED, f"{short_id(attachment_id)} delete"):
            return await self.writes.run(remove)

    # -- the variant index (see ``stores.variants``) -----------------------------------------------

    async def variant_of(self, attachment_id: str, target: str) -> str | None:
        """The id of the variant of ``attachment_id`` recorded for ``target``; None when none is
        (or its entry is damaged, which the next ``put_variant`` replaces)."""
        key = self.variants_key(check_id(attachment_id)[len(ID_PREFIX):]) + check_target(target)

        async def fetch() -> tuple[str | None, str]:
            return await self._entry(await self.client(), key)

        found = await _unless_missing(self.reads.run(fetch), "variant index read")
        return None if found is None else found[0]

    async def put_variant(self, attachment_id: str, target: str, variant_id: str, *,
                          replacing: str | None = None) -> str:
        """Record ``variant_id`` for (``attachment_id``, ``target``) unless an entry is there
        (``If-None-Match: *``); return the id that holds after the call. An entry that is damaged
        or still names ``replacing`` is replaced only if unchanged since read (``If-Match``)."""
        key = self.variants_key(check_id(attachment_id)[len(ID_PREFIX):]) + check_target(target)
        body = check_id(variant_id).encode()

        async def put() -> str:
            client = await self.client()
            if await self._put_entry(client, key, body, IfNoneMatch="*"):
                return variant_id
            current, etag = await self._entry(client, key)
            if current is not None and current != replacing:
                return current
            if await self._put_entry(client, key, body, IfMatch=etag):
                return variant_id
            current, _ = await self._entry(client, key)  # replaced meanwhile by another replica
            return current or variant_id

        with map_exceptions(S3_ERRORS, WRITE_FAILED, "variant index write"):
            return await self.writes.run(put)

    async def variants(self, attachment_id: str) -> dict[str, str]:
        """Every variant recorded for ``attachment_id``: target -> variant id."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        start = len(self.variants_key(hex_digest))

        async def fetch() -> dict[str, str]:
            client = await self.client()
            found: dict[str, str] = {}
            for key in await self._entry_keys(client, hex_digest):
                entry = await _unless(MISSING, self._entry(client, key))  # None: dropped since the listing
                if entry is not None and entry[0] is not None:
                    found[key[start:]] = entry[0]
            return found

        return await _unless_missing(self.reads.run(fetch), "variant index read") or {}

    async def _entry_keys(self, client: Any, hex_digest: str) -> list[str]:
        prefix = self.variants_key(hex_digest)
        listing = await client.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        keys = [str(item["Key"]) for item in listing.get("Contents") or ()]
        return sorted(key for key in keys if is_valid_target(key[len(prefix):]))

    async def _entry(self, client: Any, key: str) -> tuple[str | None, str]:
        """An index entry's variant id (None when damaged) and its ETag."""
        response = await client.get_object(Bucket=self.bucket, Key=key)
        async with response["Body"] as body:
            raw: bytes = await body.read(_ENTRY_MAX)
        entry = raw.decode("ascii", "replace")
        return (entry if is_valid_id(entry) else None), str(response.get("ETag", ""))

    async def _put_entry(self, client: Any, key: str, body: bytes, **condition: str) -> bool:
        """A conditional put of an index entry: False when its condition failed."""
        put = client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="text/plain", **condition)
        return await _unless(LOST, put) is not None

    # -- uploads under way (``http.resumable``) ----------------------------------------------------

    def upload_key(self, upload: str) -> str:
        """The key prefix of one upload's parts and marker, ``uploads/<name>/``."""
        return f"{self.prefix}uploads/{check_upload(upload)}/"

    async def _put_new(self, key: str, body: bytes) -> bool:
        """Create ``key`` unless it exists (``If-None-Match: *``): False when it did."""
        async def put() -> bool:
            put_new = (await self.client()).put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
            return await _unless(LOST, put_new) is not None

        with map_exceptions(S3_ERRORS, WRITE_FAILED, "upload part"):
            return await self.writes.run(put)

    async def put_part(self, upload: str, offset: int, data: bytes) -> bool:
        """Put one chunk of ``upload`` at ``offset`` unless a part is there (False then)."""
        if not 0 <= offset < 10**12:
            raise ValueError(f"invalid part offset {offset}")
        return await self._put_new(f"{self.upload_key(upload)}{offset:012d}", data)

    async def close_upload(self, upload: str) -> bool:
        """Put ``upload``'s closed marker unless it is there (False then: closed already)."""
        return await self._put_new(self.upload_key(upload) + _CLOSED, b"")

    async def upload_parts(self, upload: str) -> UploadParts:
        """One ``ListObjectsV2`` of ``uploads/<name>/``: its parts' offsets and sizes, and its marker."""
        prefix = self.upload_key(upload)

        async def fetch() -> UploadParts:
            listing = await (await self.client()).list_objects_v2(Bucket=self.bucket, Prefix=prefix,
                                                                  MaxKeys=PARTS_MAX * 2)
            parts, closed = [], False
            for item in listing.get("Contents") or ():
                name = str(item["Key"])[len(prefix):]
                if _OFFSET.fullmatch(name):
                    parts.append((int(name), int(item.get("Size", 0))))
                closed = closed or name == _CLOSED
            return UploadParts(tuple(sorted(parts)), closed)

        return await _unless_missing(self.stamp_lane.run(fetch), "upload parts read") or UploadParts()

    async def read_parts(self, upload: str, parts: Sequence[tuple[int, int]]) -> bytes | None:
        """The bytes of ``parts`` in order; None when one is gone or is not the size named (its
        ``Content-Length`` is checked before a byte is read)."""
        prefix = self.upload_key(upload)
        wanted = tuple(parts)

        async def fetch() -> bytes | None:
            client = await self.client()
            chunks = []
            for offset, size in wanted:
                response = await client.get_object(Bucket=self.bucket, Key=f"{prefix}{offset:012d}")
                async with response["Body"] as body:
                    if int(response.get("ContentLength", -1)) != size:
                        return None
                    data: bytes = await body.read()
                if len(data) != size:
                    return None
                chunks.append(data)
            return b"".join(chunks)

        return await _unless_missing(self.reads.run(fetch), "upload parts bytes")

    async def _delete_keys(self, client: Any, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), 1000):  # one DeleteObjects per thousand keys
            batch = [{"Key": key} for key in keys[start:start + 1000]]
            await client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    async def drop_parts(self, upload: str) -> None:
        """Remove ``upload``'s parts; its closed marker stays (until ``sweep_uploads``)."""
        prefix = self.upload_key(upload)

        async def drop() -> None:
            client = await self.client()
            listing = await client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=PARTS_MAX * 2)
            keys = [str(item["Key"]) for item in listing.get("Contents") or ()]
            await self._delete_keys(client, [k for k in keys if _OFFSET.fullmatch(k[len(prefix):])])

        with map_exceptions(S3_ERRORS, WRITE_FAILED, "upload parts drop"):
            await self.writes.run(drop)

    async def sweep_uploads(self, opened_before: int) -> int:
        """Remove the keys of uploads opened before ``opened_before``: one page of the uploads'
        area (names sort by age, so the expired come first; the walk stops at a younger one)
        and one ``DeleteObjects``; how many uploads it removed keys of."""
        area = f"{self.prefix}uploads/"

        async def sweep() -> int:
            client = await self.client()
            listing = await client.list_objects_v2(Bucket=self.bucket, Prefix=area, MaxKeys=1000)
            keys, names = [], set()
            for item in listing.get("Contents") or ():
                key = str(item["Key"])
                name = key[len(area):].split("/", 1)[0]
                opened = upload_opened(name)
                if opened is None:
                    continue
                if opened >= opened_before:
                    break
                keys.append(key)
                names.add(name)
            await self._delete_keys(client, keys)
            return len(names)

        with map_exceptions(S3_ERRORS, WRITE_FAILED, "expired uploads sweep"):
            return await self.writes.run(sweep)


def _s3_error(exc: BaseException) -> str:
    """An S3 error status by its code: no such key, a conditional put that lost, or a fault."""
    assert isinstance(exc, botocore.exceptions.ClientError)
    code = _s3_code(exc)
    return MISSING if code in _MISSING else LOST if code in _LOST_RACE else FAILED


def _s3_code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "")) or "error"


def _s3_detail(exc: BaseException) -> str:
    """A fault's name in messages: its S3 error code, else ``faults.describe``."""
    return _s3_code(exc) if isinstance(exc, botocore.exceptions.ClientError) else describe(exc)


#: botocore's, aiobotocore's and the network's exceptions (``proxy.faults``): an S3 error status by
#: its code (``_s3_error``); botocore's own (endpoint, connection, parsing, its timeouts), aiohttp's
#: (aiobotocore's transport) and the OS's (sockets; the lanes' ``TimeoutError``) are faults of the
#: store: only S3 itself says a key is missing (a local file that is not there, a CA bundle, is a
#: fault). Anything else (a bug, a misuse of the client) is not the store's and goes on as it is.
S3_ERRORS: Final = Table("botocore", {
    botocore.exceptions.ClientError: _s3_error,
    botocore.exceptions.ConnectTimeoutError: TIMEOUT,
    botocore.exceptions.ReadTimeoutError: TIMEOUT,
    botocore.exceptions.BotoCoreError: FAILED,
    aiohttp.ClientError: FAILED,
    **OS_FAULTS,
}, detail=_s3_detail)


async def _unless(fault: str, call: Awaitable[_T]) -> _T | None:
    """``call``'s result, or None when it failed with ``fault``: ``MISSING`` (the key is not
    there) or ``LOST`` (a conditional put lost its race) are answers, not errors. Every other
    error goes on to the operation's boundary."""
    try:
        return await call
    except Exception as exc:
        if S3_ERRORS.classify(exc) != fault:
            raise
        return None


async def _unless_missing(call: Awaitable[_T], what: str) -> _T | None:
    """A lookup and its boundary: ``call``'s result, or None when the key is not in the bucket;
    any other fault of the store is a retryable ``STORE_UNAVAILABLE``."""
    with map_exceptions(S3_ERRORS, UNAVAILABLE, what):
        return await _unless(MISSING, call)


def _stamp(response: dict[str, Any]) -> str:
    metadata = sorted((response.get("Metadata") or {}).items())
    return f"{response.get('ETag')}|{response.get('LastModified')}|{metadata}"


def _record(metadata: dict[str, str]) -> AttachmentMeta | None:
    """The admission record from object metadata (None when absent or malformed)."""
    try:
        return AttachmentMeta(
            "", metadata["media-type"], int(metadata["bytes"]), int(metadata["width"]), int(metadata["height"]),
            unquote(metadata["name"]) if "name" in metadata else None, int(metadata.get("created-at", "0")),
        )
    except (KeyError, ValueError):
        return None


async def _off_loop(size: int, fn: Any, *args: Any) -> Any:
    """Run CPU-bound ``fn`` inline for small inputs, on a worker thread for large ones."""
    if size <= INLINE_LIMIT:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)
