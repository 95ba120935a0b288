"""S3 store on a real SeaweedFS bucket: what only S3 has (object metadata, content-addressed keys and
prefixes, bounded memory, outages, error statuses, timeouts and cancellation). What every store must
do is in the contract suite, ``test_store_contract.py``, which runs on this backend too."""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.response import AioStreamingBody
from aiobotocore.session import get_session
from aiohttp import web
from PIL import Image

from projectionist.policy.errors import AttachmentError, Unavailable
from projectionist.policy.events import Quarantine, QuarantineEvent
from projectionist.policy.model import ImageRef, StoredImage
from projectionist.policy.model import Placeholder
from projectionist.policy.projection import ProjectionContext, project
from projectionist.proxy.stores import s3 as s3store
from projectionist.proxy.config import ImageLimits, LanesConfig
from projectionist.proxy.lanes import Busy
from projectionist.proxy.stores.s3 import S3Store
from tests.backends import BUCKET, Seaweed
from tests.fakes import CountingStore
from tests.imaging import FORMATS, make_image, ref_id
from tests.memory import MemoryLog

NOT_FOUND, CORRUPT, READ_FAILED, INVALID_REF = (
    "ATTACHMENT_NOT_FOUND",
    "ATTACHMENT_CORRUPT",
    "ATTACHMENT_READ_FAILED",
    "INVALID_ATTACHMENT_REF",
)

MakeStore = Callable[..., S3Store]


# -- fixtures and helpers -------------------------------------------------------------------------


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex}/"


_SESSION = get_session()


@pytest.fixture
async def make_store(seaweed: Seaweed, prefix: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MakeStore]:
    """S3Store factory on the shared server and this test's own prefix; every store is closed.

    Stores share one botocore session (its loader caches the S3 service model, ~0.1 s per new
    session); each store still creates and closes its own client."""
    monkeypatch.setattr(s3store, "get_session", lambda: _SESSION)
    stores: list[S3Store] = []

    def make(**overrides: Any) -> S3Store:
        kwargs: dict[str, Any] = {"endpoint": seaweed.endpoint, "bucket": BUCKET, "prefix": prefix,
                                  "access_key": "test", "secret_key": "test", "limits": ImageLimits(),
                                  "read_timeout": 10.0, **overrides}
        s = S3Store(**kwargs)
        stores.append(s)
        return s

    yield make
    for s in stores:
        await s.close()


@pytest.fixture
async def store(make_store: MakeStore) -> S3Store:
    return make_store()


def hex_of(attachment_id: str) -> str:
    return attachment_id.removeprefix("sha256:")


async def keys(store: S3Store) -> list[str]:
    client = await store.client()
    listing = await client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []))


async def head(store: S3Store, attachment_id: str) -> dict[str, Any]:
    client = await store.client()
    result: dict[str, Any] = await client.head_object(Bucket=store.bucket, Key=store.key(hex_of(attachment_id)))
    return result


async def raw_bytes(store: S3Store, attachment_id: str) -> bytes:
    client = await store.client()
    response = await client.get_object(Bucket=store.bucket, Key=store.key(hex_of(attachment_id)))
    async with response["Body"] as body:
        data: bytes = await body.read()
    return data


async def put_raw(store: S3Store, attachment_id: str, data: bytes, metadata: dict[str, str] | None) -> None:
    """Write an object under the store's key for ``attachment_id``, behind the store's back."""
    client = await store.client()
    extra = {} if metadata is None else {"Metadata": metadata}
    await client.put_object(Bucket=store.bucket, Key=store.key(hex_of(attachment_id)), Body=data, **extra)


def record(data: bytes, media_type: str = "image/png", width: int | str = 4, height: int | str = 3,
           **changes: str) -> dict[str, str]:
    """Object metadata as admission writes it for ``data``, with ``changes`` applied."""
    meta = {"media-type": media_type, "bytes": str(len(data)), "width": str(width), "height": str(height),
            "created-at": str(int(time.time()))}
    meta.update(changes)
    return meta


def _flip_middle(data: bytes) -> bytes:
    raw = bytearray(data)
    raw[len(raw) // 2] ^= 0x01
    return bytes(raw)


async def expect_code(store: S3Store, attachment_id: str, code: str) -> AttachmentError:
    with pytest.raises(AttachmentError) as info:
        await store.read_image(attachment_id)
    assert info.value.code == code, info.value.message
    return info.value


class BodySpy:
    """Counts the bytes the store pulls out of S3 response bodies (every read path)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes_read = 0
        self.calls = 0
        real_read = AioStreamingBody.read
        real_readinto = AioStreamingBody.readinto
        spy = self

        async def read(body: AioStreamingBody, amt: int | None = None) -> bytes:
            spy.calls += 1
            chunk: bytes = await real_read(body, amt)
            spy.bytes_read += len(chunk)
            return chunk

        async def readinto(body: AioStreamingBody, b: bytearray) -> int:
            spy.calls += 1
            n: int = await real_readinto(body, b)
            spy.bytes_read += n
            return n

        monkeypatch.setattr(AioStreamingBody, "read", read)
        monkeypatch.setattr(AioStreamingBody, "readinto", readinto)


# -- admission and layout -------------------------------------------------------------------------


@pytest.mark.parametrize("media_type", list(FORMATS))
async def test_admission_writes_the_type_length_and_record_as_object_metadata(store: S3Store, media_type: str) -> None:
    data = make_image(6, 4, media_type)
    expected = StoredImage(id=ref_id(data), media_type=media_type, bytes=len(data), width=6, height=4, data=data)
    assert await store.admit(data, media_type, name="shot.img") == expected
    h = await head(store, expected.id)
    assert h["ContentType"] == media_type
    assert h["ContentLength"] == len(data)
    meta = dict(h["Metadata"])
    assert abs(int(meta.pop("created-at")) - time.time()) < 60
    assert meta == {"media-type": media_type, "bytes": str(len(data)), "width": "6", "height": "4",
                    "name": "shot.img"}


@pytest.mark.parametrize(("declared", "media_type"), [
    (None, "image/png"), ("application/octet-stream", "image/gif"), ("image/jpg", "image/jpeg"),
    ("IMAGE/WEBP; charset=binary", "image/webp"),
])
async def test_undeclared_and_aliased_types_are_admitted(store: S3Store, declared: str | None, media_type: str) -> None:
    data = make_image(media_type=media_type, color=3)
    stored = await store.admit(data, declared)
    assert stored.media_type == media_type
    assert (await store.read_image(stored.id)).media_type == media_type


async def test_key_is_content_addressed(store: S3Store, prefix: str) -> None:
    data = make_image(color=7)
    stored = await store.admit(data)
    hex_digest = hashlib.sha256(data).hexdigest()
    assert stored.id == "sha256:" + hex_digest
    assert await keys(store) == [f"{prefix}objects/{hex_digest[:2]}/{hex_digest}"]
    assert await raw_bytes(store, stored.id) == data
    other = await store.admit(make_image(color=8, media_type="image/gif"))
    listed = await keys(store)
    assert len(listed) == 2 and store.key(hex_of(other.id)) in listed
    for key in listed:
        digest = key.rsplit("/", 1)[1]
        assert len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


async def test_prefixes_isolate_stores(make_store: MakeStore, prefix: str) -> None:
    a = make_store()
    b = make_store(prefix=prefix + "other/")
    stored = await a.admit(make_image(color=11))
    await expect_code(b, stored.id, NOT_FOUND)
    assert await b.stat(stored.id) is None
    assert await a.read_image(stored.id) == stored


async def test_second_admit_does_not_rewrite(store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    data = make_image(media_type="image/webp", color=5)
    first = await store.admit(data, name="first.webp")
    before = await head(store, first.id)
    client = await store.client()
    puts: list[object] = []
    real_put = client.put_object

    async def spy_put(**kwargs: object) -> object:
        puts.append(kwargs)
        return await real_put(**kwargs)

    monkeypatch.setattr(client, "put_object", spy_put)
    second = await store.admit(data, "image/webp", name="second.webp")
    assert second == first
    assert puts == []
    after = await head(store, first.id)
    assert (after["ETag"], after["LastModified"]) == (before["ETag"], before["LastModified"])
    assert after["Metadata"] == before["Metadata"]
    assert after["Metadata"]["name"] == "first.webp"


# -- invalid ids never reach S3 ---------------------------------------------------------------------


BAD_IDS = [
    "sha256:../../etc/passwd",
    "sha256:" + "../" * 20 + "etc/passwd" + "a" * 4,
    "sha256:" + "a" * 62 + "/..",
    "sha256:" + "A" * 64,
    "SHA256:" + "a" * 64,
    "sha256:" + "a" * 63,
    "sha256:" + "a" * 65,
    "sha256:" + "a" * 63 + "/",
    "sha256:" + "a" * 64 + "\n",
    "sha256:" + "g" * 64,
    "a" * 64,
    "",
    "sha256:",
]


@pytest.mark.parametrize("bad_id", BAD_IDS)
async def test_invalid_ids_are_refused_without_any_s3_call(
    store: S3Store, monkeypatch: pytest.MonkeyPatch, bad_id: str
) -> None:
    calls: list[str] = []

    async def forbidden() -> object:
        calls.append("client")
        raise AssertionError("S3 client used for an invalid id")

    monkeypatch.setattr(store, "client", forbidden)
    for op in ("read_image", "stat", "delete"):
        with pytest.raises(AttachmentError) as info:
            await getattr(store, op)(bad_id)
        assert (info.value.code, info.value.status) == (INVALID_REF, 400), op
    assert calls == []


# -- bounded memory ---------------------------------------------------------------------------------


async def test_object_longer_than_its_record_is_refused_unread(
    store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    attachment_id = ref_id(make_image(color=31))
    big = b"\x89PNG" + b"x" * (5 * 1024 * 1024)
    await put_raw(store, attachment_id, big, record(b"y" * 100))  # the record says 100 bytes
    spy = BodySpy(monkeypatch)
    err = await expect_code(store, attachment_id, CORRUPT)
    assert (spy.calls, spy.bytes_read) == (0, 0)
    assert str(len(big)) in err.message and "100" in err.message


async def test_record_over_max_bytes_is_refused_unread(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    roomy = make_store()
    data = make_image(40, 30, color=4)
    stored = await roomy.admit(data)
    strict = make_store(limits=ImageLimits(max_bytes=len(data) - 1))
    spy = BodySpy(monkeypatch)
    await expect_code(strict, stored.id, CORRUPT)
    assert (spy.calls, spy.bytes_read) == (0, 0)
    assert await roomy.read_image(stored.id) == stored  # the same object is fine within the limit
    assert spy.bytes_read == len(data)


async def test_large_image_is_read_in_chunks_and_verified(
    store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over CHUNK and INLINE_LIMIT: several body reads, hashing off the loop, still verified."""
    noise = Image.frombytes("RGB", (600, 600), random.Random(7).randbytes(600 * 600 * 3))
    buf = io.BytesIO()
    noise.save(buf, format="PNG")
    data = buf.getvalue()
    assert len(data) > 2 * s3store.CHUNK and len(data) > s3store.INLINE_LIMIT
    stored = await store.admit(data, "image/png")
    assert (stored.bytes, stored.width, stored.height) == (len(data), 600, 600)
    spy = BodySpy(monkeypatch)
    assert await store.read_image(stored.id) == stored
    assert spy.bytes_read == len(data) and spy.calls >= 3
    await put_raw(store, stored.id, _flip_middle(data), record(data, width=600, height=600))
    err = await expect_code(store, stored.id, CORRUPT)
    assert "digest" in err.message


# -- stat and delete --------------------------------------------------------------------------------


@pytest.mark.parametrize("metadata", [None, {"bytes": "garbage"}], ids=["no-metadata", "garbage-metadata"])
async def test_delete_of_an_object_without_a_valid_record_reports_it_existed(
    store: S3Store, metadata: dict[str, str] | None
) -> None:
    """Like the filesystem store ("True if anything was removed"): an object with a damaged record
    is still present, and deleting it removes something."""
    data = make_image(color=42)
    await put_raw(store, ref_id(data), data, metadata)
    await expect_code(store, ref_id(data), CORRUPT)
    assert await store.delete(ref_id(data)) is True
    assert await keys(store) == []
    assert await store.delete(ref_id(data)) is False


# -- S3 faults: an outage, error statuses, a dropped body -------------------------------------------


def second_seaweed(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Seaweed:
    """A Seaweed of this test's own, next to the session one (tests.backends turns off weed's
    fixed-port Iceberg and Lance listeners so instances can coexist)."""
    return Seaweed(directory / "data")


async def test_stopped_server_is_read_failed_and_quarantined_after_one_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weed = second_seaweed(tmp_path / "weed", monkeypatch)
    s: S3Store | None = None
    try:
        await asyncio.to_thread(weed.start)
        await asyncio.to_thread(weed.create_bucket, "outage")
        s = S3Store(endpoint=weed.endpoint, bucket="outage", prefix="p/", access_key="test", secret_key="test",
                    read_timeout=3.0, connect_timeout=0.5)
        data = make_image(color=50)
        stored = await s.admit(data)
        assert await s.read_image(stored.id) == stored
        await asyncio.to_thread(weed.stop, 0.2)  # weed lingers after SIGTERM; then SIGKILL

        loop = asyncio.get_running_loop()
        started = loop.time()
        err = await expect_code(s, stored.id, READ_FAILED)
        assert err.status == 503 and err.retryable
        assert err.attachment_id == stored.id
        assert loop.time() - started < 3.5

        counting = CountingStore(s)
        log = MemoryLog()
        projection = await project([ImageRef(stored.id, "shot.png")], ProjectionContext(store=counting, log=log,
                                                                                         session_id="s"))
        assert counting.reads == {stored.id: 2}
        assert projection.reads == 2
        events = log.sessions["s"]
        assert len(events) == 1
        event = events[0]
        assert isinstance(event, QuarantineEvent)
        assert event.data == Quarantine(stored.id, "read_failed", retryable=True, name="shot.png")
        (outcome,) = projection.outcomes
        assert isinstance(outcome, Placeholder) and outcome.failure == "read_failed"

        with pytest.raises(Unavailable) as unavailable:  # stat is no read: the store is unavailable
            await s.stat(stored.id)
        assert (unavailable.value.code, unavailable.value.status) == ("STORE_UNAVAILABLE", 503)
        with pytest.raises(Unavailable) as write_failed:
            await s.admit(make_image(color=51))
        assert (write_failed.value.code, write_failed.value.status) == ("ATTACHMENT_WRITE_FAILED", 503)
    finally:
        if s is not None:
            await s.close()
        await asyncio.to_thread(weed.stop, 0.2)


class FakeS3:
    """An aiohttp app standing in for S3: stalls, or answers with a scripted response."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()
        self.body_started = asyncio.Event()
        self.requests: list[tuple[str, str]] = []
        self.respond: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        self.arrived.set()
        if self.respond is not None:
            return await self.respond(request)
        try:
            await asyncio.wait_for(self.release.wait(), 10)  # stall (released at teardown)
        except TimeoutError:
            pass
        return web.Response(status=500)


@pytest.fixture
async def fake_s3(aiohttp_server: Any) -> AsyncIterator[tuple[FakeS3, str]]:
    fake = FakeS3()
    server = await aiohttp_server(fake.app())
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        fake.release.set()


def s3_error(status: int, code: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def respond(request: web.Request) -> web.StreamResponse:
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>scripted</Message><Key>{request.path}</Key></Error>")
        return web.Response(status=status, body=body.encode(), content_type="application/xml")
    return respond


def stall_mid_body(fake: FakeS3, data: bytes) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Send valid headers and half the body, then stall until released."""

    async def respond(request: web.Request) -> web.StreamResponse:
        headers = {f"x-amz-meta-{k}": v for k, v in record(data).items()}
        resp = web.StreamResponse(headers={**headers, "Content-Type": "image/png"})
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[: len(data) // 2])
        fake.body_started.set()
        try:
            await asyncio.wait_for(fake.release.wait(), 10)
        except TimeoutError:
            pass
        return resp

    return respond


@pytest.mark.parametrize("stall", ["before-headers", "mid-body"])
async def test_slow_server_times_out_as_read_failed(
    fake_s3: tuple[FakeS3, str], make_store: MakeStore, stall: str
) -> None:
    fake, url = fake_s3
    data = make_image(color=12)
    if stall == "mid-body":
        fake.respond = stall_mid_body(fake, data)
    s = make_store(endpoint=url, read_timeout=0.3, connect_timeout=0.5)
    await s.client()  # the timeout is for the read, not for building a client
    attachment_id = ref_id(data)
    loop = asyncio.get_running_loop()
    started = loop.time()
    err = await expect_code(s, attachment_id, READ_FAILED)
    elapsed = loop.time() - started
    assert fake.arrived.is_set()
    assert fake.body_started.is_set() is (stall == "mid-body")
    assert ("GET", f"/{BUCKET}/{s.key(hex_of(attachment_id))}") in fake.requests
    assert elapsed < 2.0, elapsed  # the server stalls for 10 s
    assert err.status == 503 and err.retryable
    assert err.attachment_id == attachment_id


@pytest.mark.parametrize("stall", ["before-headers", "mid-body"])
@pytest.mark.parametrize("read_timeout", [1.0, 30.0])
async def test_cancelling_a_read_propagates_cancellation(
    fake_s3: tuple[FakeS3, str], make_store: MakeStore, read_timeout: float, stall: str
) -> None:
    fake, url = fake_s3
    data = make_image(color=13)
    if stall == "mid-body":
        fake.respond = stall_mid_body(fake, data)
    s = make_store(endpoint=url, read_timeout=read_timeout)
    await s.client()
    task = asyncio.create_task(s.read_image(ref_id(data)))
    await asyncio.wait_for((fake.body_started if stall == "mid-body" else fake.arrived).wait(), 5)
    await asyncio.sleep(0.05)  # let the client settle into waiting
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (404, "NoSuchKey", NOT_FOUND),
        (403, "AccessDenied", READ_FAILED),
        (500, "InternalError", READ_FAILED),
        (503, "SlowDown", READ_FAILED),
        (400, "InvalidRequest", READ_FAILED),
    ],
)
async def test_error_statuses_are_classified(
    fake_s3: tuple[FakeS3, str], make_store: MakeStore, status: int, code: str, expected: str
) -> None:
    fake, url = fake_s3
    fake.respond = s3_error(status, code)
    s = make_store(endpoint=url, read_timeout=5.0, connect_timeout=0.5)
    err = await expect_code(s, ref_id(make_image()), expected)
    assert err.retryable is (expected == READ_FAILED)


async def test_body_cut_short_is_read_failed(fake_s3: tuple[FakeS3, str], make_store: MakeStore) -> None:
    fake, url = fake_s3
    data = make_image(64, 64, color=9)

    async def respond(request: web.Request) -> web.StreamResponse:
        headers = {f"x-amz-meta-{k}": v for k, v in record(data, width=64, height=64).items()}
        resp = web.StreamResponse(headers={**headers, "Content-Type": "image/png"})
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[: len(data) // 2])
        assert request.transport is not None
        request.transport.abort()  # the connection drops mid-body
        return resp

    fake.respond = respond
    s = make_store(endpoint=url, read_timeout=5.0, connect_timeout=0.5)
    err = await expect_code(s, ref_id(data), READ_FAILED)
    assert err.retryable


async def test_fake_server_serves_a_verified_image(fake_s3: tuple[FakeS3, str], make_store: MakeStore) -> None:
    """Control for the fault tests above: the same fake, answering properly, yields the image."""
    fake, url = fake_s3
    data = make_image(64, 64, color=9)

    async def respond(request: web.Request) -> web.StreamResponse:
        headers = {f"x-amz-meta-{k}": v for k, v in record(data, width=64, height=64).items()}
        return web.Response(body=data, headers=headers, content_type="image/png")

    fake.respond = respond
    s = make_store(endpoint=url, read_timeout=5.0, connect_timeout=0.5)
    image = await s.read_image(ref_id(data))
    assert image == StoredImage(ref_id(data), "image/png", len(data), 64, 64, data)


async def test_admission_decodes_in_a_bounded_lane_and_a_full_one_is_busy(make_store: MakeStore) -> None:
    """Admission's full decode takes a place in a lane as wide as the write lane (each decode can
    hold ~128 MB at the pixel limits): with every place taken, the next upload waits at most
    ``queue_timeout`` and is refused busy, not queued on an unbounded thread pool."""
    store = make_store(lanes=LanesConfig(writes=1, queue_timeout=0.2))
    release = threading.Event()
    blocker = asyncio.ensure_future(store.decodes.run(release.wait))
    await asyncio.sleep(0.05)
    try:
        with pytest.raises(Busy):
            await store.admit(make_image(color=77), "image/png")
    finally:
        release.set()
        await blocker
    admitted = await store.admit(make_image(color=77), "image/png")
    assert admitted.id == ref_id(make_image(color=77))
