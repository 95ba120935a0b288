"""What the proxy needs of an attachment store beyond the policy's reads (proxy layer).

``Store`` extends ``policy.ports.AttachmentStore`` with admission, description, deletion, the
blob area that recording uses, the variant index (``stores.variants``) and the parts of uploads
under way (``http.resumable``); ``StampedStore`` adds the cheap stamp checks of the
verified-object cache. Backends implement them structurally; nothing here knows HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, Protocol

import msgspec

from ...policy.model import StoredImage
from ...policy.ports import AttachmentStore


class AttachmentMeta(msgspec.Struct, frozen=True):
    """What the store recorded at admission (``name`` and ``created_at`` of the first admission)."""

    id: str
    media_type: str
    bytes: int
    width: int
    height: int
    name: str | None = None
    created_at: int = 0


#: The most admission records one ``list_admitted`` call returns.
LIST_MAX: Final = 1000

#: A variant target as ``Profile.target`` names it (``anthropic@2000``, ``open@any``).
_TARGET_RE: Final = re.compile(r"[a-z0-9_-]{1,32}@[0-9a-z]{1,10}")


#: An upload's name in the store (``upload_name``): the wall-clock second its start was made,
#: zero-padded so that names sort by age, and the digest of its token.
_UPLOAD_RE: Final = re.compile(r"(?P<opened>[0-9]{12})-[0-9a-f]{64}")
#: The most parts one upload holds (a chunk past them is refused): one listing answers for all.
PARTS_MAX: Final = 256


class UploadParts(msgspec.Struct, frozen=True):
    """What the store holds of one upload under way: its parts as (offset, size), in offset
    order, and whether it was closed (finished or cancelled: it opens no second upload)."""

    parts: tuple[tuple[int, int], ...] = ()
    closed: bool = False

    @property
    def received(self) -> tuple[tuple[int, int], ...]:
        """The parts that follow one another from offset 0 (the bytes received); anything past a
        gap or beside the chain (a chunk that lost a race) is not."""
        chain: list[tuple[int, int]] = []
        end = 0
        for offset, size in self.parts:
            if offset == end and size > 0:
                chain.append((offset, size))
                end += size
        return tuple(chain)

    @property
    def size(self) -> int:
        return sum(size for _, size in self.received)


def upload_name(opened: int, token_digest: str) -> str:
    """The store's name of the upload opened at wall-clock second ``opened`` whose token has the
    SHA-256 hex digest ``token_digest``."""
    return check_upload(f"{opened:012d}-{token_digest}")


def check_upload(name: str) -> str:
    """Return an upload name unchanged, or raise ``ValueError`` (it names a directory or a key)."""
    if _UPLOAD_RE.fullmatch(name) is None:
        raise ValueError(f"invalid upload name {name[:80]!r}")
    return name


def upload_opened(name: str) -> int | None:
    """The wall-clock second an upload name says it was opened at; None for another name."""
    match = _UPLOAD_RE.fullmatch(name)
    return int(match["opened"]) if match else None


def is_valid_target(target: str) -> bool:
    return _TARGET_RE.fullmatch(target) is not None


def check_target(target: str) -> str:
    """Return the target unchanged, or raise ``ValueError``: a target names a file or a key, so
    nothing else may reach one (a bad one is a bug in a profile's name, never a client's input)."""
    if not is_valid_target(target):
        raise ValueError(f"invalid variant target {target[:80]!r}")
    return target


class Store(AttachmentStore, Protocol):
    """An attachment store the proxy can also admit into, describe and delete from.

    The variant index maps (original id, target) to the id of the variant that fits the target
    (itself an ordinary content-addressed object). ``put_variant`` is put-if-absent across
    replicas and returns the id that holds after the call, ours or the one already there; with
    ``replacing`` it also takes the place of an entry that still names that (stale) id.
    ``delete`` of an original drops its index entries and leaves its variants' objects alone.
    ``ping`` is readiness: one cheap call on the stamp lane that proves the store answers
    (``Unavailable`` when it does not).

    ``list_admitted`` pages through the admission records of present objects in id order: up to
    ``limit`` (at most ``LIST_MAX``) whose ids sort after ``after``; an object without a readable
    record is skipped (``stat`` would say None), and nothing's bytes are read.

    A tenant's grants say which objects it admitted (``stores.tenancy``): ``grant`` records one
    (put-if-absent: the name of its first admission stays), ``granted`` is ``stat`` with the
    tenant's own name and time (None when it admitted none), ``has_grant`` looks at the grant
    alone (never at the object, whose own read says what it is), ``list_granted`` is
    ``list_admitted`` over its grants. The bytes stay one object, whoever admitted them.

    An upload under way (``http.resumable``) keeps its chunks as parts under its name
    (``upload_name``), where every worker and replica finds them: ``put_part`` is put-if-absent
    (False when a part at that offset is there already: of racing chunks one wins, the other
    loses cleanly), ``upload_parts`` one listing of its parts and closed marker, ``read_parts``
    the bytes of the parts named, concatenated (None when one is gone or is not the size
    named), ``close_upload`` the marker, put-if-absent (False when it was closed already: one
    finalize or cancel wins), ``drop_parts`` removes the parts and leaves the marker, and
    ``sweep_uploads`` removes everything of uploads opened before a wall-clock second (at most
    a bounded number per call), returning how many it removed."""

    async def admit(self, data: bytes, declared_type: str | None = None, *, name: str | None = None,
                    publish: bool = False) -> StoredImage: ...
    async def stat(self, attachment_id: str) -> AttachmentMeta | None: ...
    async def list_admitted(self, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]: ...
    async def delete(self, attachment_id: str) -> bool: ...
    async def grant(self, tenant: str, attachment_id: str, name: str | None = None) -> None: ...
    async def granted(self, tenant: str, attachment_id: str) -> AttachmentMeta | None: ...
    async def has_grant(self, tenant: str, attachment_id: str) -> bool: ...
    async def list_granted(self, tenant: str, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]: ...
    async def put_blob(self, data: bytes) -> str: ...
    async def get_blob(self, blob_id: str) -> bytes | None: ...
    async def variant_of(self, attachment_id: str, target: str) -> str | None: ...
    async def put_variant(self, attachment_id: str, target: str, variant_id: str, *,
                          replacing: str | None = None) -> str: ...
    async def variants(self, attachment_id: str) -> dict[str, str]: ...
    async def put_part(self, upload: str, offset: int, data: bytes) -> bool: ...
    async def upload_parts(self, upload: str) -> UploadParts: ...
    async def read_parts(self, upload: str, parts: Sequence[tuple[int, int]]) -> bytes | None: ...
    async def close_upload(self, upload: str) -> bool: ...
    async def drop_parts(self, upload: str) -> None: ...
    async def sweep_uploads(self, opened_before: int) -> int: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...


class StampedStore(Store, Protocol):
    """A store that can say cheaply whether an object changed (see ``stores.cache``)."""

    async def stamps(self, attachment_ids: Sequence[str]) -> list[str | None]: ...
    async def read_stamped(self, attachment_id: str) -> tuple[StoredImage, str | None]: ...
