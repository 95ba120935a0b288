"""Lanes: bounded, isolated capacity for blocking store work, with timeouts that count from the
start of the I/O and stuck threads that are counted and capped (``proxy/stores/lanes.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path

import pytest

from projectionist.policy.errors import AttachmentError
from projectionist.proxy.config import LanesConfig
from projectionist.proxy.stores.filesystem import FilesystemStore
from projectionist.proxy.lanes import Busy, Lane
from tests.imaging import make_image


class Blocker:
    """A blocking call that holds its thread until released (a hung ``read``)."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        self.entered.release()
        self.release.wait(30)
        return "late"

    async def wait_entered(self, n: int = 1) -> None:
        for _ in range(n):
            assert await asyncio.to_thread(self.entered.acquire, True, 10), "the call never started"


async def test_a_full_lane_refuses_with_busy_not_a_timeout() -> None:
    lane = Lane("reads", 2, timeout=0.2, queue_timeout=0.2, stuck_max=0)  # stuck calls keep their places
    hung = Blocker()
    try:
        calls = [asyncio.create_task(lane.run(hung)) for _ in range(2)]
        await hung.wait_entered(2)
        with pytest.raises(Busy) as refused:
            await lane.run(lambda: "never runs")
        assert refused.value.code == "STORE_BUSY" and refused.value.status == 503 and refused.value.retryable
        for call in calls:  # the hung calls themselves time out: their I/O started
            with pytest.raises(TimeoutError):
                await call
        assert lane.stuck == 2 and lane.busy == 1
        with pytest.raises(Busy):  # stuck threads keep their places: capacity stays taken
            await lane.run(lambda: "never runs")
    finally:
        hung.release.set()
    for _ in range(100):  # the threads come back: their places are free again
        if lane.stuck == 0:
            break
        await asyncio.sleep(0.02)
    assert lane.stuck == 0 and await lane.run(lambda: "ok") == "ok"
    lane.close()


async def test_the_timeout_counts_from_the_start_of_the_io_not_from_the_queue() -> None:
    lane = Lane("reads", 1, timeout=0.4, queue_timeout=5.0)
    first = Blocker()
    ahead = asyncio.create_task(lane.run(first, timeout=10.0))
    await first.wait_entered()
    queued = asyncio.create_task(lane.run(lambda: "read"))
    await asyncio.sleep(0.6)  # longer than the timeout, spent waiting for room
    assert not queued.done()
    first.release.set()
    assert await ahead == "late"
    assert await queued == "read"  # it had its full 0.4 s once it started
    lane.close()


async def test_a_call_whose_caller_left_before_it_started_never_runs() -> None:
    lane = Lane("reads", 1, timeout=None, queue_timeout=5.0)
    first = Blocker()
    ahead = asyncio.create_task(lane.run(first))
    await first.wait_entered()
    ran: list[str] = []
    queued = asyncio.create_task(lane.run(lambda: ran.append("ran") or "x"))
    await asyncio.sleep(0.05)
    queued.cancel()
    first.release.set()
    await ahead
    await asyncio.sleep(0.1)
    assert ran == [] and lane.stuck == 0 and await lane.run(lambda: "free") == "free"
    lane.close()


async def test_what_hangs_costs_only_itself_up_to_stuck_max() -> None:
    lane = Lane("reads", 2, timeout=0.2, queue_timeout=0.3, stuck_max=3)
    hung = Blocker()
    try:
        for key in ("a", "b", "c"):  # three objects whose reads hang: each times out, its thread stuck
            with pytest.raises(TimeoutError):
                await lane.run(hung, key=key)
        assert lane.stuck == 3 and lane.in_use == 0
        assert [await lane.run(lambda: n) for n in range(4)] == [0, 1, 2, 3]  # both places still work
        with pytest.raises(TimeoutError):  # a retry of a stuck object joins it for its own timeout: no thread
            await lane.run(lambda: "never runs", key="b")
        assert hung.calls == 3
        with pytest.raises(TimeoutError):  # a fourth: past stuck_max it keeps its place
            await lane.run(hung, key="d")
        assert lane.stuck == 4 and lane.in_use == 1
    finally:
        hung.release.set()
    for _ in range(100):  # the threads come back: keys forgotten, places and thread count as before
        if lane.stuck == 0:
            break
        await asyncio.sleep(0.02)
    assert lane.stuck == 0 and lane.in_use == 0 and await lane.run(lambda: "ok", key="b") == "ok"
    await asyncio.sleep(0.1)
    assert sum(t.is_alive() for t in lane._threads) == 2
    lane.close()


def test_lane_threads_never_hold_the_process() -> None:
    lane = Lane("reads", 3, timeout=None, queue_timeout=1.0)
    lane.start()
    assert len(lane._threads) == 3 and all(t.daemon for t in lane._threads)
    lane.close()


def hang_with_a_fifo(store: FilesystemStore, attachment_id: str) -> Path:
    """Replace an object's bytes by a FIFO: opening it for reading blocks until a writer comes."""
    data_path = store._paths(attachment_id[len("sha256:"):])[0]
    data_path.unlink()
    os.mkfifo(data_path)
    return data_path


def unhang(fifo: Path) -> None:
    """Let a reader blocked on ``fifo`` go (it reads end-of-file)."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


async def test_hung_reads_take_nothing_from_stamp_checks_and_writes(tmp_path: Path) -> None:
    """Every read place hung on a FIFO: a healthy object's read is refused (Busy, never
    READ_FAILED), while stamp checks, stats and admission go on in their own lanes."""
    store = FilesystemStore(tmp_path, read_timeout=30.0,
                            lanes=LanesConfig(reads=2, stamps=2, writes=2, queue_timeout=0.2))
    healthy = await store.admit(make_image(color=1))
    stuck = [await store.admit(make_image(color=c)) for c in (2, 3)]
    fifos = [hang_with_a_fifo(store, image.id) for image in stuck]
    readers = [asyncio.create_task(store.read_image(image.id)) for image in stuck]
    try:
        for _ in range(200):
            if store.reads.in_use == 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert not any(r.done() for r in readers)
        with pytest.raises(Busy):
            await store.read_image(healthy.id)
        assert await store.stamps([healthy.id]) != [None]
        assert await store.stat(healthy.id) is not None
        assert (await store.admit(make_image(color=4))).width == 4
        assert not any(r.done() for r in readers)
    finally:
        for fifo in fifos:
            unhang(fifo)
    for reader in readers:  # the FIFO gave end-of-file: bytes that do not match the digest
        with pytest.raises(AttachmentError) as failed:
            await reader
        assert failed.value.code == "ATTACHMENT_CORRUPT"
    await store.close()


async def test_a_cancelled_caller_of_a_running_call_frees_its_place_when_the_call_returns() -> None:
    """The caller awaits the call's own future (no shield): cancelling the caller cancels that
    future, and the call's late result or error is dropped, with its place counted stuck until then."""
    lane = Lane("reads", 1, timeout=None, queue_timeout=5.0, stuck_max=0)
    blocked = Blocker()
    caller = asyncio.create_task(lane.run(blocked))
    await blocked.wait_entered()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert lane.stuck == 1 and lane.in_use == 1  # stuck_max 0: it keeps its place while it hangs
    blocked.release.set()
    for _ in range(100):
        if lane.stuck == 0:
            break
        await asyncio.sleep(0.01)
    assert lane.stuck == 0 and lane.in_use == 0

    def fails() -> str:
        blocked.entered.release()
        raise OSError("late failure")

    blocked.release.clear()
    failing = asyncio.create_task(lane.run(fails))
    await asyncio.sleep(0)  # it may have finished already: either way its error goes nowhere
    failing.cancel()
    with contextlib.suppress(asyncio.CancelledError, OSError):
        await failing
    assert await lane.run(lambda: "free") == "free"
    lane.close()


async def test_a_call_of_a_stuck_object_joins_it_for_its_own_time() -> None:
    """A caller that leaves a hung call (cancelled) is no failure of it; the next caller of that
    object joins the call still blocked and gets its outcome when it comes within the joiner's
    own timeout, counted from the joiner's start; no second thread ever runs for it."""
    lane = Lane("reads", 2, timeout=0.5, queue_timeout=0.3)
    hung = Blocker()
    first = asyncio.create_task(lane.run(hung, key="a"))
    await hung.wait_entered()
    first.cancel()  # the client gave up
    await asyncio.gather(first, return_exceptions=True)
    assert lane.stuck == 1
    loop = asyncio.get_running_loop()
    joined = asyncio.create_task(lane.run(lambda: "never runs", key="a"))
    await asyncio.sleep(0.3)
    assert not joined.done()  # waiting, not failed at once
    loop.call_later(0.1, hung.release.set)  # the read comes back within the joiner's 0.5 s
    assert await joined == "late"
    assert hung.calls == 1
    hung.release.clear()
    timed = asyncio.create_task(lane.run(hung, key="b"))
    with pytest.raises(TimeoutError):
        await timed  # a hung read runs out of time: the caller's own timeout
    started = loop.time()
    with pytest.raises(TimeoutError):
        await lane.run(lambda: "never runs", key="b")
    assert loop.time() - started >= 0.45 and hung.calls == 2  # its own full timeout, then a failure
    hung.release.set()
    lane.close()
