"""The parts of uploads under way, on every store backend (the filesystem on a temp dir, S3 on the
session's SeaweedFS bucket): two stores on the same storage (two workers, two replicas) see the
same parts; a part and the closed marker are put-if-absent, so of racing writers exactly one wins;
``read_parts`` gives back exactly the bytes put or None; ``drop_parts`` keeps the marker; a sweep
removes what expired uploads left and nothing younger."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator

import pytest

from projectionist.proxy.stores.base import UploadParts, upload_name, upload_opened
from tests.proxy.stores.test_store_contract import KINDS, StoreBackend


@pytest.fixture(name="stores", params=list(KINDS))
async def two_stores_on_one_storage(request: pytest.FixtureRequest,
                                    monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[StoreBackend]:
    backend = KINDS[request.param].for_test(request, monkeypatch)
    try:
        yield backend
    finally:
        await backend.close()


def name(token: str, opened: int | None = None) -> str:
    return upload_name(int(time.time()) if opened is None else opened, hashlib.sha256(token.encode()).hexdigest())


async def test_parts_are_put_once_per_offset_and_every_store_on_the_storage_sees_them(stores: StoreBackend) -> None:
    here, there = stores.store, stores.make()
    upload = name("one")
    assert await here.upload_parts(upload) == UploadParts()  # nothing yet: no parts, not closed
    assert await here.put_part(upload, 0, b"a" * 100)
    assert not await there.put_part(upload, 0, b"b" * 50)  # the offset is taken: the second loses
    assert await there.upload_parts(upload) == UploadParts(((0, 100),))
    assert await there.put_part(upload, 100, b"c" * 30)
    parts = await here.upload_parts(upload)
    assert parts == UploadParts(((0, 100), (100, 30))) and parts.size == 130
    assert await here.read_parts(upload, parts.received) == b"a" * 100 + b"c" * 30
    assert await there.read_parts(upload, [(100, 30)]) == b"c" * 30
    assert await there.read_parts(upload, [(0, 99)]) is None  # not the size named
    assert await there.read_parts(upload, [(0, 100), (130, 5)]) is None  # a part that is not there
    assert await here.upload_parts(name("another")) == UploadParts()


async def test_of_chunks_racing_for_one_offset_on_many_stores_exactly_one_is_written(stores: StoreBackend) -> None:
    racers = [stores.store, *(stores.make() for _ in range(3))]
    upload = name("race")
    won = await asyncio.gather(*(s.put_part(upload, 0, bytes([n]) * (10 + n)) for n, s in enumerate(racers * 2)))
    assert won.count(True) == 1
    [(offset, size)] = (await stores.store.upload_parts(upload)).parts
    winner = won.index(True)  # the bytes that stay are the winner's, whoever reads them
    assert (offset, size) == (0, 10 + winner)
    assert await racers[-1].read_parts(upload, [(0, size)]) == bytes([winner]) * size


async def test_an_upload_is_closed_once_and_dropping_its_parts_keeps_the_marker(stores: StoreBackend) -> None:
    here, there = stores.store, stores.make()
    upload = name("closing")
    await here.put_part(upload, 0, b"x" * 10)
    await here.put_part(upload, 10, b"y" * 10)
    closes = await asyncio.gather(here.close_upload(upload), there.close_upload(upload), there.close_upload(upload))
    assert sorted(closes) == [False, False, True]
    assert await there.upload_parts(upload) == UploadParts(((0, 10), (10, 10)), closed=True)
    await there.drop_parts(upload)
    assert await here.upload_parts(upload) == UploadParts(closed=True)
    assert not await here.close_upload(upload)  # a finished token opens nothing again
    await here.drop_parts(upload)  # nothing left to drop: no fault
    await here.drop_parts(name("never-opened"))


async def test_a_sweep_removes_what_expired_uploads_left_and_nothing_younger(stores: StoreBackend) -> None:
    here, there = stores.store, stores.make()
    now = int(time.time())
    old, older, young = name("old", now - 700), name("older", now - 5000), name("young", now - 10)
    for upload in (old, older, young):
        await here.put_part(upload, 0, b"p" * 8)
        await here.put_part(upload, 8, b"q" * 8)
    await here.close_upload(old)
    await here.close_upload(young)
    assert upload_opened(old) == now - 700
    assert await there.sweep_uploads(now - 660) == 2
    assert await here.upload_parts(old) == UploadParts() and await here.upload_parts(older) == UploadParts()
    assert await here.upload_parts(young) == UploadParts(((0, 8), (8, 8)), closed=True)
    assert await here.sweep_uploads(now - 660) == 0
    if stores.store.__class__.__name__ == "FilesystemStore":  # the directories go too
        assert [p.name for p in (stores.store.root / "uploads").iterdir()] == [young]  # type: ignore[union-attr]


async def test_an_upload_name_is_checked_before_it_names_a_path_or_a_key(stores: StoreBackend) -> None:
    for bad in ("../../objects", "", "1-" + "a" * 64, f"{0:012d}-" + "A" * 64, name("x") + "/.."):
        with pytest.raises(ValueError):
            await stores.store.put_part(bad, 0, b"x")
        with pytest.raises(ValueError):
            await stores.store.upload_parts(bad)
    with pytest.raises(ValueError):
        await stores.store.put_part(name("x"), -1, b"x")
