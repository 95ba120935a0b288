"""The verified-object cache changes what a request costs, never what it sends.

The rule under test: a storage fault is noticed on the first request after it happens, whether
the object's bytes are cached or not (every hit checks the object's stamp); the log still decides
(a quarantined reference gets its placeholder even while its bytes are cached); a recovery reads
and verifies the object again. On both backends.
"""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable

import pytest

from projectionist.policy.errors import READ_FAILED
from projectionist.proxy.stores.cache import Encoded, VerifiedCache
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import ADMIN, BACKENDS, Harness
from tests.fakes import fail_with
from tests.imaging import make_image

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
MakeHarness = Callable[..., Awaitable[Harness]]


async def test_warm_hit_costs_a_stamp_not_a_read_and_sends_the_same_bytes(harness: Harness) -> None:
    aid = await harness.admit(make_image(color=160))
    await harness.chat("c", aid)
    cold = harness.upstream.last.body
    await harness.chat("c", aid)
    assert harness.upstream.last.body == cold
    assert harness.store.reads[aid] == 1 and harness.store.stamp_checks[aid] == 1


async def test_the_stamp_checks_of_one_request_are_one_batch(harness: Harness) -> None:
    ids = [await harness.admit(make_image(color=165 + i)) for i in range(3)]
    await harness.chat("b", *ids)
    before = harness.store.stamp_batches
    await harness.chat("b", *ids)
    assert harness.store.stamp_batches == before + 1
    assert [harness.store.stamp_checks[i] for i in ids] == [1, 1, 1]


@pytest.mark.parametrize("damage", ["delete", "overwrite"])
async def test_a_fault_behind_a_warm_entry_is_noticed_on_the_next_request(
    make_harness: MakeHarness, make_config: Callable[..., object], damage: str
) -> None:
    warm = await make_harness()
    data = make_image(color=161)
    aid = await warm.admit(data)
    await warm.chat("w", aid)  # cached now
    if damage == "delete":
        await warm.remove(aid)
    else:
        await warm.corrupt(aid, bytes(len(data)))
    await warm.chat("w", aid)
    failure = "not_found" if damage == "delete" else "corrupt"
    assert [e["data"]["failure"] for e in await warm.events("w")] == [failure]
    warm_body = warm.upstream.last.body

    cold = await make_harness(make_config())  # same store and log, empty cache
    await cold.chat("w", aid)
    assert cold.upstream.last.body == warm_body
    assert cold.store.reads[aid] == 0  # quarantined: the log decides, nothing is read


async def test_a_quarantined_reference_gets_its_placeholder_while_its_bytes_are_cached(harness: Harness) -> None:
    aid = await harness.admit(make_image(color=162))
    harness.store.script = fail_with(READ_FAILED, times=2)
    await harness.chat("flaky", aid)  # two failed reads: a retryable quarantine in session "flaky"
    await harness.chat("other", aid)  # read fine in another session: now cached
    cache = harness.app[SERVICES].reader.cache  # type: ignore[attr-defined]
    assert cache.get(aid) is not None
    reads, stamps = harness.store.reads[aid], harness.store.stamp_checks[aid]
    await harness.chat("flaky", aid)
    sent = harness.upstream.last.json()["messages"][0]["content"]
    assert sent[1] == {"type": "text", "text": f"[image unavailable: read_failed ({aid[:15]})]"}
    assert (harness.store.reads[aid], harness.store.stamp_checks[aid]) == (reads, stamps)  # not even a stamp


async def test_recovery_reads_and_verifies_again_despite_the_cache(harness: Harness) -> None:
    aid = await harness.admit(make_image(color=163))
    harness.store.script = fail_with(READ_FAILED, times=2)
    await harness.chat("heal", aid)
    await harness.chat("other", aid)  # cached via another session
    before = harness.store.reads[aid]
    resp = await harness.client.post(f"/admin/sessions/heal/attachments/{aid}/recover", headers=ADMIN)
    assert resp.status == 200 and (await resp.json())["recovered"] is True
    assert harness.store.reads[aid] == before + 1  # a full verified read, not the cached copy
    await harness.chat("heal", aid)
    assert harness.upstream.last.json()["messages"][0]["content"][1]["type"] == "image_url"


async def test_a_disabled_cache_reads_every_time(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"cache.max_bytes": 0})
    aid = await harness.admit(make_image(color=164))
    for _ in range(3):
        await harness.chat("off", aid)
    assert harness.store.reads[aid] == 3 and harness.store.stamp_checks[aid] == 0
    assert len({r.body for r in harness.upstream.received}) == 1


async def test_a_cold_reads_base64_goes_with_its_request(make_harness: MakeHarness) -> None:
    """With the cache off every request encodes its images afresh: that base64 must be freed by
    reference counting when the request ends, not left to the cyclic GC, which a server runs
    rarely (``ops.serve.tune_gc``): cold memory then follows the requests in flight (it held
    ~500 MB of dead data URLs under the bench's image load)."""
    harness = await make_harness(**{"cache.max_bytes": 0})
    aid = await harness.admit(make_image(color=166))
    await harness.chat("cold", aid)
    gc.collect()
    gc.disable()
    try:
        before = {id(o) for o in gc.get_objects() if isinstance(o, Encoded)}  # other tests' caches
        for _ in range(3):
            await harness.chat("cold", aid)
        left = [o for o in gc.get_objects() if isinstance(o, Encoded) and id(o) not in before]
    finally:
        gc.enable()
    assert harness.store.reads[aid] == 4 and left == []


def test_the_cache_is_bounded_by_bytes_lru(backend: str) -> None:
    from projectionist.policy.model import StoredImage

    images = [StoredImage(f"sha256:{i:064x}", "image/png", 300, 1, 1, bytes([i]) * 300) for i in range(5)]
    size = Encoded.of(images[0]).size
    cache = VerifiedCache(max_bytes=3 * size)
    for image in images[:3]:
        cache.put(image, "stamp")
    cache.get(images[0].id)  # most recently used
    cache.put(images[3], "stamp")
    assert [i.id for i in images if cache.get(i.id)] == [images[0].id, images[2].id, images[3].id]
    assert cache.bytes == 3 * size <= cache.max_bytes
    cache.put(images[4], None)  # no stamp: usable once, never cached
    assert cache.get(images[4].id) is None and len(cache) == 3


def test_a_second_json_form_counts_against_the_bound(backend: str) -> None:
    """A hit from a client of another format builds a second form of the entry (data URL beside
    bare base64): the byte total follows, and older entries make room for it."""
    from projectionist.policy.model import StoredImage

    images = [StoredImage(f"sha256:{i:064x}", "image/png", 300, 1, 1, bytes([i]) * 300) for i in range(3)]
    one_form = Encoded.of(images[0])
    one_form.raw("data_url")
    cache = VerifiedCache(max_bytes=3 * one_form.size)
    for image in images:
        cache.put(image, "stamp")
        entry = cache.get(image.id)
        assert entry is not None
        entry.image.encoded.raw("data_url")
    assert len(cache) == 3 and cache.bytes == 3 * one_form.size
    newest = cache.get(images[2].id)
    assert newest is not None
    newest.image.encoded.raw("base64")  # the second form: the entry nearly doubles
    assert cache.bytes == sum(e.size for e in cache._entries.values()) <= cache.max_bytes
    assert cache.get(images[0].id) is None  # the least recently used made room
    assert cache.get(images[2].id) is newest
    cache.evict(images[2].id)
    newest.image.encoded.raw("data_url")  # an evicted entry's holder no longer moves the total
    assert cache.bytes == sum(e.size for e in cache._entries.values())


# -- the staleness window ([store] stamp_ttl) -------------------------------------------------------


class Clock:
    """The reader's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def windowed(make_harness: MakeHarness, ttl: float = 10.0) -> tuple[Harness, Clock]:
    harness = await make_harness(**{"store.stamp_ttl": ttl})
    clock = Clock()
    harness.app[SERVICES].reader.clock = clock
    return harness, clock


def store_ops(harness: Harness) -> int:
    return int(harness.app[SERVICES].metrics.store_ops.total)


async def test_within_the_window_a_hit_costs_no_store_operation(make_harness: MakeHarness) -> None:
    harness, clock = await windowed(make_harness)
    aid = await harness.admit(make_image(color=170))
    await harness.chat("t", aid)  # the verified read, stamp taken at 1000
    cold = harness.upstream.last.body
    before = store_ops(harness)
    clock.now += 9.9
    await harness.chat("t", aid)
    assert harness.upstream.last.body == cold
    assert harness.store.stamp_checks[aid] == 0 and harness.store.reads[aid] == 1
    assert store_ops(harness) == before


async def test_after_the_window_a_hit_checks_the_stamp_once_and_opens_a_new_window(make_harness: MakeHarness) -> None:
    harness, clock = await windowed(make_harness)
    aid = await harness.admit(make_image(color=171))
    await harness.chat("t", aid)
    clock.now += 10.0
    before = store_ops(harness)
    await harness.chat("t", aid)
    assert harness.store.stamp_checks[aid] == 1 and harness.store.reads[aid] == 1
    assert store_ops(harness) > before  # a stat or a HEAD, counted by the store itself
    clock.now += 9.0  # within the window the check opened
    await harness.chat("t", aid)
    assert harness.store.stamp_checks[aid] == 1


@pytest.mark.parametrize("damage", ["delete", "overwrite"])
async def test_out_of_band_damage_is_quarantined_on_the_first_request_after_the_window(
        make_harness: MakeHarness, damage: str) -> None:
    harness, clock = await windowed(make_harness)
    data = make_image(color=172)
    aid = await harness.admit(data)
    await harness.chat("oob", aid)
    cold = harness.upstream.last.body
    if damage == "delete":
        await harness.remove(aid)
    else:
        await harness.corrupt(aid, bytes(len(data)))
    clock.now += 5.0
    await harness.chat("oob", aid)  # within the window: the verified bytes, nothing recorded yet
    assert harness.upstream.last.body == cold and await harness.events("oob") == []
    clock.now += 5.0
    await harness.chat("oob", aid)  # the first request after it: checked, read, quarantined
    failure = "not_found" if damage == "delete" else "corrupt"
    assert [e["data"]["failure"] for e in await harness.events("oob")] == [failure]
    assert harness.upstream.last.json()["messages"][0]["content"][1]["type"] == "text"


async def test_a_delete_through_the_proxy_is_noticed_at_once_within_the_window(make_harness: MakeHarness) -> None:
    harness, clock = await windowed(make_harness, ttl=3600.0)
    aid = await harness.admit(make_image(color=173))
    await harness.chat("del", aid)
    resp = await harness.client.delete(f"/v1/files/{aid}", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    clock.now += 1.0
    await harness.chat("del", aid)
    assert [e["data"]["failure"] for e in await harness.events("del")] == ["not_found"]
    assert harness.store.reads[aid] == 2  # the entry was gone: a full read found the object missing


async def test_a_read_in_flight_during_a_proxy_delete_is_served_but_not_cached(make_harness: MakeHarness) -> None:
    import asyncio

    harness, clock = await windowed(make_harness, ttl=3600.0)
    aid = await harness.admit(make_image(color=174))
    reader = harness.app[SERVICES].reader
    gate = asyncio.Event()
    delete = harness.store.delete

    async def slow_delete(attachment_id: str) -> bool:
        await gate.wait()
        return await delete(attachment_id)

    harness.store.delete = slow_delete  # type: ignore[method-assign]
    deleting = asyncio.ensure_future(reader.delete(aid))
    await asyncio.sleep(0.01)  # the delete has begun
    image = await reader.read_image(aid)  # the object is still there: read and verified
    assert image.id == aid and reader.cache.get(aid) is None  # served, not remembered
    gate.set()
    assert await deleting is True
    assert reader.cache.get(aid) is None


async def test_concurrent_hits_after_the_window_share_one_stamp_check(make_harness: MakeHarness) -> None:
    import asyncio

    harness, clock = await windowed(make_harness)
    aid = await harness.admit(make_image(color=175))
    await harness.chat("herd", aid)
    clock.now += 11.0
    responses = await asyncio.gather(*(harness.chat(f"herd-{i}", aid) for i in range(8)))
    assert all(r.status == 200 for r in responses)
    assert harness.store.stamp_checks[aid] == 1 and harness.store.reads[aid] == 1
