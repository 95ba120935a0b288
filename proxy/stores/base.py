"""What the proxy needs of an attachment store beyond the policy's reads (proxy layer).

``Store`` extends ``policy.ports.AttachmentStore`` with admission, description, deletion, the
blob area that recording uses and the variant index (``stores.variants``); ``StampedStore`` adds
the cheap stamp checks of the verified-object cache. Backends implement them structurally;
nothing here knows HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, Protocol

import msgspec

from projectionist.policy.model import StoredImage
from projectionist.policy.ports import AttachmentStore


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
    tenant's own name and time (None when it admitted none), ``list_granted`` is
    ``list_admitted`` over its grants. The bytes stay one object, whoever admitted them."""

    async def admit(self, data: bytes, declared_type: str | None = None, *, name: str | None = None) -> StoredImage: ...
    async def stat(self, attachment_id: str) -> AttachmentMeta | None: ...
    async def list_admitted(self, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]: ...
    async def delete(self, attachment_id: str) -> bool: ...
    async def grant(self, tenant: str, attachment_id: str, name: str | None = None) -> None: ...
    async def granted(self, tenant: str, attachment_id: str) -> AttachmentMeta | None: ...
    async def list_granted(self, tenant: str, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]: ...
    async def put_blob(self, data: bytes) -> str: ...
    async def get_blob(self, blob_id: str) -> bytes | None: ...
    async def variant_of(self, attachment_id: str, target: str) -> str | None: ...
    async def put_variant(self, attachment_id: str, target: str, variant_id: str, *,
                          replacing: str | None = None) -> str: ...
    async def variants(self, attachment_id: str) -> dict[str, str]: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...


class StampedStore(Store, Protocol):
    """A store that can say cheaply whether an object changed (see ``stores.cache``)."""

    async def stamps(self, attachment_ids: Sequence[str]) -> list[str | None]: ...
    async def read_stamped(self, attachment_id: str) -> tuple[StoredImage, str | None]: ...
