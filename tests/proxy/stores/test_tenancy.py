"""``stores.tenancy``: what a tenant sees of the shared store, and how a grant lookup fails."""

from __future__ import annotations

from typing import Any

import pytest

from projectionist.policy.errors import NOT_FOUND, READ_FAILED, AttachmentError
from projectionist.proxy.stores.cache import CachedStore, VerifiedCache
from projectionist.proxy.stores.tenancy import Visible
from tests.imaging import make_image
from tests.memory import MemoryStore


class Lookups(MemoryStore):
    """A memory store that counts grant lookups and can make them hang (``TimeoutError``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0
        self.hang = False

    async def has_grant(self, tenant: str, attachment_id: str) -> bool:
        self.lookups += 1
        if self.hang:
            raise TimeoutError
        return await super().has_grant(tenant, attachment_id)

    async def stamps(self, attachment_ids: Any) -> list[str | None]:
        return ["s" if i in self.images else None for i in attachment_ids]

    async def read_stamped(self, attachment_id: str) -> Any:
        return await self.read_image(attachment_id), "s"


def visible_over(store: Lookups, known_max: int = 4) -> Visible:
    return Visible(store, CachedStore(store, VerifiedCache(1 << 20)), known_max)  # type: ignore[arg-type]


async def test_a_tenant_reads_what_it_admitted_and_a_yes_is_kept() -> None:
    store = Lookups()
    visible = visible_over(store)
    image = await visible.admit("alice", make_image(color=1), name="a.png")
    alice, bob = visible.reader("alice"), visible.reader("bob")
    assert (await alice.read_image(image.id)).id == image.id
    assert store.lookups == 0  # admitted here: known without asking
    with pytest.raises(AttachmentError) as caught:
        await bob.read_image(image.id)
    assert caught.value.code == NOT_FOUND
    with pytest.raises(AttachmentError):
        await bob.read_image(image.id)
    assert store.lookups == 2  # a "no" is asked again: another replica may grant meanwhile
    await store.grant("bob", image.id, "b.png")  # as another replica would
    assert (await bob.read_image(image.id)).id == image.id
    await bob.read_image(image.id)
    assert store.lookups == 3  # and a "yes" is kept
    assert await visible.sees(None, image.id)  # every tenant (the admin, or no tokens)


async def test_a_grant_lookup_that_hangs_is_a_failed_read_of_that_object_never_a_not_found() -> None:
    store = Lookups()
    visible = visible_over(store)
    image = await store.admit(make_image(color=2))
    await store.grant("alice", image.id)
    store.hang = True
    with pytest.raises(AttachmentError) as caught:
        await visible.reader("alice").read_image(image.id)
    assert caught.value.code == READ_FAILED and caught.value.attachment_id == image.id


async def test_the_known_grants_stay_bounded() -> None:
    store = Lookups()
    visible = visible_over(store, known_max=4)
    ids = [(await visible.admit("t", make_image(color=10 + n))).id for n in range(10)]
    assert len(visible._known) == 4  # noqa: SLF001
    await visible.reader("t").read_image(ids[0])  # forgotten, so asked, and still granted
    assert store.lookups == 1
