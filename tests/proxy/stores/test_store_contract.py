"""The attachment store contract, written once and run on every backend: the filesystem store (on a
temp dir) and the S3 store (on the session's SeaweedFS bucket, under a key prefix of the test's own).

Admission is verified, idempotent and bounded by the store's limits, and rejected bytes store
nothing; a verified read gives back exactly what was admitted; a read classifies what is wrong
(missing, corrupt, invalid id) without ever echoing the object's bytes; re-admitting the right bytes
repairs a deleted or damaged object; ``stat`` describes the first admission without reading the
bytes; ``delete`` removes the object and nothing else.

Each backend comes with a few helpers that reach its storage behind the store's back (``stored``,
``raw_bytes``, ``record``, ``corrupt``, ``plant``, ``remove``, ``damage``) and its own table of
damages, since what can be damaged differs (a data file and a JSON record, or one S3 object and its
metadata). What only one backend has (the filesystem's layout, fsync order and worker thread; S3's
metadata, bounded reads, outages and error statuses) stays in ``test_fsstore.py`` and
``test_s3store.py``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiobotocore.response import AioStreamingBody
from aiobotocore.session import AioSession, get_session

from projectionist.policy.errors import AttachmentError, ImageRejected, Unavailable
from projectionist.policy.model import StoredImage
from projectionist.proxy.config import ImageLimits
from projectionist.proxy.stores import filesystem as fsstore
from projectionist.proxy.stores import s3 as s3store
from projectionist.proxy.stores.filesystem import FilesystemStore
from projectionist.proxy.stores.s3 import S3Store
from tests.backends import BUCKET, Seaweed
from tests.imaging import FORMATS, make_image, ref_id

NOT_FOUND, CORRUPT, READ_FAILED, INVALID_REF = (
    "ATTACHMENT_NOT_FOUND",
    "ATTACHMENT_CORRUPT",
    "ATTACHMENT_READ_FAILED",
    "INVALID_ATTACHMENT_REF",
)

Store = FilesystemStore | S3Store
#: A backend's own kind of damage (see each backend's ``damage``).
Damage = Callable[..., Any]


def hex_of(attachment_id: str) -> str:
    return attachment_id.removeprefix("sha256:")


async def expect_code(store: Store, attachment_id: str, code: str) -> AttachmentError:
    with pytest.raises(AttachmentError) as info:
        await store.read_image(attachment_id)
    assert info.value.code == code, info.value.message
    return info.value


# -- the backends ----------------------------------------------------------------------------------


class StoreBackend:
    """One store backend: a factory of stores on one root or prefix (all closed at teardown), a
    default store, and access to the stored objects behind the stores' backs."""

    #: Damages after which a read is ``ATTACHMENT_CORRUPT``, with a word the message must carry.
    CORRUPTIONS: dict[str, tuple[Damage, str]] = {}
    #: Damages that re-admitting the right bytes must repair.
    REPAIRABLE: dict[str, Damage] = {}

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.made: list[Store] = []
        self.store = self.make()

    def make(self, **overrides: Any) -> Store:
        store = self._open(**overrides)
        self.made.append(store)
        return store

    @classmethod
    def for_test(cls, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> StoreBackend:
        """This backend on the requesting test's own root or prefix."""
        raise NotImplementedError

    def _open(self, **overrides: Any) -> Store:
        raise NotImplementedError

    async def stored(self) -> list[str]:
        """The names of everything the backend holds, sorted (files under the root, keys under the prefix)."""
        raise NotImplementedError

    def objects_of(self, attachment_id: str) -> list[str]:
        """The names (as ``stored`` lists them) that admitting ``attachment_id`` writes, sorted."""
        raise NotImplementedError

    async def raw_bytes(self, attachment_id: str) -> bytes:
        raise NotImplementedError

    async def record(self, attachment_id: str) -> dict[str, str]:
        """The object's admission record as written, every value a string."""
        raise NotImplementedError

    async def corrupt(self, attachment_id: str, data: bytes) -> None:
        """Overwrite the object's bytes, keeping its admission record."""
        raise NotImplementedError

    async def plant(self, attachment_id: str, data: bytes) -> None:
        """Write ``data`` under ``attachment_id`` with a well-formed record for a 4x3 PNG of ``len(data)`` bytes."""
        raise NotImplementedError

    async def remove(self, attachment_id: str) -> None:
        """Delete the object's bytes."""
        raise NotImplementedError

    async def damage(self, attachment_id: str, damage: Damage) -> None:
        """Apply one of this backend's damages to an intact object."""
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def reading_forbidden(self) -> AsyncIterator[None]:
        """Fail if an object's bytes are read inside the block."""
        raise NotImplementedError
        yield

    def gone(self) -> FilesystemStore | S3Store:
        """A store whose place is not there (a directory moved away, a bucket never made)."""
        raise NotImplementedError

    async def close(self) -> None:
        for store in self.made:
            await store.close()


def _edit_record(record_path: Path, **changes: object) -> None:
    record = msgspec.json.decode(record_path.read_bytes())
    record.update(changes)
    record_path.write_bytes(msgspec.json.encode(record))


def _flip_middle_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


# A filesystem damage: (data path, record path) -> anything.


class FilesystemBackend(StoreBackend):
    CORRUPTIONS: dict[str, tuple[Damage, str]] = {
        "digest-mismatch-same-size": (lambda d, r: _flip_middle_byte(d), "digest"),
        "data-appended": (lambda d, r: d.write_bytes(d.read_bytes() + b"\0"), "digest"),
        "size-mismatch": (lambda d, r: _edit_record(r, bytes=1), "size"),
        "media-type-mismatch": (lambda d, r: _edit_record(r, media_type="image/gif"), "media type"),
        "width-mismatch": (lambda d, r: _edit_record(r, width=5), "dimensions"),
        "height-mismatch": (lambda d, r: _edit_record(r, height=2), "dimensions"),
        "record-missing": (lambda d, r: r.unlink(), "record"),
        "record-garbage": (lambda d, r: r.write_bytes(b"\x00not json{"), "record"),
        "record-empty": (lambda d, r: r.write_bytes(b""), "record"),
        "record-wrong-type": (lambda d, r: _edit_record(r, width="4"), "record"),
        "record-incomplete": (lambda d, r: r.write_bytes(b'{"media_type":"image/png"}'), "record"),
    }
    REPAIRABLE: dict[str, Damage] = {
        "data": lambda d, r: d.write_bytes(bytes([d.read_bytes()[0] ^ 0xFF]) + d.read_bytes()[1:]),
        "record-missing": lambda d, r: r.unlink(),
        "record-garbage": lambda d, r: r.write_bytes(b"{garbage"),
        "record-wrong": lambda d, r: _edit_record(r, width=999),
    }

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        super().__init__(monkeypatch)

    @classmethod
    def for_test(cls, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> StoreBackend:
        return cls(request.getfixturevalue("tmp_path") / "store", monkeypatch)

    def _open(self, **overrides: Any) -> FilesystemStore:
        return FilesystemStore(self.root, **overrides)

    def gone(self) -> FilesystemStore:
        store = self.make()
        (self.root / "objects").rename(self.root / "elsewhere")
        return store

    def paths(self, attachment_id: str) -> tuple[Path, Path]:
        hex_digest = hex_of(attachment_id)
        directory = self.root / "objects" / hex_digest[:2]
        return directory / hex_digest, directory / f"{hex_digest}.json"

    async def stored(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def objects_of(self, attachment_id: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.paths(attachment_id))

    async def raw_bytes(self, attachment_id: str) -> bytes:
        return self.paths(attachment_id)[0].read_bytes()

    async def record(self, attachment_id: str) -> dict[str, str]:
        record = msgspec.json.decode(self.paths(attachment_id)[1].read_bytes())
        return {key: str(value) for key, value in record.items()}

    async def corrupt(self, attachment_id: str, data: bytes) -> None:
        self.paths(attachment_id)[0].write_bytes(data)

    async def plant(self, attachment_id: str, data: bytes) -> None:
        data_path, record_path = self.paths(attachment_id)
        data_path.parent.mkdir(parents=True, exist_ok=True)
        data_path.write_bytes(data)
        record_path.write_bytes(
            msgspec.json.encode({"media_type": "image/png", "bytes": len(data), "width": 4, "height": 3})
        )

    async def remove(self, attachment_id: str) -> None:
        self.paths(attachment_id)[0].unlink()

    async def damage(self, attachment_id: str, damage: Damage) -> None:
        damage(*self.paths(attachment_id))

    @contextlib.asynccontextmanager
    async def reading_forbidden(self) -> AsyncIterator[None]:
        read: list[Path] = []
        real = fsstore._read_file

        def spy(path: Path) -> bytes:
            if path.suffix != ".json":  # an object's bytes, not its record
                read.append(path)
                raise AssertionError(f"read {path}")
            return real(path)

        with self.monkeypatch.context() as m:
            m.setattr(fsstore, "_read_file", spy)
            yield
        assert read == []


def s3_record(data: bytes, media_type: str = "image/png", width: int | str = 4, height: int | str = 3,
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


# An S3 damage: the intact bytes -> (body, metadata or None) to put in their place.


class S3Backend(StoreBackend):
    CORRUPTIONS: dict[str, tuple[Damage, str]] = {
        "other-bytes-same-size": (lambda d: (_flip_middle(d), s3_record(d)), "digest"),
        "other-bytes-longer": (lambda d: (d + b"\0", s3_record(d)), "size"),
        "other-bytes-shorter": (lambda d: (d[:-1], s3_record(d)), "size"),
        "record-size-wrong": (lambda d: (d, s3_record(d, bytes=str(len(d) - 1))), "size"),
        "metadata-missing": (lambda d: (d, None), "record"),
        "metadata-unrelated": (lambda d: (d, {"unrelated": "x"}), "record"),
        "metadata-bytes-garbage": (lambda d: (d, s3_record(d, bytes="lots")), "record"),
        "metadata-width-garbage": (lambda d: (d, s3_record(d, width="4.0")), "record"),
        "metadata-incomplete": (lambda d: (d, {k: v for k, v in s3_record(d).items() if k != "height"}), "record"),
        # the same words as the filesystem's: both backends' reads end in the one ``stores.verify``
        "media-type-mismatch": (lambda d: (d, s3_record(d, media_type="image/gif")), "media type"),
        "width-mismatch": (lambda d: (d, s3_record(d, width="5")), "dimensions"),
        "height-mismatch": (lambda d: (d, s3_record(d, height="2")), "dimensions"),
    }
    REPAIRABLE: dict[str, Damage] = {
        "same-size-bytes": lambda d: (_flip_middle(d), s3_record(d)),
        "longer-bytes": lambda d: (d + b"\0", s3_record(d)),
        "metadata-missing": lambda d: (d, None),
        "metadata-wrong": lambda d: (d, s3_record(d, width="999")),
    }
    _session: AioSession | None = None

    def __init__(self, seaweed: Seaweed, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seaweed, self.prefix = seaweed, prefix
        # Stores share one botocore session (its loader caches the S3 service model, ~0.1 s per new
        # session); each store still creates and closes its own client.
        if S3Backend._session is None:
            S3Backend._session = get_session()
        monkeypatch.setattr(s3store, "get_session", lambda: S3Backend._session)
        super().__init__(monkeypatch)

    @classmethod
    def for_test(cls, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> StoreBackend:
        return cls(request.getfixturevalue("seaweed"), f"t-{uuid.uuid4().hex}/", monkeypatch)

    def _open(self, **overrides: Any) -> S3Store:
        kwargs: dict[str, Any] = {"endpoint": self.seaweed.endpoint, "bucket": BUCKET, "prefix": self.prefix,
                                  "access_key": "test", "secret_key": "test", "limits": ImageLimits(),
                                  "read_timeout": 10.0, **overrides}
        return S3Store(**kwargs)

    def gone(self) -> S3Store:
        return self.make(bucket=f"no-such-bucket-{uuid.uuid4().hex[:8]}")

    async def _client(self) -> Any:
        assert isinstance(self.store, S3Store)
        return await self.store.client()

    def key(self, attachment_id: str) -> str:
        assert isinstance(self.store, S3Store)
        return self.store.key(hex_of(attachment_id))

    async def stored(self) -> list[str]:
        listing = await (await self._client()).list_objects_v2(Bucket=BUCKET, Prefix=self.prefix)
        return sorted(o["Key"] for o in listing.get("Contents", []))

    def objects_of(self, attachment_id: str) -> list[str]:
        return [self.key(attachment_id)]

    async def raw_bytes(self, attachment_id: str) -> bytes:
        response = await (await self._client()).get_object(Bucket=BUCKET, Key=self.key(attachment_id))
        async with response["Body"] as body:
            data: bytes = await body.read()
        return data

    async def record(self, attachment_id: str) -> dict[str, str]:
        head = await (await self._client()).head_object(Bucket=BUCKET, Key=self.key(attachment_id))
        return dict(head["Metadata"])

    async def put_raw(self, attachment_id: str, data: bytes, metadata: dict[str, str] | None) -> None:
        extra = {} if metadata is None else {"Metadata": metadata}
        await (await self._client()).put_object(Bucket=BUCKET, Key=self.key(attachment_id), Body=data, **extra)

    async def corrupt(self, attachment_id: str, data: bytes) -> None:
        await self.put_raw(attachment_id, data, await self.record(attachment_id))

    async def plant(self, attachment_id: str, data: bytes) -> None:
        await self.put_raw(attachment_id, data, s3_record(data))

    async def remove(self, attachment_id: str) -> None:
        await (await self._client()).delete_object(Bucket=BUCKET, Key=self.key(attachment_id))

    async def damage(self, attachment_id: str, damage: Damage) -> None:
        body, metadata = damage(await self.raw_bytes(attachment_id))
        await self.put_raw(attachment_id, body, metadata)

    @contextlib.asynccontextmanager
    async def reading_forbidden(self) -> AsyncIterator[None]:
        client = await self._client()
        calls: list[str] = []

        async def no_get(**kwargs: object) -> object:
            raise AssertionError("the object was read")

        def counting(name: str, real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def spy(*args: Any, **kwargs: Any) -> Any:
                calls.append(name)  # any bytes pulled out of any S3 response body
                return await real(*args, **kwargs)
            return spy

        with self.monkeypatch.context() as m:
            m.setattr(client, "get_object", no_get)
            m.setattr(AioStreamingBody, "read", counting("read", AioStreamingBody.read))
            m.setattr(AioStreamingBody, "readinto", counting("readinto", AioStreamingBody.readinto))
            yield
        assert calls == []


KINDS: dict[str, type[StoreBackend]] = {"filesystem": FilesystemBackend, "s3": S3Backend}


@pytest.fixture(params=list(KINDS))
async def store_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[StoreBackend]:
    backend = KINDS[request.param].for_test(request, monkeypatch)
    try:
        yield backend
    finally:
        await backend.close()


def per_backend(table: str) -> list[Any]:
    """(backend kind, damage[, why]) for every entry of every backend's damage ``table``, for
    ``parametrize(..., indirect=["store_backend"])``."""
    params = []
    for kind, backend in KINDS.items():
        for name, entry in getattr(backend, table).items():
            values = entry if isinstance(entry, tuple) else (entry,)
            params.append(pytest.param(kind, *values, id=f"{kind}-{name}"))
    return params


# -- readiness -------------------------------------------------------------------------------------


async def test_ping_answers_and_fails_where_the_store_is_gone(store_backend: StoreBackend) -> None:
    await store_backend.store.ping()
    await store_backend.store.admit(make_image(color=31))
    await store_backend.store.ping()
    with pytest.raises(Unavailable) as info:
        await store_backend.gone().ping()
    assert info.value.code == "STORE_UNAVAILABLE" and info.value.status == 503


# -- admission -------------------------------------------------------------------------------------


@pytest.mark.parametrize("media_type", list(FORMATS))
async def test_admit_then_read_round_trip(store_backend: StoreBackend, media_type: str) -> None:
    store = store_backend.store
    data = make_image(6, 4, media_type)
    expected = StoredImage(id=ref_id(data), media_type=media_type, bytes=len(data), width=6, height=4, data=data)
    assert await store.admit(data, media_type, name="shot.img") == expected
    assert await store.read_image(ref_id(data)) == expected


async def test_rejected_bytes_store_nothing(store_backend: StoreBackend) -> None:
    store = store_backend.store
    with pytest.raises(ImageRejected) as info:
        await store.admit(b"definitely not an image")
    assert (info.value.code, info.value.status) == ("INVALID_IMAGE", 400)
    with pytest.raises(ImageRejected) as info:
        await store.admit(make_image(), "image/gif")
    assert (info.value.code, info.value.status) == ("MEDIA_TYPE_MISMATCH", 400)
    with pytest.raises(ImageRejected) as info:
        await store.admit(b"GIF89a" + b"\0" * 10, "image/gif")  # magic bytes alone are not an image
    assert info.value.code == "INVALID_IMAGE"
    assert await store_backend.stored() == []


@pytest.mark.parametrize(
    ("limits", "name"),
    [
        (ImageLimits(max_bytes=10), "max_bytes"),
        (ImageLimits(max_pixels=11), "max_pixels"),
        (ImageLimits(max_side=3), "max_side"),
    ],
)
async def test_admit_applies_store_limits(store_backend: StoreBackend, limits: ImageLimits, name: str) -> None:
    s = store_backend.make(limits=limits)
    with pytest.raises(ImageRejected) as info:
        await s.admit(make_image(4, 3))
    assert (info.value.code, info.value.status) == ("IMAGE_TOO_LARGE", 413)
    assert name in info.value.message
    assert await store_backend.stored() == []


# -- repair by re-admission ------------------------------------------------------------------------


async def test_readmission_repairs_deleted_object(store_backend: StoreBackend) -> None:
    store = store_backend.store
    data = make_image(media_type="image/gif")
    stored = await store.admit(data)
    await store_backend.remove(stored.id)
    await expect_code(store, stored.id, NOT_FOUND)
    assert await store.admit(data) == stored
    assert await store.read_image(stored.id) == stored
    assert await store_backend.raw_bytes(stored.id) == data


@pytest.mark.parametrize(("store_backend", "damage"), per_backend("REPAIRABLE"), indirect=["store_backend"])
async def test_readmission_repairs_corrupt_object(store_backend: StoreBackend, damage: Damage) -> None:
    store = store_backend.store
    data = make_image(media_type="image/jpeg")
    stored = await store.admit(data)
    await store_backend.damage(stored.id, damage)
    await expect_code(store, stored.id, CORRUPT)
    assert await store.admit(data, name="again.jpg") == stored
    assert await store.read_image(stored.id) == stored
    assert await store_backend.raw_bytes(stored.id) == data
    assert (await store_backend.record(stored.id))["width"] == "4"


# -- read classification ---------------------------------------------------------------------------


async def test_missing_object_is_not_found(store_backend: StoreBackend) -> None:
    attachment_id = ref_id(make_image(color=21))
    err = await expect_code(store_backend.store, attachment_id, NOT_FOUND)
    assert err.status == 422 and not err.retryable
    assert err.attachment_id == attachment_id
    assert attachment_id[:15] in err.message and NOT_FOUND in err.message


@pytest.mark.parametrize(("store_backend", "damage", "why"), per_backend("CORRUPTIONS"), indirect=["store_backend"])
async def test_corruption_is_classified(store_backend: StoreBackend, damage: Damage, why: str) -> None:
    store = store_backend.store
    data = make_image(4, 3, "image/png", color=2)
    stored = await store.admit(data)
    assert await store.read_image(stored.id) == stored  # intact before the damage
    await store_backend.damage(stored.id, damage)
    err = await expect_code(store, stored.id, CORRUPT)
    assert err.status == 422 and not err.retryable
    assert err.attachment_id == stored.id
    assert why in err.message
    assert stored.id[:15] in err.message


async def test_unparsable_header_with_matching_digest_is_corrupt(store_backend: StoreBackend) -> None:
    junk = b"\x89PNG\r\n\x1a\nthis is not a real png"
    attachment_id = ref_id(junk)
    await store_backend.plant(attachment_id, junk)
    err = await expect_code(store_backend.store, attachment_id, CORRUPT)
    assert "header" in err.message
    assert "real png" not in err.message


async def test_error_messages_never_carry_bytes(store_backend: StoreBackend) -> None:
    store = store_backend.store
    data = make_image()
    stored = await store.admit(data)
    secret = b"SECRET-CONTENT" * 4
    # The bytes replaced under the admission record, then with a record that describes them.
    for replace in (store_backend.corrupt, store_backend.plant):
        await replace(stored.id, secret)
        err = await expect_code(store, stored.id, CORRUPT)
        assert "SECRET" not in str(err) and "SECRET" not in repr(err)


async def test_uppercase_id_of_an_existing_object_is_invalid_not_found(store_backend: StoreBackend) -> None:
    store = store_backend.store
    stored = await store.admit(make_image())
    upper = "sha256:" + hex_of(stored.id).upper()
    assert upper != stored.id
    await expect_code(store, upper, INVALID_REF)


# -- stat and delete -------------------------------------------------------------------------------


async def test_stat_reports_the_first_admission_without_reading_bytes(store_backend: StoreBackend) -> None:
    store = store_backend.store
    data = make_image(color=90)
    name = 'first "shot" ü/50%.png'
    started = int(time.time())
    stored = await store.admit(data, name=name)
    await store.admit(data, name="second.png")  # idempotent: the record is not rewritten
    async with store_backend.reading_forbidden():
        meta = await store.stat(stored.id)
    assert meta is not None
    assert (meta.id, meta.media_type, meta.bytes, meta.width, meta.height, meta.name) == (
        stored.id, "image/png", len(data), 4, 3, name)
    assert started - 1 <= meta.created_at <= time.time() + 1
    await store_backend.corrupt(stored.id, b"corrupt but present")
    assert await store.stat(stored.id) == meta  # stat describes; only read_image verifies
    assert await store.stat(ref_id(b"never admitted")) is None
    await store.delete(stored.id)
    assert await store.stat(stored.id) is None


async def test_delete(store_backend: StoreBackend) -> None:
    store = store_backend.store
    stored = await store.admit(make_image(color=40))
    other = await store.admit(make_image(color=41))
    assert await store.delete(stored.id) is True
    await expect_code(store, stored.id, NOT_FOUND)
    assert await store.stat(stored.id) is None
    assert await store_backend.stored() == store_backend.objects_of(other.id)  # nothing of it is left
    assert await store.delete(stored.id) is False
    assert await store.read_image(other.id) == other


# -- listing ---------------------------------------------------------------------------------------


async def test_list_admitted_pages_in_id_order_and_reads_no_bytes(store_backend: StoreBackend) -> None:
    store = store_backend.store
    admitted = {}
    for color in range(5):
        image = await store.admit(make_image(color=150 + color), name=f"shot-{color}.png")
        admitted[image.id] = f"shot-{color}.png"
    ids = sorted(admitted)
    async with store_backend.reading_forbidden():
        everything = await store.list_admitted()
        first = await store.list_admitted(limit=2)
        second = await store.list_admitted(after=first[-1].id, limit=2)
        rest = await store.list_admitted(after=second[-1].id, limit=2)
        after_last = await store.list_admitted(after=ids[-1])
        none = await store.list_admitted(limit=0)
    assert [m.id for m in everything] == ids
    assert [(m.name, m.media_type, m.width, m.height) for m in everything] == [
        (admitted[i], "image/png", 4, 3) for i in ids]
    assert everything == [await store.stat(i) for i in ids]
    assert [m.id for m in first + second + rest] == ids and len(rest) == 1
    assert after_last == [] and none == []
    # ``after`` need not be an admitted id: a page starts after it wherever it falls
    middle = "sha256:" + hex_of(ids[2])[:-1] + ("0" if hex_of(ids[2])[-1] != "0" else "1")
    assert [m.id for m in await store.list_admitted(after=middle)] == [i for i in ids if i > middle]


async def test_list_admitted_skips_what_is_gone_or_has_no_record(store_backend: StoreBackend) -> None:
    store = store_backend.store
    kept = await store.admit(make_image(color=160))
    deleted = await store.admit(make_image(color=161))
    unrecorded = await store.admit(make_image(color=162))
    await store.delete(deleted.id)
    repairable = store_backend.REPAIRABLE
    await store_backend.damage(unrecorded.id, repairable.get("record-missing") or repairable["metadata-missing"])
    await store.put_blob(b"recorded body")  # blobs are not attachments
    assert [m.id for m in await store.list_admitted()] == [kept.id]


async def test_list_admitted_is_bounded_and_checks_the_cursor(
    store_backend: StoreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_backend.store
    ids = sorted([(await store.admit(make_image(color=170 + i))).id for i in range(3)])
    for module in (fsstore, s3store):
        monkeypatch.setattr(module, "LIST_MAX", 2)
    assert [m.id for m in await store.list_admitted(limit=100)] == ids[:2]  # never more than LIST_MAX
    assert [m.id for m in await store.list_admitted(limit=-5)] == []
    with pytest.raises(AttachmentError) as bad:
        await store.list_admitted(after="../../etc")
    assert bad.value.code == INVALID_REF
