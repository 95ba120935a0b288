"""Filesystem attachment store: the embedded default ``AttachmentStore`` plus admission (proxy layer).

Content-addressed: ``objects/<hex[:2]>/<hex>`` holds the bytes, ``<hex>.json`` beside it the
admission record. Publishing is atomic and durable (temp file, fsync, rename, directory fsync);
every read verifies digest, record and header. The variant index keeps one small file per original
and target, ``variants/<hex[:2]>/<hex>/<target>``, holding the variant's id; a tenant's grants,
``grants/<tenant>/<hex>``, say what it admitted (``stores.tenancy``). The chunks of an upload under
way (``http.resumable``) are ``uploads/<name>/<offset>`` (twelve digits), published with a hard link so
that of racing chunks at one offset exactly one is written, beside ``closed`` once it finished or
was cancelled; every worker on the machine reads the same ones. All blocking work runs on a dedicated thread pool.
Every filesystem call the store makes is counted in ``ops`` (``projectionist_store_operations_total``).
Each operation maps OS faults once, at its boundary (``faults.OS_ERRORS``); ``verify`` checks what a read found.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Final, ParamSpec, TypeVar

import msgspec

from ...policy.errors import CORRUPT, NOT_FOUND, READ_FAILED, AttachmentError, Code
from ...policy.model import ID_PREFIX, StoredImage, check_id, check_tenant, is_valid_id, short_id
from .admission import ImageInfo, inspect_image
from ..config import ImageLimits, LanesConfig
from ..faults import OS_ERRORS, map_exceptions
from ..lanes import Lane
from ..observe.metrics import OpCounter
from .verify import verify
from .base import (
    LIST_MAX,
    AttachmentMeta,
    UploadParts,
    check_target,
    check_upload,
    is_valid_target,
    upload_opened,
)

#: Code of the ``Unavailable`` (503) raised when admitting or deleting hits an OS fault.
WRITE_FAILED: Final = Code.ATTACHMENT_WRITE_FAILED
#: Code of the ``Unavailable`` (503) raised when reading the variant index hits an OS fault.
UNAVAILABLE: Final = Code.STORE_UNAVAILABLE

#: An object's file name (its records end in ``.json``, temp files start with ``.``).
_HEX: Final = re.compile(r"[0-9a-f]{64}")
_SHARD: Final = re.compile(r"[0-9a-f]{2}")
#: A part of an upload under way: its offset, twelve digits (``uploads/<name>/<offset>``).
_OFFSET: Final = re.compile(r"[0-9]{12}")
#: The marker of an upload that finished or was cancelled (``uploads/<name>/closed``).
_CLOSED: Final = "closed"
#: The most expired uploads one ``sweep_uploads`` call removes.
SWEEP_MAX: Final = 256

_T = TypeVar("_T")
_P = ParamSpec("_P")
#: Told the name of each filesystem call as it is made (``OpCounter.add``).
Count = Callable[[str], object]


class _Record(msgspec.Struct, frozen=True, omit_defaults=True):
    """The admission record stored beside the bytes (``name``/``created_at``: first admission's)."""

    media_type: str
    bytes: int
    width: int
    height: int
    name: str | None = None
    created_at: int = 0


_RECORD_DECODER: Final = msgspec.json.Decoder(_Record)


class _Grant(msgspec.Struct, frozen=True):
    """``grants/<tenant>/<hex>``: a tenant admitted that object (its name, and when, at first)."""

    name: str | None
    created_at: int


_GRANT_DECODER: Final = msgspec.json.Decoder(_Grant)


def _short(hex_digest: str) -> str:
    return ID_PREFIX + hex_digest[:8]


def _read_file(path: Path) -> bytes:
    """Read a whole file (module-level so tests can substitute faults)."""
    with open(path, "rb") as f:
        return f.read()


def _present(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T | None:
    """``fn``'s result, or None when what it opens is not there: an answer, not a fault (every other
    OS error goes on to the operation's boundary)."""
    try:
        return fn(*args, **kwargs)
    except FileNotFoundError:
        return None


def _fsync_dir(directory: Path, count: Count) -> None:
    count("fsync")
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ensure_dir(directory: Path, count: Count) -> None:
    """Create ``directory`` (and parents) durably: a new entry is fsynced into its parent."""
    count("stat")
    if directory.is_dir():
        return
    _ensure_dir(directory.parent, count)
    try:
        count("mkdir")
        directory.mkdir()
    except FileExistsError:
        if not directory.is_dir():
            raise
        return
    _fsync_dir(directory.parent, count)


def _ensure_shards(objects: Path, count: Count) -> None:
    """Every shard of ``objects`` (``00`` to ``ff``), made once, when the store opens: an admission
    that had to make its shard would take longer, and tell a tenant that no one had stored bytes
    of that shard yet."""
    missing = [shard for shard in (f"{i:02x}" for i in range(256)) if not (objects / shard).is_dir()]
    for shard in missing:
        count("mkdir")
        (objects / shard).mkdir(exist_ok=True)
    if missing:
        _fsync_dir(objects, count)


def _write_atomic(directory: Path, name: str, content: bytes, count: Count) -> None:
    """Write ``directory/name`` via a temp file in the same directory, fsync, then rename over.

    The caller fsyncs the directory. The temp file never survives a failure.
    """
    count("write")  # create, write and fsync the temp file
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        count("rename")
        os.replace(tmp, directory / name)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


class FilesystemStore:
    """Content-addressed image store on a local filesystem.

    ``read_image`` implements the policy ``AttachmentStore`` Protocol; ``admit`` and ``delete`` are
    the admission and admin side. Verified reads, stamp checks and writes each run in their own
    ``Lane``: ``read_timeout`` (seconds, None for none) bounds a verified read from the moment its
    thread starts it; a read that finds its lane full raises ``Busy``, never a read failure.
    """

    def __init__(
        self,
        root: Path,
        limits: ImageLimits = ImageLimits(),
        *,
        read_timeout: float | None = 30.0,
        lanes: LanesConfig = LanesConfig(),
    ) -> None:
        self.root = Path(root)
        self.limits = limits
        self.read_timeout = read_timeout
        #: Every filesystem call this store makes, by kind (read, stat, write, rename, fsync, ...).
        self.ops = OpCounter()
        self._count = self.ops.add
        self._objects = self.root / "objects"
        _ensure_dir(self._objects, self._count)
        _ensure_shards(self._objects, self._count)
        self.reads = Lane("reads", lanes.reads, read_timeout, lanes.queue_timeout, slow_after=lanes.slow_after)
        self.stamp_lane = Lane("stamps", lanes.stamps, lanes.stamp_timeout, lanes.queue_timeout,
                               slow_after=lanes.slow_after)
        self.writes = Lane("writes", lanes.writes, lanes.write_timeout, lanes.queue_timeout)
        #: Listings (the Files APIs' lists) walk many records at a client's asking: one thread of
        #: their own, so a record that hangs costs the listing, never the stamp checks and stats.
        self.listing = Lane("listing", 1, lanes.stamp_timeout, lanes.queue_timeout)

    # -- paths -----------------------------------------------------------------------------------

    def _paths(self, hex_digest: str) -> tuple[Path, Path]:
        """Data and record paths. Only ever called with a hex digest that passed ``check_id``."""
        directory = self._objects / hex_digest[:2]
        return directory / hex_digest, directory / f"{hex_digest}.json"

    def _variant_dir(self, hex_digest: str) -> Path:
        """The index entries of one original (a hex digest that passed ``check_id``)."""
        return self.root / "variants" / hex_digest[:2] / hex_digest

    # -- async API -------------------------------------------------------------------------------

    async def admit(self, data: bytes, declared_type: str | None = None, *, name: str | None = None,
                    publish: bool = False) -> StoredImage:
        """Validate ``data`` and store it under its digest; return the stored image.

        Idempotent: an existing object that verifies is left untouched. An absent, partial or
        corrupt one is (re)published; the digest proves the new bytes are the right ones. With
        ``publish`` the bytes are written whether or not a copy is there (the first admission's
        record kept): the same work either way, so its time tells no one whether it was.
        Raises ``ImageRejected`` for refused bytes, ``Unavailable(ATTACHMENT_WRITE_FAILED)`` when the
        filesystem fails while publishing.
        """
        return await self._on_lane(partial(self._admit_sync, data, declared_type, name, publish), self.writes,
                                   WRITE_FAILED, "admission")

    async def read_image(self, attachment_id: str) -> StoredImage:
        """Return the verified image or raise ``AttachmentError`` (see ``policy.ports``)."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        return await self._read(partial(self._load, hex_digest), attachment_id, "image")

    async def read_stamped(self, attachment_id: str) -> tuple[StoredImage, str | None]:
        """``read_image`` plus the object's stamp taken before the read (see ``stamp``)."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        return await self._read(partial(self._load_stamped, hex_digest), attachment_id, "stamped")

    async def stamps(self, attachment_ids: Sequence[str]) -> list[str | None]:
        """Cheap tokens that change whenever an object or its record is replaced, rewritten or
        removed (inode, size, mtime of both files; no bytes read); None when absent. One
        worker-thread hop for the whole batch."""
        hexes = [check_id(aid)[len(ID_PREFIX):] for aid in attachment_ids]
        return await self.stamp_lane.run(lambda: [self._stamp_sync(h) for h in hexes])

    async def _read(self, fn: Callable[[], _T], attachment_id: str, kind: str) -> _T:
        """A verified read on the read lane, and its boundary: an object that is not there is
        ``ATTACHMENT_NOT_FOUND``; any other OS fault, or no answer within ``read_timeout``,
        ``ATTACHMENT_READ_FAILED``. ``_load`` raises damage as ``ATTACHMENT_CORRUPT`` itself.
        A read of ``kind`` of an object whose earlier one is stuck joins it (no second thread)."""
        with map_exceptions(OS_ERRORS, READ_FAILED, short_id(attachment_id), missing=NOT_FOUND,
                            attachment_id=attachment_id):
            return await self.reads.run(fn, key=f"{kind}:{attachment_id}")

    async def stat(self, attachment_id: str) -> AttachmentMeta | None:
        """The admission record of a present object, without reading or verifying its bytes."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        return await self.stamp_lane.run(partial(self._stat_sync, hex_digest))

    async def list_admitted(self, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]:
        """Admission records of present objects after ``after``, in id order (see ``Store``): one
        directory listing per shard it walks and one record read per object, no bytes."""
        after_hex = check_id(after)[len(ID_PREFIX):] if after is not None else ""
        return await self._on_lane(partial(self._list_sync, after_hex, max(0, min(limit, LIST_MAX))), self.listing,
                                   UNAVAILABLE, "listing")

    # -- grants: what each tenant admitted (``stores.tenancy``) ------------------------------------

    def _grant_path(self, tenant: str, hex_digest: str) -> Path:
        """``grants/<tenant>/<hex>``: only called with a checked tenant name and hex digest."""
        return self.root / "grants" / check_tenant(tenant) / hex_digest

    async def grant(self, tenant: str, attachment_id: str, name: str | None = None) -> None:
        """Record that ``tenant`` admitted ``attachment_id`` (the name it gave first stays)."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        await self._on_lane(partial(self._grant_sync, tenant, hex_digest, name), self.writes, WRITE_FAILED,
                            f"{_short(hex_digest)} grant")

    async def granted(self, tenant: str, attachment_id: str) -> AttachmentMeta | None:
        """The admission record of a present object ``tenant`` admitted, with the name and time
        of its own first admission; None when it admitted none (or the object is gone)."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        return await self.stamp_lane.run(partial(self._granted_sync, tenant, hex_digest))

    async def has_grant(self, tenant: str, attachment_id: str) -> bool:
        """Whether ``tenant`` admitted ``attachment_id``: its grant alone, nothing of the object
        (whose own read says whether it is there and intact). Its boundary is on the lane's thread:
        a lookup that does not answer in time raises the lane's ``TimeoutError`` (``stores.tenancy``
        reads that as a failed read of the object)."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        path = self._grant_path(tenant, hex_digest)

        def look() -> bool:
            self._count("stat")
            with map_exceptions(OS_ERRORS, UNAVAILABLE, f"{_short(hex_digest)} grant lookup"):
                found = _present(os.stat, path)
            return found is not None and stat.S_ISREG(found.st_mode)

        return await self.stamp_lane.run(look)

    async def list_granted(self, tenant: str, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]:
        """``list_admitted`` for what ``tenant`` admitted: one listing of its grants, in id order."""
        after_hex = check_id(after)[len(ID_PREFIX):] if after is not None else ""
        return await self._on_lane(partial(self._list_granted_sync, tenant, after_hex, max(0, min(limit, LIST_MAX))),
                                   self.listing, UNAVAILABLE, "listing")

    async def put_blob(self, data: bytes) -> str:
        """Store opaque bytes (recorded request and response bodies) content-addressed under
        ``blobs/``; idempotent; returns ``sha256:<hex>``."""
        return await self._on_lane(partial(self._put_blob_sync, data), self.writes, WRITE_FAILED, "blob")

    async def get_blob(self, blob_id: str) -> bytes | None:
        """The blob's bytes; None when it is not there (any other fault: ``STORE_UNAVAILABLE``)."""
        hex_digest = check_id(blob_id)[len(ID_PREFIX):]
        path = self.root / "blobs" / hex_digest[:2] / hex_digest
        return await self._on_lane(partial(_present, self._read_file, path), self.reads, UNAVAILABLE,
                                   f"blob {_short(hex_digest)}")

    async def delete(self, attachment_id: str) -> bool:
        """Remove the object and its record, and its variant index entries (not its variants'
        objects); True if anything of the object was removed."""
        hex_digest = check_id(attachment_id)[len(ID_PREFIX):]
        return await self._on_lane(partial(self._delete_sync, hex_digest), self.writes, WRITE_FAILED,
                                   f"{_short(hex_digest)} delete")

    # -- the variant index (see ``stores.variants``) -----------------------------------------------

    async def variant_of(self, attachment_id: str, target: str) -> str | None:
        """The id of the variant of ``attachment_id`` recorded for ``target``, None when none is
        (or its entry is damaged, which the next ``put_variant`` replaces)."""
        path = self._variant_dir(check_id(attachment_id)[len(ID_PREFIX):]) / check_target(target)
        return await self._index(partial(self._entry_at, path), "read")

    async def put_variant(self, attachment_id: str, target: str, variant_id: str, *,
                          replacing: str | None = None) -> str:
        """Record ``variant_id`` for (``attachment_id``, ``target``) unless an entry is there; return
        the id that holds after the call. A hard link of a fsynced temp file publishes the entry,
        so it appears whole or not at all and exactly one of racing writers creates it. An entry
        that is damaged, or still names ``replacing``, is replaced; that replacement is not atomic
        against another replica replacing the same stale entry at the same moment (then the last
        one stays, and each caller got a variant that fits)."""
        directory = self._variant_dir(check_id(attachment_id)[len(ID_PREFIX):])
        check_target(target)
        check_id(variant_id)
        return await self._index(partial(self._put_variant_sync, directory, target, variant_id, replacing), "write")

    async def variants(self, attachment_id: str) -> dict[str, str]:
        """Every variant recorded for ``attachment_id``: target -> variant id."""
        directory = self._variant_dir(check_id(attachment_id)[len(ID_PREFIX):])
        return await self._index(partial(self._variants_sync, directory), "read")

    async def _index(self, fn: Callable[[], _T], kind: str) -> _T:
        """Run an index operation on its lane (reads with the stamps, writes with the writes)."""
        writes = kind == "write"
        return await self._on_lane(fn, self.writes if writes else self.stamp_lane,
                                   WRITE_FAILED if writes else UNAVAILABLE, f"variant index {kind}")

    async def _on_lane(self, fn: Callable[[], _T], lane: Lane, code: str, what: str) -> _T:
        """``fn`` on ``lane``, and the operation's boundary: an OS fault or a timeout is a retryable
        ``Unavailable`` with ``code`` (``ATTACHMENT_WRITE_FAILED`` for a write, else
        ``STORE_UNAVAILABLE``)."""
        with map_exceptions(OS_ERRORS, code, what):
            return await lane.run(fn)

    # -- uploads under way (``http.resumable``) ----------------------------------------------------

    def _upload_dir(self, upload: str) -> Path:
        return self.root / "uploads" / check_upload(upload)

    async def put_part(self, upload: str, offset: int, data: bytes) -> bool:
        """Publish one chunk of ``upload`` at ``offset`` unless a part is there (False then)."""
        if not 0 <= offset < 10**12:
            raise ValueError(f"invalid part offset {offset}")
        return await self._uploads(partial(self._put_part_sync, self._upload_dir(upload), offset, data), "write")

    async def upload_parts(self, upload: str) -> UploadParts:
        """One listing of ``upload``'s directory: its parts (a stat each) and its closed marker."""
        return await self._uploads(partial(self._upload_parts_sync, self._upload_dir(upload)), "read")

    async def read_parts(self, upload: str, parts: Sequence[tuple[int, int]]) -> bytes | None:
        """The bytes of ``parts`` in order; None when one is gone or is not the size named."""
        return await self._uploads(partial(self._read_parts_sync, self._upload_dir(upload), tuple(parts)), "bytes")

    async def close_upload(self, upload: str) -> bool:
        """Create ``upload``'s closed marker (``O_EXCL``); False when it was closed already."""
        return await self._uploads(partial(self._close_upload_sync, self._upload_dir(upload)), "write")

    async def drop_parts(self, upload: str) -> None:
        """Remove ``upload``'s parts; its closed marker stays (until ``sweep_uploads``)."""
        await self._uploads(partial(self._drop_parts_sync, self._upload_dir(upload)), "write")

    async def sweep_uploads(self, opened_before: int) -> int:
        """Remove every file of up to ``SWEEP_MAX`` uploads opened before ``opened_before``
        (names sort by age: the walk stops at the first younger one); how many it removed."""
        return await self._uploads(partial(self._sweep_sync, opened_before), "write")

    async def _uploads(self, fn: Callable[[], _T], kind: str) -> _T:
        """Run an upload operation on its lane (listings with the stamps, parts' bytes with the
        reads, writes with the writes)."""
        lane = {"write": self.writes, "read": self.stamp_lane, "bytes": self.reads}[kind]
        return await self._on_lane(fn, lane, WRITE_FAILED if kind == "write" else UNAVAILABLE, f"upload parts {kind}")

    async def start(self) -> None:
        """Start-up: the read and stamp lanes' threads now, so a process's first request does not
        start them."""
        self.reads.start()
        self.stamp_lane.start()

    async def ping(self) -> None:
        """Readiness: one stat of the objects directory on the stamp lane (a hung disk holds the
        lane; a missing or unreadable directory fails it)."""
        await self._on_lane(self._ping_sync, self.stamp_lane, UNAVAILABLE, "objects directory")

    def _ping_sync(self) -> None:
        self._count("stat")
        if not stat.S_ISDIR(os.stat(self._objects).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")

    @property
    def lanes(self) -> tuple[Lane, ...]:
        return (self.reads, self.stamp_lane, self.writes, self.listing)

    async def close(self) -> None:
        """Stop the lanes' idle threads; a thread still blocked in the OS is a daemon and lets the
        process exit."""
        for lane in self.lanes:
            lane.close()

    # -- blocking work (executor threads only) ---------------------------------------------------

    def _read_file(self, path: Path) -> bytes:
        self._count("read")  # open and read the whole file
        return _read_file(path)

    def _load(self, hex_digest: str) -> StoredImage:
        """The verified read: the bytes, then the record beside them, then ``verify``. Damage is
        ``ATTACHMENT_CORRUPT`` (a missing record too); an absent object and every other OS fault
        go on as they are, to the read's boundary (``_read``)."""
        attachment_id = ID_PREFIX + hex_digest
        data_path, record_path = self._paths(hex_digest)
        data = self._read_file(data_path)
        raw_record = _present(self._read_file, record_path)

        def corrupt(why: str) -> AttachmentError:
            return AttachmentError(CORRUPT, f"{CORRUPT}: {_short(hex_digest)} {why}", attachment_id=attachment_id)

        if raw_record is None:
            raise corrupt("has no admission record")
        try:
            record = _RECORD_DECODER.decode(raw_record)
        except msgspec.DecodeError:
            raise corrupt("admission record is unparsable") from None
        return verify(attachment_id, data, record)

    def _stamp_sync(self, hex_digest: str) -> str | None:
        stats = []
        try:
            for path in self._paths(hex_digest):
                self._count("stat")
                stats.append(os.stat(path))
        except OSError:
            return None
        return "/".join(f"{s.st_ino}:{s.st_size}:{s.st_mtime_ns}" for s in stats)

    def _load_stamped(self, hex_digest: str) -> tuple[StoredImage, str | None]:
        stamp = self._stamp_sync(hex_digest)  # before the read: a change during it shows next time
        return self._load(hex_digest), stamp

    def _admit_sync(self, data: bytes, declared_type: str | None, name: str | None = None,
                    publish: bool = False) -> StoredImage:
        info: ImageInfo = inspect_image(data, declared_type, self.limits)
        hex_digest = hashlib.sha256(data).hexdigest()
        data_path, record_path = self._paths(hex_digest)
        if not publish:
            try:
                return self._load(hex_digest)
            except (AttachmentError, OSError):
                pass  # absent, partial, corrupt or unreadable: (re)publish below
        record = _Record(media_type=info.media_type, bytes=len(data), width=info.width, height=info.height,
                         name=name, created_at=int(time.time()))
        if publish:  # the first admission's name and time stay (a read of a few bytes, there or not)
            with suppress(OSError, msgspec.DecodeError):
                first = _RECORD_DECODER.decode(self._read_file(record_path))
                record = msgspec.structs.replace(record, name=first.name, created_at=first.created_at)
        directory = data_path.parent
        _ensure_dir(directory, self._count)
        # Record first, data last: the data file is the publish point, so a crash in between
        # leaves an object that reads as not found and that re-admission repairs.
        _write_atomic(directory, record_path.name, msgspec.json.encode(record), self._count)
        _write_atomic(directory, data_path.name, data, self._count)
        _fsync_dir(directory, self._count)
        return StoredImage(
            id=ID_PREFIX + hex_digest,
            media_type=info.media_type,
            bytes=len(data),
            width=info.width,
            height=info.height,
            data=data,
        )

    def _stat_sync(self, hex_digest: str) -> AttachmentMeta | None:
        """The admission record of a present object; None when the object or a readable,
        parsable record is not there (no bytes are read: whether the object is intact is for its
        own read to say)."""
        data_path, record_path = self._paths(hex_digest)
        try:
            self._count("stat")
            if not data_path.is_file():
                return None
            record = _RECORD_DECODER.decode(self._read_file(record_path))
        except (OSError, msgspec.DecodeError):
            return None
        return AttachmentMeta(ID_PREFIX + hex_digest, record.media_type, record.bytes, record.width, record.height,
                              record.name, record.created_at)

    def _list_sync(self, after_hex: str, limit: int) -> list[AttachmentMeta]:
        found: list[AttachmentMeta] = []
        if limit == 0:
            return found
        self._count("list")
        shards = sorted(n for n in os.listdir(self._objects) if _SHARD.fullmatch(n) and n >= after_hex[:2])
        for shard in shards:
            self._count("list")
            listed = _present(os.listdir, self._objects / shard)
            if listed is None:
                continue  # dropped since the listing
            names = sorted(n for n in listed if _HEX.fullmatch(n) and n.startswith(shard) and n > after_hex)
            for name in names:
                meta = self._stat_sync(name)
                if meta is not None:
                    found.append(meta)
                    if len(found) == limit:
                        return found
        return found

    def _grant_sync(self, tenant: str, hex_digest: str, name: str | None) -> None:
        path = self._grant_path(tenant, hex_digest)
        self._count("stat")
        if path.is_file():
            return
        _ensure_dir(path.parent, self._count)
        _write_atomic(path.parent, path.name, msgspec.json.encode(_Grant(name, int(time.time()))), self._count)
        _fsync_dir(path.parent, self._count)

    def _granted_sync(self, tenant: str, hex_digest: str) -> AttachmentMeta | None:
        """``_stat_sync`` with the grant's name and time; None without a readable grant too."""
        try:
            grant = _GRANT_DECODER.decode(self._read_file(self._grant_path(tenant, hex_digest)))
        except (OSError, msgspec.DecodeError):
            return None
        meta = self._stat_sync(hex_digest)
        return None if meta is None else msgspec.structs.replace(meta, name=grant.name, created_at=grant.created_at)

    def _list_granted_sync(self, tenant: str, after_hex: str, limit: int) -> list[AttachmentMeta]:
        found: list[AttachmentMeta] = []
        directory = self._grant_path(tenant, "0" * 64).parent
        names = sorted(n for n in self._names(directory) if _HEX.fullmatch(n) and n > after_hex)
        for name in names:
            if len(found) == limit:
                break
            meta = self._granted_sync(tenant, name)
            found += [meta] if meta is not None else []
        return found

    def _names(self, directory: Path) -> list[str]:
        """The names in ``directory`` (one counted listing); none when it does not exist."""
        self._count("list")
        return _present(os.listdir, directory) or []

    def _put_blob_sync(self, data: bytes) -> str:
        hex_digest = hashlib.sha256(data).hexdigest()
        directory = self.root / "blobs" / hex_digest[:2]
        self._count("stat")
        if not (directory / hex_digest).exists():
            _ensure_dir(directory, self._count)
            _write_atomic(directory, hex_digest, data, self._count)
            _fsync_dir(directory, self._count)
        return ID_PREFIX + hex_digest

    def _entry_at(self, path: Path) -> str | None:
        """The variant id an index entry holds; None when there is none or it is damaged."""
        raw = _present(self._read_file, path)
        if raw is None:
            return None
        entry = raw.decode("ascii", "replace")
        return entry if is_valid_id(entry) else None

    def _put_variant_sync(self, directory: Path, target: str, variant_id: str, replacing: str | None) -> str:
        _ensure_dir(directory, self._count)
        path = directory / target
        self._count("write")  # create, write and fsync the temp file
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(variant_id.encode())
                f.flush()
                os.fsync(f.fileno())
            try:
                self._count("link")
                os.link(tmp, path)  # fails if the entry exists: put-if-absent across processes
            except FileExistsError:
                current = self._entry_at(path)
                if current is not None and current != replacing:
                    return current
                self._count("rename")
                os.replace(tmp, path)  # a damaged or stale entry: ours takes its place
        finally:
            with suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(directory, self._count)
        return variant_id

    def _variants_sync(self, directory: Path) -> dict[str, str]:
        found = {name: self._entry_at(directory / name) for name in sorted(self._names(directory))
                 if is_valid_target(name)}
        return {name: entry for name, entry in found.items() if entry is not None}

    def _put_part_sync(self, directory: Path, offset: int, data: bytes) -> bool:
        _ensure_dir(directory, self._count)
        name = f"{offset:012d}"
        self._count("write")  # create, write and fsync the temp file
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                self._count("link")
                os.link(tmp, directory / name)  # fails if the part exists: one of racing chunks wins
            except FileExistsError:
                return False
        finally:
            with suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(directory, self._count)
        return True

    def _upload_parts_sync(self, directory: Path) -> UploadParts:
        names = self._names(directory)
        parts = []
        for name in names:
            if _OFFSET.fullmatch(name):
                self._count("stat")
                found = _present(os.stat, directory / name)
                if found is not None:  # else dropped since the listing
                    parts.append((int(name), found.st_size))
        return UploadParts(tuple(sorted(parts)), _CLOSED in names)

    def _read_parts_sync(self, directory: Path, parts: tuple[tuple[int, int], ...]) -> bytes | None:
        chunks = []
        for offset, size in parts:
            data = _present(self._read_file, directory / f"{offset:012d}")
            if data is None or len(data) != size:
                return None
            chunks.append(data)
        return b"".join(chunks)

    def _close_upload_sync(self, directory: Path) -> bool:
        _ensure_dir(directory, self._count)
        try:
            self._count("write")
            fd = os.open(directory / _CLOSED, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(directory, self._count)
        return True

    def _drop_parts_sync(self, directory: Path) -> None:
        names = [n for n in self._names(directory) if _OFFSET.fullmatch(n)]
        for name in names:
            with suppress(FileNotFoundError):
                self._count("unlink")
                os.unlink(directory / name)
        if names:
            _fsync_dir(directory, self._count)

    def _sweep_sync(self, opened_before: int) -> int:
        area = self.root / "uploads"
        names = sorted(self._names(area))
        removed = 0
        for name in names:
            opened = upload_opened(name)
            if opened is None:
                continue
            if opened >= opened_before or removed == SWEEP_MAX:
                break
            directory = area / name
            self._count("list")
            entries = _present(os.listdir, directory)
            if entries is None:
                continue  # another worker swept it meanwhile
            for entry in entries:
                with suppress(FileNotFoundError):
                    self._count("unlink")
                    os.unlink(directory / entry)
            with suppress(OSError):  # not empty: a chunk came meanwhile; next sweep
                self._count("rmdir")
                directory.rmdir()
            removed += 1
        if removed:
            _fsync_dir(area, self._count)
        return removed

    def _drop_variants(self, hex_digest: str) -> None:
        """Remove an original's index entries (its variants are objects in their own right: they
        stay, and may be another original's variant or an upload of their own)."""
        directory = self._variant_dir(hex_digest)
        self._count("list")
        names = _present(os.listdir, directory)
        if names is None:
            return
        for name in names:
            with suppress(FileNotFoundError):
                self._count("unlink")
                os.unlink(directory / name)
        with suppress(OSError):  # not empty: a variant was recorded meanwhile; it stays
            directory.rmdir()
        _fsync_dir(directory.parent, self._count)

    def _delete_sync(self, hex_digest: str) -> bool:
        data_path, record_path = self._paths(hex_digest)
        removed = False
        # Data first: once it is gone the object reads as not found, whatever happens next.
        for path in (data_path, record_path):
            self._count("unlink")
            with suppress(FileNotFoundError):
                path.unlink()
                removed = True
        if removed:
            _fsync_dir(data_path.parent, self._count)
        self._drop_variants(hex_digest)
        return removed
