"""Which attachments a tenant sees: its grants, over bytes every tenant shares (proxy layer).

The store keeps one copy of an image's bytes, whoever admitted them. What a tenant may list,
read and reference is what it admitted itself: every admission made for a tenant records a grant
(``Store.grant``). ``None`` is every tenant: no client tokens are configured, or the admin token
came. An object a tenant was never granted is, to that tenant, an object that is not there: a
reference to it reads as ``ATTACHMENT_NOT_FOUND``, a download or a file lookup is a 404, and a
listing leaves it out; nothing tells one tenant what another holds.

Grants are never taken back but by deleting the object (admin only). A tenant's positive answers
are kept in memory (a bounded LRU); a "no" is asked again each time, since another replica may
have granted meanwhile.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from ...policy.errors import NOT_FOUND, READ_FAILED, AttachmentError
from ...policy.model import StoredImage, check_id, short_id
from .base import AttachmentMeta, Store
from .cache import CachedStore

#: How many (tenant, attachment) grants a process keeps as known.
KNOWN_MAX: Final = 65_536


class Visible:
    """The tenant-scoped face of the store: ``admit`` for a tenant, and what it may ``stat``,
    ``list`` and read (``reader``, the projection's store)."""

    def __init__(self, store: Store, reader: CachedStore, known_max: int = KNOWN_MAX) -> None:
        self.store = store
        self.cached = reader
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._known_max = known_max

    def _learn(self, tenant: str, attachment_id: str) -> None:
        key = (tenant, attachment_id)
        self._known[key] = None
        self._known.move_to_end(key)
        while len(self._known) > self._known_max:
            self._known.popitem(last=False)

    async def admit(self, tenant: str | None, data: bytes, declared_type: str | None = None, *,
                    name: str | None = None) -> StoredImage:
        """Admit ``data`` (``Store.admit``) and grant it to ``tenant``. For a tenant the bytes are
        published whether or not they are there (``publish``): an admission that found them stored
        would be quicker, and tell the tenant that another one holds them."""
        image = await self.store.admit(data, declared_type, name=name, publish=tenant is not None)
        if tenant is not None:
            await self.store.grant(tenant, image.id, name)
            self._learn(tenant, image.id)
        return image

    async def stat(self, tenant: str | None, attachment_id: str) -> AttachmentMeta | None:
        """``Store.stat`` as ``tenant`` sees it: None for an object it never admitted. A lookup
        that hangs past the stamp lane's timeout raises ``TimeoutError``, as ``Store.stat`` does."""
        if tenant is None:
            return await self.store.stat(attachment_id)
        meta = await self.store.granted(tenant, attachment_id)
        if meta is not None:
            self._learn(tenant, attachment_id)
        return meta

    async def list(self, tenant: str | None, after: str | None, limit: int) -> list[AttachmentMeta]:
        if tenant is None:
            return await self.store.list_admitted(after, limit)
        return await self.store.list_granted(tenant, after, limit)

    async def sees(self, tenant: str | None, attachment_id: str) -> bool:
        """Whether ``tenant`` admitted ``attachment_id`` (always, for every tenant), by its grant
        alone: whether the object is there and intact is for its own read to say (a hung or
        vanished object is never a "no" here). A store that fails to answer raises what it raises
        (busy, unavailable, a ``TimeoutError``): never a "no"."""
        if tenant is None or (tenant, check_id(attachment_id)) in self._known:
            return True
        if await self.store.has_grant(tenant, attachment_id):
            self._learn(tenant, attachment_id)
            return True
        return False

    def reader(self, tenant: str) -> TenantReader:
        return TenantReader(self, tenant)


class TenantReader:
    """The projection's ``AttachmentStore`` for one tenant: the verified-object cache, behind the
    tenant's grants. An object it was never granted reads as not found."""

    __slots__ = ("visible", "tenant")

    def __init__(self, visible: Visible, tenant: str) -> None:
        self.visible = visible
        self.tenant = tenant

    async def read_image(self, attachment_id: str) -> StoredImage:
        try:
            seen = await self.visible.sees(self.tenant, attachment_id)
        except TimeoutError:  # the lookup of this object's grant hung: a read of it that failed
            raise AttachmentError(READ_FAILED, f"{READ_FAILED}: {short_id(attachment_id)} grant lookup timed out",
                                  attachment_id=attachment_id) from None
        if not seen:
            raise AttachmentError(NOT_FOUND, f"{NOT_FOUND}: {short_id(attachment_id)} not found",
                                  attachment_id=attachment_id)
        return await self.visible.cached.read_image(attachment_id)
