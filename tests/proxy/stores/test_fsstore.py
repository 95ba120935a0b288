"""Filesystem store: layout, atomic idempotent admission, fsync order, OS faults, invalid ids, and the
worker thread. What every store must do (round trip, limits, repair, classification, stat, delete) is
in the contract suite, ``test_store_contract.py``, which runs on this backend too."""

from __future__ import annotations

import asyncio
import time
import builtins
import contextlib
import errno
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest

from projectionist.policy.errors import AttachmentError, Unavailable
from projectionist.policy.ports import AttachmentStore
from projectionist.proxy.config import LanesConfig
from projectionist.proxy.stores import filesystem as fsstore, verify as verifying
from projectionist.proxy.stores.admission import header_info
from projectionist.proxy.stores.filesystem import FilesystemStore
from tests.imaging import FORMATS, make_image, ref_id

NOT_FOUND, CORRUPT, READ_FAILED, INVALID_REF = (
    "ATTACHMENT_NOT_FOUND",
    "ATTACHMENT_CORRUPT",
    "ATTACHMENT_READ_FAILED",
    "INVALID_ATTACHMENT_REF",
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FilesystemStore]:
    s = FilesystemStore(tmp_path / "store")
    yield s
    await s.close()


def obj_paths(store: FilesystemStore, attachment_id: str) -> tuple[Path, Path]:
    hex_digest = attachment_id.removeprefix("sha256:")
    directory = store.root / "objects" / hex_digest[:2]
    return directory / hex_digest, directory / f"{hex_digest}.json"


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


async def expect_code(store: FilesystemStore, attachment_id: str, code: str) -> AttachmentError:
    with pytest.raises(AttachmentError) as info:
        await store.read_image(attachment_id)
    assert info.value.code == code
    return info.value


# -- admission and layout -------------------------------------------------------------------------


def test_is_an_attachment_store(tmp_path: Path) -> None:
    s: AttachmentStore = FilesystemStore(tmp_path)  # mypy checks the Protocol
    assert callable(s.read_image)
    assert (tmp_path / "objects").is_dir()


async def test_layout_names_objects_by_full_digest(store: FilesystemStore) -> None:
    data = make_image()
    stored = await store.admit(data)
    hex_digest = stored.id.removeprefix("sha256:")
    assert len(hex_digest) == 64
    assert all_files(store.root) == [
        f"objects/{hex_digest[:2]}/{hex_digest}",
        f"objects/{hex_digest[:2]}/{hex_digest}.json",
    ]
    data_path, record_path = obj_paths(store, stored.id)
    assert data_path.read_bytes() == data
    record = msgspec.json.decode(record_path.read_bytes())
    assert abs(record.pop("created_at") - time.time()) < 60
    assert record == {"media_type": "image/png", "bytes": len(data), "width": 4, "height": 3}


async def test_publish_order_is_fsync_rename_then_directory_fsync(
    store: FilesystemStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make_image()
    data_path, record_path = obj_paths(store, ref_id(data))
    assert data_path.parent.is_dir()  # the store made every shard when it opened: the object's own steps
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def spy_replace(src: str, dst: str | Path) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    await store.admit(data)
    monkeypatch.undo()
    kinds = [(kind, Path(target).name.endswith(".tmp"), target) for kind, target in events]
    assert [(k, tmp) for k, tmp, _ in kinds] == [
        ("fsync", True),
        ("replace", False),
        ("fsync", True),
        ("replace", False),
        ("fsync", False),
    ]
    assert [t for k, _, t in kinds if k == "replace"] == [str(record_path), str(data_path)]
    assert kinds[-1][2] == str(data_path.parent)


async def test_no_temp_files_left_behind(store: FilesystemStore) -> None:
    ids = [(await store.admit(make_image(color=c, media_type=t))).id for c in range(3) for t in FORMATS]
    await store.admit(make_image(color=0))  # idempotent repeat
    names = {p.name for p in (store.root / "objects").rglob("*")}
    expected = {i.removeprefix("sha256:") for i in ids}
    expected |= {h + ".json" for h in expected} | {f"{i:02x}" for i in range(256)}  # the shards, made at open
    assert names == expected
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")]


async def test_second_admit_writes_nothing(store: FilesystemStore, monkeypatch: pytest.MonkeyPatch) -> None:
    data = make_image(media_type="image/webp")
    first = await store.admit(data)
    paths = obj_paths(store, first.id)
    before = [(os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths]
    dir_before = os.stat(paths[0].parent).st_mtime_ns

    def no_write(*args: object) -> None:
        raise AssertionError("an existing valid object must not be rewritten")

    monkeypatch.setattr(fsstore, "_write_atomic", no_write)
    second = await store.admit(data, "image/webp")
    assert second == first
    assert [(os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths] == before
    assert os.stat(paths[0].parent).st_mtime_ns == dir_before


async def test_write_failure_is_503_and_leaves_no_temp_file(
    store: FilesystemStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    data = make_image()
    with pytest.raises(Unavailable) as info:
        await store.admit(data)
    assert info.value.code == "ATTACHMENT_WRITE_FAILED"
    assert info.value.status == 503
    assert "ENOSPC" in info.value.message
    assert all_files(store.root) == []
    monkeypatch.undo()
    await expect_code(store, ref_id(data), NOT_FOUND)


# -- repair by re-admission -----------------------------------------------------------------------


async def test_readmission_over_directory_fails_cleanly(store: FilesystemStore) -> None:
    data = make_image()
    data_path, _ = obj_paths(store, ref_id(data))
    data_path.mkdir(parents=True)
    with pytest.raises(Unavailable) as info:
        await store.admit(data)
    assert info.value.code == "ATTACHMENT_WRITE_FAILED"
    assert not [p for p in data_path.parent.iterdir() if p.name.endswith(".tmp")]


# -- read classification --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(OSError(errno.EIO, "Input/output error"), id="EIO"),
        pytest.param(PermissionError(errno.EACCES, "Permission denied"), id="EACCES"),
        pytest.param(OSError(errno.ESTALE, "Stale file handle"), id="ESTALE"),
    ],
)
@pytest.mark.parametrize("which", ["data", "record"])
async def test_os_faults_are_read_failed(
    store: FilesystemStore, monkeypatch: pytest.MonkeyPatch, exc: OSError, which: str
) -> None:
    data = make_image()
    stored = await store.admit(data)
    real = fsstore._read_file

    def faulty(path: Path) -> bytes:
        if (path.suffix == ".json") == (which == "record"):
            raise exc
        return real(path)

    monkeypatch.setattr(fsstore, "_read_file", faulty)
    err = await expect_code(store, stored.id, READ_FAILED)
    assert err.status == 503 and err.retryable
    assert errno.errorcode[exc.errno] in err.message  # type: ignore[index]


async def test_directory_at_object_path_is_read_failed(store: FilesystemStore) -> None:
    data = make_image()
    stored = await store.admit(data)
    data_path, _ = obj_paths(store, stored.id)
    data_path.unlink()
    data_path.mkdir()
    err = await expect_code(store, stored.id, READ_FAILED)
    assert "EISDIR" in err.message


async def test_file_at_fanout_directory_is_read_failed(store: FilesystemStore) -> None:
    attachment_id = ref_id(make_image())
    data_path, _ = obj_paths(store, attachment_id)
    data_path.parent.rmdir()
    data_path.parent.write_bytes(b"")  # objects/<hex[:2]> is a file: ENOTDIR
    err = await expect_code(store, attachment_id, READ_FAILED)
    assert "ENOTDIR" in err.message


# -- invalid ids never touch the filesystem --------------------------------------------------------


BAD_IDS = [
    "sha256:../../etc/passwd",
    "sha256:" + "../" * 20 + "etc/passwd" + "a" * 4,
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
async def test_invalid_ids_are_refused_before_any_filesystem_access(
    store: FilesystemStore, monkeypatch: pytest.MonkeyPatch, bad_id: str
) -> None:
    touched: list[str] = []

    def forbidden(name: str) -> Callable[..., object]:
        def fail(*args: object, **kwargs: object) -> object:
            touched.append(name)
            raise AssertionError(f"{name} called for an invalid id")

        return fail

    for op in ("read_image", "delete"):
        with monkeypatch.context() as m:
            m.setattr(fsstore, "_read_file", forbidden("_read_file"))
            m.setattr(builtins, "open", forbidden("open"))
            for name in ("open", "stat", "lstat", "unlink", "listdir", "scandir", "mkdir"):
                m.setattr(os, name, forbidden(f"os.{name}"))
            for lane in store.lanes:
                m.setattr(lane, "run", forbidden(f"lane {lane.name}"))
            with pytest.raises(AttachmentError) as info:
                await getattr(store, op)(bad_id)
        assert info.value.code == INVALID_REF
        assert info.value.status == 400
    assert touched == []


# -- off the event loop, timeouts, cancellation ----------------------------------------------------


async def test_whole_verified_read_runs_in_one_worker_thread(
    store: FilesystemStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = await store.admit(make_image())
    threads: list[tuple[str, threading.Thread]] = []
    real_read, real_header = fsstore._read_file, header_info

    def spy_read(path: Path) -> bytes:
        threads.append(("read", threading.current_thread()))
        return real_read(path)

    def spy_header(data: bytes) -> object:
        threads.append(("header", threading.current_thread()))
        return real_header(data)

    monkeypatch.setattr(fsstore, "_read_file", spy_read)
    monkeypatch.setattr(verifying, "header_info", spy_header)  # the one verify() parses the header
    assert await store.read_image(stored.id) == stored
    assert [kind for kind, _ in threads] == ["read", "read", "header"]
    workers = {t for _, t in threads}
    assert len(workers) == 1
    (worker,) = workers
    assert worker is not threading.main_thread()
    assert worker is not threading.current_thread()
    assert worker.name.startswith("lane-reads")


class Gate:
    """Blocks ``_read_file`` in its worker thread until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        real = fsstore._read_file

        def slow(path: Path) -> bytes:
            self.entered.set()
            self.release.wait(10)
            return real(path)

        monkeypatch.setattr(fsstore, "_read_file", slow)

    async def wait_entered(self) -> None:
        for _ in range(500):
            if self.entered.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("read never started")


async def test_slow_read_times_out_as_read_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = FilesystemStore(tmp_path, read_timeout=0.05)
    try:
        stored = await s.admit(make_image())
        gate = Gate(monkeypatch)
        loop = asyncio.get_running_loop()
        started = loop.time()
        err = await expect_code(s, stored.id, READ_FAILED)
        assert loop.time() - started < 5
        assert gate.entered.is_set()
        assert "timed out" in err.message
        assert err.retryable
        gate.release.set()
    finally:
        await s.close()


@pytest.mark.parametrize("read_timeout", [None, 30.0])
async def test_cancelling_a_slow_read_propagates_cancellation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_timeout: float | None
) -> None:
    s = FilesystemStore(tmp_path, read_timeout=read_timeout)
    try:
        stored = await s.admit(make_image())
        gate = Gate(monkeypatch)
        task = asyncio.create_task(s.read_image(stored.id))
        await gate.wait_entered()
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        gate.release.set()
    finally:
        await s.close()


async def test_event_loop_keeps_running_during_a_slow_read(
    store: FilesystemStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = await store.admit(make_image())
    gate = Gate(monkeypatch)
    task = asyncio.create_task(store.read_image(stored.id))
    await gate.wait_entered()  # the loop ticks (asyncio.sleep) while the read blocks
    ticks = 0
    for _ in range(5):
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 5 and not task.done()
    gate.release.set()
    assert await task == stored


# -- delete ----------------------------------------------------------------------------------------


async def test_delete_removes_orphan_record(store: FilesystemStore) -> None:
    stored = await store.admit(make_image())
    data_path, record_path = obj_paths(store, stored.id)
    data_path.unlink()
    assert await store.delete(stored.id) is True
    assert not record_path.exists()


async def test_closed_store_refuses_work(tmp_path: Path) -> None:
    s = FilesystemStore(tmp_path)
    stored = await s.admit(make_image())
    await s.close()
    with pytest.raises(RuntimeError):
        await s.read_image(stored.id)



async def test_a_hung_listing_costs_the_listing_alone(tmp_path: Path) -> None:
    # files.list walks admission records: one that hangs (a FIFO nobody writes, as a hung disk
    # would) held a stamps-lane thread per listing, so a client that listed a few times took
    # the lane, and with it stats, the cache's stamp checks and readiness, down for every object.
    store = FilesystemStore(tmp_path / "store", lanes=LanesConfig(stamps=2, stamp_timeout=0.3, queue_timeout=0.2))
    try:
        hung = (await store.admit(make_image(10, 10, color=1), "image/png", name="a.png")).id
        good = (await store.admit(make_image(10, 14, color=3), "image/png", name="c.png")).id
        record = obj_paths(store, hung)[1]
        record.unlink()
        os.mkfifo(record)
        for _ in range(4):
            with pytest.raises(Unavailable):
                await store.list_admitted()
        assert store.stamp_lane.stuck == 0
        assert await store.stat(good) is not None and await store.stamps([good]) != [None]
        await store.ping()
    finally:
        with contextlib.suppress(OSError):
            os.close(os.open(record, os.O_WRONLY | os.O_NONBLOCK))
        await store.close()
