"""Gemini resumable uploads across processes: two apps (two workers on one machine, or two replicas
on one bucket) over one attachment store and one upload key, on both backends. The start and each
chunk land on different apps; ``query`` on either answers what both received; chunks at a wrong
offset, or racing for one offset, are refused cleanly; the admitted image is exactly the bytes
sent; a finished or cancelled token opens nothing anywhere; the parts are dropped, and what
expired uploads left is swept."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from PIL import Image
from yarl import URL

from projectionist.policy.errors import InvalidRequest
from projectionist.proxy.inbound.resumable import KEY_ENV, Uploads
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.stores.base import PARTS_MAX, UploadParts, upload_name
from tests.backends import backend_on_both  # noqa: F401  (every test here on both backends)
from tests.conftest import Harness
from tests.fakes import FakeUpstream
from tests.imaging import ref_id
from tests.memory import MemoryStore

MakeHarness = Callable[..., Awaitable[Harness]]
START = {"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
         "X-Goog-Upload-Header-Content-Type": "image/png"}


def noise_png(width: int, height: int, seed: int) -> bytes:
    """A PNG that does not compress: its size is about ``3 * width * height`` bytes."""
    buf = io.BytesIO()
    Image.frombytes("RGB", (width, height), random.Random(seed).randbytes(width * height * 3)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
async def pair(make_harness: MakeHarness, upstream: FakeUpstream,
               monkeypatch: pytest.MonkeyPatch) -> tuple[Harness, Harness]:
    """Two processes of one deployment: one store, one upload key."""
    monkeypatch.setenv(KEY_ENV, "one-deployment's-upload-key")
    overrides = {"upstreams.gemini": {"format": "gemini", "url": upstream.url}}
    return await make_harness(**overrides), await make_harness(**overrides)


async def start(harness: Harness, size: int, key: str = "g-key", name: str = "big.png") -> str:
    """Open an upload on ``harness``; the path of its upload URL."""
    started = await harness.client.post("/upload/v1beta/files", json={"file": {"displayName": name}},
                                        headers={**START, "X-Goog-Upload-Header-Content-Length": str(size),
                                                 "x-goog-api-key": key})
    assert started.status == 200, await started.text()
    return URL(started.headers["X-Goog-Upload-URL"]).path


async def send(harness: Harness, path: str, command: str, data: bytes = b"", offset: int | None = None) -> Any:
    extra = {"X-Goog-Upload-Offset": str(offset)} if offset is not None else {}
    return await harness.client.post(path, data=data, headers={"X-Goog-Upload-Command": command, **extra})


async def reason(resp: Any) -> str:
    return str((await resp.json())["error"]["details"][0]["reason"])


def stored_name(path: str) -> str:
    """The store's name of the upload at ``path``: the second its token says it was opened, and
    the token's digest."""
    token = path.rsplit("/", 1)[1]
    payload = token.rpartition(".")[0]
    opened = msgspec.json.decode(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))[4]
    return upload_name(opened, hashlib.sha256(token.encode()).hexdigest())


async def test_a_chunked_upload_started_on_one_process_is_received_and_finished_by_another(
        pair: tuple[Harness, Harness]) -> None:
    a, b = pair
    png = noise_png(80, 60, seed=1)
    third = len(png) // 3
    path = await start(a, len(png))

    first = await send(b, path, "upload", png[:third], 0)  # the first chunk on the other process
    assert first.status == 200, await first.text()
    assert first.headers["X-Goog-Upload-Status"] == "active"
    assert first.headers["X-Goog-Upload-Size-Received"] == str(third)
    query = await send(a, path, "query")  # asked where it started: it knows what the other received
    assert query.status == 200 and query.headers["X-Goog-Upload-Size-Received"] == str(third)

    second = await send(a, path, "upload", png[third:2 * third], third)
    assert second.headers["X-Goog-Upload-Size-Received"] == str(2 * third)
    query = await send(b, path, "query")
    assert query.headers["X-Goog-Upload-Size-Received"] == str(2 * third)

    stale = await send(b, path, "upload", png[third:2 * third], third)  # a chunk sent twice: a wrong offset
    assert stale.status == 400 and await reason(stale) == "INVALID_UPLOAD"
    assert stale.headers["X-Goog-Upload-Status"] == "final"
    assert (await send(a, path, "query")).headers["X-Goog-Upload-Size-Received"] == str(2 * third)

    done = await send(b, path, "upload, finalize", png[2 * third:], 2 * third)
    assert done.status == 200, await done.text()
    assert done.headers["X-Goog-Upload-Status"] == "final"
    assert (await done.json())["file"]["uri"] == f"attachment:{ref_id(png)}?name=big.png"
    downloaded = await a.client.get(f"/v1/attachments/{ref_id(png)}")
    assert downloaded.status == 200 and await downloaded.read() == png  # every byte, in order

    for harness in (a, b):  # used once, wherever it is used again
        again = await send(harness, path, "upload, finalize", png, 0)
        assert again.status == 404 and await reason(again) == "UPLOAD_NOT_FOUND"
        assert again.headers["X-Goog-Upload-Status"] == "final"
        assert (await send(harness, path, "query")).status == 404
        assert (await send(harness, path, "cancel")).status == 404
    assert await a.store.upload_parts(stored_name(path)) == UploadParts(closed=True)  # the parts are gone
    assert len(a.app[SERVICES].uploads) == len(b.app[SERVICES].uploads) == 0


async def test_of_two_chunks_racing_for_one_offset_on_two_processes_one_is_received(
        pair: tuple[Harness, Harness], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    png = noise_png(40, 30, seed=2)
    half = len(png) // 2
    path = await start(a, len(png))
    both_listed = asyncio.Barrier(2)  # each process has read what was received (nothing) before either writes

    def listing_then_wait(harness: Harness) -> None:
        listing = harness.store.upload_parts

        async def upload_parts(upload: str) -> UploadParts:
            parts = await listing(upload)
            await asyncio.wait_for(both_listed.wait(), 5)
            return parts

        monkeypatch.setattr(harness.store, "upload_parts", upload_parts)

    for harness in (a, b):
        listing_then_wait(harness)
    racing = await asyncio.gather(send(a, path, "upload", png[:half], 0), send(b, path, "upload", png[:half], 0))
    assert sorted(r.status for r in racing) == [200, 400]
    [lost] = [r for r in racing if r.status == 400]
    body = await lost.json()
    assert body["error"]["details"][0]["reason"] == "INVALID_UPLOAD" and "meanwhile" in body["error"]["message"]
    monkeypatch.undo()
    assert (await send(b, path, "query")).headers["X-Goog-Upload-Size-Received"] == str(half)
    done = await send(a, path, "upload, finalize", png[half:], half)
    assert done.status == 200 and (await done.json())["file"]["name"] == f"files/sha256-{ref_id(png)[7:]}"
    assert (await b.store.read_image(ref_id(png))).data == png


async def test_of_two_finalizes_racing_on_two_processes_one_admits(
        pair: tuple[Harness, Harness], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    png = noise_png(30, 20, seed=3)
    path = await start(b, len(png))
    both_listed = asyncio.Barrier(2)
    for harness in (a, b):
        listing = harness.store.upload_parts

        async def upload_parts(upload: str, listing: Any = listing) -> UploadParts:
            parts = await listing(upload)
            await asyncio.wait_for(both_listed.wait(), 5)
            return parts

        monkeypatch.setattr(harness.store, "upload_parts", upload_parts)
    racing = await asyncio.gather(*(send(h, path, "upload, finalize", png, 0) for h in (a, b)))
    assert sorted(r.status for r in racing) == [200, 404]
    assert [await reason(r) for r in racing if r.status == 404] == ["UPLOAD_NOT_FOUND"]


async def test_an_upload_cancelled_on_one_process_takes_no_chunk_on_another(pair: tuple[Harness, Harness]) -> None:
    a, b = pair
    png = noise_png(30, 30, seed=4)
    path = await start(a, len(png))
    assert (await send(b, path, "upload", png[:100], 0)).status == 200
    cancelled = await send(a, path, "cancel")
    assert cancelled.status == 200 and cancelled.headers["X-Goog-Upload-Status"] == "cancelled"
    late = await send(b, path, "upload", png[100:200], 100)
    assert late.status == 404 and await reason(late) == "UPLOAD_NOT_FOUND"
    assert (await send(b, path, "upload, finalize", png, 0)).status == 404
    assert await b.store.upload_parts(stored_name(path)) == UploadParts(closed=True)
    assert await a.store.stat(ref_id(png)) is None


async def test_a_client_s_slots_come_back_when_another_process_finishes_its_uploads(
        pair: tuple[Harness, Harness]) -> None:
    a, b = pair
    images = [noise_png(8, 8, seed=10 + n) for n in range(9)]
    paths = [await start(a, len(png), key="one-client") for png in images[:8]]  # a quarter of 32 slots
    refused = await a.client.post("/upload/v1beta/files", json={}, headers={
        **START, "X-Goog-Upload-Header-Content-Length": "10", "x-goog-api-key": "one-client"})
    assert refused.status == 503 and await reason(refused) == "UPLOADS_BUSY"  # the bound holds
    assert (await send(b, paths[0], "upload, finalize", images[0], 0)).status == 200  # finished elsewhere
    ninth = await start(a, len(images[8]), key="one-client")  # its slot on the first process is free again
    assert (await send(b, ninth, "upload, finalize", images[8], 0)).status == 200
    assert len(a.app[SERVICES].uploads) == 8


async def test_what_expired_uploads_left_is_swept_when_an_upload_starts(pair: tuple[Harness, Harness]) -> None:
    a, b = pair
    now = int(time.time())
    stale = upload_name(now - 5000, hashlib.sha256(b"abandoned").hexdigest())
    young = upload_name(now - 30, hashlib.sha256(b"under way").hexdigest())
    for upload in (stale, young):
        assert await b.store.put_part(upload, 0, b"x" * 64)
    await start(a, 100)  # a process's first start sweeps, off the request
    deadline = time.monotonic() + 10
    while await a.store.upload_parts(stale) != UploadParts():
        assert time.monotonic() < deadline, "the abandoned upload's parts were never swept"
        await asyncio.sleep(0.05)
    assert await a.store.upload_parts(young) == UploadParts(((0, 64),))


async def test_an_upload_takes_at_most_parts_max_chunks() -> None:
    uploads, store = Uploads(), MemoryStore()
    token = uploads.open("image/png", PARTS_MAX + 10, None)
    for n in range(PARTS_MAX):
        upload, parts = await uploads.held(store, token)  # type: ignore[arg-type]
        assert await uploads.receive(store, upload, parts, b"x") == n + 1  # type: ignore[arg-type]
    upload, parts = await uploads.held(store, token)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as refused:
        await uploads.receive(store, upload, parts, b"x")  # type: ignore[arg-type]
    assert refused.value.code == "INVALID_UPLOAD"
    last = await uploads.finish(store, token, upload, parts, b"y" * 10)  # type: ignore[arg-type]
    assert last == b"x" * PARTS_MAX + b"y" * 10
