"""Lanes: bounded, isolated capacity for one kind of blocking work (proxy layer).

A disk or a network file system that hangs instead of failing must cost one kind of work its
capacity and nothing else. Each ``Lane`` (the store's verified reads, stamp checks and writes;
the SQLite log's reads and writes) has its own daemon threads, at most ``size`` calls in it at
once, and these rules:

- a call waits at most ``queue_timeout`` for room; if none frees up it raises its lane's
  ``busy`` error (``STORE_BUSY`` for the store, 503): it never started, so it is no fact about
  the object it was for;
- a call that has its place gets its ``timeout``, counted from then (never from when it was
  queued: a place always has a thread free, so the call starts at once), then the caller gets
  ``TimeoutError``;
- a timed-out or abandoned call keeps its thread, still blocked in the OS. Such stuck threads are
  counted (``stuck``); up to ``stuck_max`` of them give their place back and a new thread takes
  it, so what hangs costs only itself: k hung objects hold k threads, and the lane's ``size``
  places stay for the calls that work. Past ``stuck_max`` a stuck call keeps its place (a disk
  that hangs everything fills the lane, and calls are then ``busy``, never unbounded threads);
- a call still running after ``slow_after`` seconds (a healthy read takes milliseconds) gives
  its place back the same way while its caller goes on waiting for it, within ``stuck_max``: so
  a request whose eight images all hang does not fill an eight-place lane for everyone until
  their ``timeout``;
- a call with a ``key`` (the object and the kind of read) whose earlier call is still stuck
  never takes a place: it joins that call, waiting for its outcome up to its own ``timeout``
  from its own start (a hung object holds one thread, however many ask for it; a caller that
  gives up on it is no failed read, and the next one waits its own full time before it is). A
  request (``WAITER``: set once per request) that already waited a full ``timeout`` on that
  very call is not made to wait again: its immediate retry fails at once;
- the threads are daemons: a process asked to stop never waits for a blocked ``open``/``read``.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from ..policy.errors import Code, Unavailable

_T = TypeVar("_T")


#: The request a lane call is made for (an object that can be weakly referred to, set once per
#: request; the tasks it starts inherit it): a request that waited out a stuck call's timeout once never waits for it again.
WAITER: contextvars.ContextVar[object | None] = contextvars.ContextVar("lane_waiter", default=None)


class Busy(Unavailable):
    """No room in a lane within its queue timeout: retry later; nothing was read or decided."""

    default_code = Code.STORE_BUSY


class _Job(Generic[_T]):
    __slots__ = ("fn", "loop", "started", "done", "abandoned", "freed", "key", "slow", "waited_out")

    def __init__(self, fn: Callable[[], _T], loop: asyncio.AbstractEventLoop, key: str | None = None) -> None:
        self.fn = fn
        self.loop = loop
        #: Set by the thread as it picks the call up (no wake-up of the loop for it).
        self.started = False
        self.done: asyncio.Future[_T] = loop.create_future()
        self.abandoned = False
        self.freed = False  # stuck, and its place given back (a new thread took it)
        self.key = key
        self.slow = False  # still running past ``slow_after``: counted in ``stuck``
        #: The requests (``WAITER``) that waited a full timeout on this call (weakly: a request
        #: that ended is forgotten, never mistaken for a later one).
        self.waited_out: weakref.WeakSet[Any] = weakref.WeakSet()


class Lane:
    """``size`` daemon threads for one kind of blocking work (see the module docstring)."""

    def __init__(self, name: str, size: int, timeout: float | None, queue_timeout: float,
                 busy: Callable[[str], Exception] | None = None, stuck_max: int | None = None,
                 slow_after: float | None = None) -> None:
        if size < 1:
            raise ValueError("a lane needs at least one thread")
        self.name = name
        self._busy = busy or _store_busy
        self.size = size
        self.timeout = timeout
        self.queue_timeout = queue_timeout
        self.stuck = 0
        self.stuck_max = 4 * size if stuck_max is None else stuck_max
        self.slow_after = slow_after
        #: The stuck call of each key, which later calls of that key join.
        self._stuck_keys: dict[str, _Job[Any]] = {}
        self.busy = 0
        self._room = asyncio.Semaphore(size)
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False

    @property
    def in_use(self) -> int:
        return self.size - self._room._value  # noqa: SLF001 (asyncio exposes no public reading)

    async def run(self, fn: Callable[[], _T], *, timeout: float | None = None, key: str | None = None) -> _T:
        """Run ``fn`` on one of the lane's threads; see the module docstring for the rules."""
        if self._closed:
            raise RuntimeError(f"lane {self.name!r} is closed")
        if key is not None:
            stuck = self._stuck_keys.get(key)
            if stuck is not None:
                return await self._join(stuck, timeout)
        if self._room.locked():  # (a free place is taken at once, without a task to wait in)
            try:
                await asyncio.wait_for(self._room.acquire(), self.queue_timeout)
            except TimeoutError:
                self.busy += 1
                raise self._busy(f"the {self.name} lane is full ({self.size} calls in it, {self.stuck} stuck)") from None
        else:
            await self._room.acquire()
        loop = asyncio.get_running_loop()
        job: _Job[_T] = _Job(fn, loop, key)
        self.start()
        self._jobs.put(job)  # a thread is free for every place: it starts now
        slow: asyncio.TimerHandle | None = None
        try:
            if self.slow_after is not None:
                slow = loop.call_later(self.slow_after, self._slow, job)
            limit = self.timeout if timeout is None else timeout
            if limit is None:
                return await asyncio.shield(job.done)
            async with asyncio.timeout_at(loop.time() + limit):
                # shielded: a caller that leaves does not cancel the outcome a later caller may join
                return await asyncio.shield(job.done)
        except BaseException as exc:
            if isinstance(exc, TimeoutError):
                _waited_out(job)
            if not job.done.done() or job.done.cancelled():  # timed out or cancelled: the thread keeps its place
                job.abandoned = True
                if not job.slow:  # a slow call is counted already
                    self.stuck += 1
                if job.started:  # blocked in the OS, not merely queued
                    self._stuck(job)
            raise
        finally:
            if slow is not None:
                slow.cancel()

    async def _join(self, job: _Job[_T], timeout: float | None) -> _T:
        """Wait for a stuck call's outcome, for at most this caller's own ``timeout`` (at once
        when this caller's request waited it out already)."""
        waiter = WAITER.get()
        if waiter is not None and waiter in job.waited_out:
            raise TimeoutError(f"the {self.name} lane's call for this object ran past its timeout")
        limit = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                return await asyncio.shield(job.done)
        except TimeoutError:
            _waited_out(job)
            raise TimeoutError(f"the {self.name} lane's call for this object ran past its timeout") from None

    def _slow(self, job: _Job[Any]) -> None:
        """A call still running after ``slow_after``: within ``stuck_max``, its place goes back
        (as a stuck call's does) while its caller keeps waiting."""
        if job.done.done() or job.freed or job.abandoned or self._closed or self.stuck >= self.stuck_max:
            return
        job.slow = True
        self.stuck += 1
        self._give_back(job)

    def start(self) -> None:
        """One thread per place, started on first use (so no call ever waits for a thread), or
        before it, by a backend's start-up (so no first request pays for them either)."""
        while len(self._threads) < self.size:
            thread = threading.Thread(target=self._work, name=f"lane-{self.name}-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        result: Any = None
        while (job := self._jobs.get()) is not None:
            if job.abandoned:  # its caller left before it started: nothing to do
                _tell(job.loop, self._finish, job, None, None)
            else:
                job.started = True
                try:
                    result = job.fn()
                except BaseException as exc:  # delivered to the caller, whatever it is
                    _tell(job.loop, self._finish, job, None, exc)
                else:
                    _tell(job.loop, self._finish, job, result, None)
            # an idle thread holds nothing: not the call (what it was given) nor what it gave back
            job.fn = _ran
            del job
            result = None

    def _stuck(self, job: _Job[Any]) -> None:
        """A started call that its caller left: remember its object; within ``stuck_max``, give
        its place back and start a thread to stand for the blocked one."""
        if job.key is not None:
            self._stuck_keys.setdefault(job.key, job)
        if not job.freed and self.stuck <= self.stuck_max and not self._closed:
            self._give_back(job)

    def _give_back(self, job: _Job[Any]) -> None:
        job.freed = True
        self._room.release()
        thread = threading.Thread(target=self._work, name=f"lane-{self.name}-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _finish(self, job: _Job[Any], result: Any, error: BaseException | None) -> None:
        if job.abandoned or job.slow:
            self.stuck -= 1
            if job.key is not None and self._stuck_keys.get(job.key) is job:
                del self._stuck_keys[job.key]
        if not job.done.done():
            if error is not None:
                job.done.set_exception(error)
                if job.abandoned:
                    job.done.exception()  # retrieved: whoever joins it still gets it
            else:
                job.done.set_result(result)
        if job.freed:  # its place was given back when it got stuck; one thread too many now
            self._jobs.put(None)
        else:
            self._room.release()

    def close(self) -> None:
        """Stop the idle threads; a thread blocked in the OS is a daemon and does not hold the process."""
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)


def _ran() -> Any:
    """A job's ``fn`` once its thread ran it (the call and what it held are let go of)."""
    raise RuntimeError("a lane job runs once")


def _waited_out(job: _Job[Any]) -> None:
    """The request of the caller at hand waited a full timeout on ``job``."""
    waiter = WAITER.get()
    if waiter is not None:
        job.waited_out.add(waiter)


def _store_busy(message: str) -> Exception:
    return Busy(message, code=Code.STORE_BUSY)


def _tell(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    """Hand a result back to the loop; a thread that comes back after its loop closed (it was
    stuck past the end of the process's serving) just drops it."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


class AsyncLane:
    """The same rules for a store whose I/O is async (S3): at most ``size`` calls at once (its
    connection pool holds that many, so a started call never waits for a connection), room waited
    for at most ``queue_timeout`` (else ``Busy``), ``timeout`` counted once the call has its place."""

    def __init__(self, name: str, size: int, timeout: float | None, queue_timeout: float) -> None:
        self.name = name
        self.size = size
        self.timeout = timeout
        self.queue_timeout = queue_timeout
        self.busy = 0
        self.stuck = 0  # an async call cannot block a thread: cancelling it frees its place
        self._room = asyncio.Semaphore(size)

    async def run(self, call: Callable[[], Awaitable[_T]], *, timeout: float | None = None) -> _T:
        try:
            await asyncio.wait_for(self._room.acquire(), self.queue_timeout)
        except TimeoutError:
            self.busy += 1
            raise Busy(f"the store's {self.name} lane is full ({self.size} calls in it)", code=Code.STORE_BUSY) from None
        try:
            async with asyncio.timeout(self.timeout if timeout is None else timeout):
                return await call()
        finally:
            self._room.release()
