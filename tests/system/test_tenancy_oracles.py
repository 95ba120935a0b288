"""Nothing tells one tenant what another holds (issue 37, item 3): the red team read it off an
upload's answer (``variants`` made for another tenant's calls) and off its time (2.9 ms when any
tenant had stored the bytes, 6.7 ms when none had). A tenant's upload now does the same store
work whether or not the bytes are there, and lists no variants. On both backend pairs."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.backends import BACKENDS
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image
from tests.system.test_variants import many_image_body

MakeHarness = Callable[..., Awaitable[Harness]]
on_both = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}


@pytest.fixture
async def tenants(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("PROJECTIONIST_TENANT_TOKENS", "alice:tok-alice bob:tok-bob")
    return await make_harness(**{"record.mode": "metadata"})


async def upload(harness: Harness, headers: dict[str, str], data: bytes) -> dict[str, Any]:
    resp = await harness.client.post("/v1/attachments", data=data, headers={**headers, "Content-Type": "image/png"})
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


def ops(harness: Harness) -> Counter[str]:
    return Counter(harness.store.ops.snapshot())


async def work_of(harness: Harness, headers: dict[str, str], data: bytes) -> tuple[Counter[str], float]:
    """The store operations one upload sent, and its time."""
    before = ops(harness)
    started = time.perf_counter()
    await upload(harness, headers, data)
    took = time.perf_counter() - started
    after = ops(harness)
    after.subtract(before)
    return +after, took


@on_both
async def test_an_upload_lists_no_variant_another_tenants_calls_made(tenants: Harness) -> None:
    original = make_image(2100, 60, color=3)
    wide = (await upload(tenants, BOB, original))["id"]
    small = (await upload(tenants, BOB, make_image(color=4)))["id"]
    resp = await tenants.client.post("/v1/messages", json=many_image_body(wide, small),
                                     headers={**BOB, "X-Session-Id": "bobs"})
    assert resp.status == 200, await resp.text()
    made = (await (await tenants.client.get(f"/admin/attachments/{wide}", headers=ADMIN)).json())["variants"]
    assert set(made) == {"anthropic@2000"}  # bob's call made one (the admin sees it)
    assert (await upload(tenants, ALICE, original))["variants"] == {}  # alice learns nothing of it
    assert (await upload(tenants, BOB, original))["variants"] == {}  # the same answer for everyone


@on_both
async def test_an_upload_costs_the_same_work_whether_or_not_another_tenant_stored_the_bytes(
        tenants: Harness) -> None:
    await upload(tenants, ALICE, make_image(color=99))  # her first grant makes her grants' folder
    fresh_work, held_work = [], []
    fresh_times, held_times = [], []
    for n in range(12):
        fresh = make_image(40, 40, color=100 + n)  # nobody holds these
        held = make_image(40, 40, color=200 + n)
        await upload(tenants, BOB, held)  # bob holds these
        work, took = await work_of(tenants, ALICE, fresh)
        fresh_work.append(work)
        fresh_times.append(took)
        work, took = await work_of(tenants, ALICE, held)
        held_work.append(work)
        held_times.append(took)
    assert fresh_work[0]  # the store was asked something
    assert all(w == fresh_work[0] for w in fresh_work + held_work), (fresh_work[0], held_work[0])
    print(f"\nupload, median of 12: bytes nobody held {statistics.median(fresh_times) * 1000:.2f} ms, "
          f"bytes another tenant held {statistics.median(held_times) * 1000:.2f} ms")
    # and the object another tenant stored is still whole and named as it was first
    listed = await (await tenants.client.get("/v1/files", headers={**BOB, "x-fake-status": "404"})).json()
    assert len(listed["data"]) == 12


async def test_without_tenants_a_stored_copy_is_left_alone(make_harness: MakeHarness) -> None:
    """With no tenants there is no one to hide from: the same bytes again are a verified read, no write."""
    harness = await make_harness()
    data = make_image(40, 40, color=7)
    first, _ = await work_of(harness, {}, data)
    again, _ = await work_of(harness, {}, data)
    assert first != again and sum(again.values()) < sum(first.values())
