"""What the proxy needs of an attachment store beyond the policy's reads (proxy layer).

``Store`` extends ``policy.ports.AttachmentStore`` with admission, description, deletion and the
blob area that recording uses; ``StampedStore`` adds the cheap stamp checks of the verified-object
cache. Backends implement them structurally; nothing here knows HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

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


class Store(AttachmentStore, Protocol):
    """An attachment store the proxy can also admit into, describe and delete from."""

    async def admit(self, data: bytes, declared_type: str | None = None, *, name: str | None = None) -> StoredImage: ...
    async def stat(self, attachment_id: str) -> AttachmentMeta | None: ...
    async def delete(self, attachment_id: str) -> bool: ...
    async def put_blob(self, data: bytes) -> str: ...
    async def get_blob(self, blob_id: str) -> bytes | None: ...
    async def close(self) -> None: ...


class StampedStore(Store, Protocol):
    """A store that can say cheaply whether an object changed (see ``stores.cache``)."""

    async def stamps(self, attachment_ids: Sequence[str]) -> list[str | None]: ...
    async def read_stamped(self, attachment_id: str) -> tuple[StoredImage, str | None]: ...
