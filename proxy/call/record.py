"""Traffic recording: what each proxied call sent and got, in the session log (proxy layer).

For a request with a session and ``record.mode`` other than ``off``:

- a ``request/recorded`` event: route, adapter, upstream, the digest of the inbound body, the
  digest of the projected body, every reference with its path and outcome, and, when a projection
  changed the body, the *shape* (short digests per top-level member and list item) that lets a
  replay name the first differing path (a body sent unchanged needs none: replay takes it from the
  inbound body it holds); in ``full`` mode the inbound body is stored as a blob;
- after the response, its outcome: status, latency, usage; in ``full`` mode the response body
  (for SSE the concatenated stream) as a blob. The writer batches records, so a call that ends
  before its request record is written (nearly every one) is one row: the outcome rides in the
  request record (``response``). A call still running then gets a ``response/recorded`` event.

What a request record says of the body (its projected digest, reference paths, shape) comes
from ``describe``, computed on the very tree that became the upstream body; the digest of a body
sent as it came is taken out of the request's wait: a whole call's record holds the body until
the writer's digests lane hashes a batch of them on its own thread, hot (one at a time on the
event loop, cold, they cost several times as much). Records are
appended non-durably (ordered in the log, flushed with the next durable append) and never hold
keys, tokens or attachment base64 (of the headers a call sent, only ``recordable_headers``).

A call's request path makes no record: its end makes its record (a whole call, nearly every one)
as one compact tuple, while what it says is still at hand, and a batch holds only those: a few
hundred bytes a call (and a body sent as it came, until its digest is taken), not the headers and
recorder the call held (held for a batch, those crowded the caches that every call runs in).
Whole calls in ``metadata`` mode go to the log as one ``CallRecords`` per session
(``SessionLog.append_calls``): what they share once, each call's fields with no names, which
SQLite stores as one short row.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from functools import partial
from typing import Any, Final

import msgspec
from multidict import CIMultiDict

from ...adapters.base import WireFormat
from ...adapters.responses import reported
from ...policy.errors import ProjectionistError
from ...policy.events import CallRecords, CallRow, Common, RequestRecorded, ResponseRecorded
from ...policy.projection import Projection
from ...policy.ports import SessionLog
from ..lanes import Lane
from ..observe.logger import get_logger
from ..observe.metrics import Metrics
from ..stores.base import Store
from .describe import UNHASHED, Described, of_unchanged, sha256_id
from .outgoing import recordable_headers

_decoder: Final = msgspec.json.Decoder()
#: Metadata mode keeps this much of a response, to find its usage.
USAGE_SCAN_BYTES: Final = 1024 * 1024
#: Bytes of request bodies the calls in flight (and request records queued alone) may hold to hash
#: once out of the request's wait (``Recording.start``): past it, a call's digest is taken before
#: it is sent. A long call (a stream) holds its body until it ends.
UNHASHED_MAX_BYTES: Final = 4 * 1024 * 1024
#: Bytes of bodies the whole calls' records queued may hold for the writer's digests lane to hash
#: (``Recording._made``): past it, a call's end hashes its body itself. Counted apart from the
#: calls in flight, so that bodies waiting for a batch never make a call hash on its request path.
QUEUED_BODIES_MAX_BYTES: Final = 4 * 1024 * 1024
#: A body larger than this is hashed before its call is sent, as holding it costs more than the
#: wait its hash adds.
UNHASHED_BODY_MAX: Final = 64 * 1024
#: Seconds the digests of a batch's bodies may take in their lane (and wait for room in it);
#: past that the writer takes them itself.
DIGEST_TIMEOUT: Final = 10.0


class Recording:
    """Where this app's records go, off the request path: a bounded queue that one writer drains
    into the session log in batches (and, in ``full`` mode, bodies into the store's blob area).

    Records are evidence, not state: a request never waits for one. The writer lets records
    gather for ``batch_wait`` seconds (less once ``batch`` are queued or someone drains), so
    light traffic also pays one transaction for many records rather than one per call. A record
    of a call that carried images waits ``image_wait`` at most (when that is shorter): a refusal's
    attribution, on any replica, counts what such calls proved an upstream accepts, and waits for
    one such window (``resend``); a record of a call without images proves nothing there. A
    record that holds bodies (``full`` mode) goes as soon, not to keep them in memory that long.
    A full queue, a log that is down or a blob that cannot be stored drops the record, logs it
    and counts it (``projectionist_records_dropped_total``); the call went on. ``drain`` waits
    until what is queued is written (the admin API calls it before reading, so an operator sees
    every record of the calls that finished before they asked).
    """

    def __init__(self, log: SessionLog, store: Store, mode: str, max_response_bytes: int, metrics: Metrics,
                 queue_size: int = 10_000, batch: int = 1024, *, batch_wait: float = 0.0,
                 image_wait: float | None = None, hold: float = 0.0) -> None:
        self.log = log
        self.store = store
        self.mode = mode
        self.full = mode == "full"
        self.max_response_bytes = max_response_bytes
        self.metrics = metrics
        self.queue_size = queue_size
        self.batch = batch
        self.batch_wait = batch_wait
        #: What a record to be written soon waits at most (never longer than ``batch_wait``); a
        #: refusal's attribution waits twice this for the other replicas' records (``resend``).
        self.image_wait = batch_wait if image_wait is None else min(image_wait, batch_wait)
        self.hold = hold
        #: Set while a record to be written soon (``_Pending.soon``) is queued and the batch it is in
        #: would wait longer than ``image_wait``: hurries the writer then (one timer a batch).
        self._soon_at: asyncio.TimerHandle | None = None
        #: Calls in flight whose request record is held back for their outcome (see ``start``),
        #: in the order they started, with the time each started (``perf_counter``): its hold runs
        #: out ``hold`` later; one timer (the sweep) releases those whose hold ran out, not one
        #: timer per call.
        self._held: dict[Recorder, float] = {}
        self._sweep_at: asyncio.TimerHandle | None = None
        #: What the writer is to write: whole calls (``_Whole``, nearly every one) and parts of
        #: calls (``_Pending``: a request record queued alone, or the response that follows it).
        self._queue: deque[_Whole | _Pending] = deque()
        #: Records queued since the queue was last empty that are part of a call (a request or a
        #: response alone, to be joined by the writer); while there are none, every record is a
        #: whole call and a batch is written as it is (``_append_whole``).
        self._parts = 0
        metrics.records_queue = self._queue
        #: Whether the writer was told of what is queued (it clears this when it takes a batch):
        #: a call's record is then one append, not two events set.
        self._told = False
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        #: Set when the writer should stop gathering: a full batch, a drain, shutdown.
        self._hurry: asyncio.Event | None = None
        self._draining = 0
        self._writer: asyncio.Task[None] | None = None
        #: Seqs of request records written lately, by request id (for the response records).
        self._seqs: OrderedDict[str, int] = OrderedDict()
        #: The sessions of the batch being written, and how many records the writer has taken
        #: from the queue so far (``settle`` waits on one session's records by the two).
        self._in_writing: set[str] = set()
        self._taken = 0
        #: Bytes of the bodies held to hash, from ``start`` until their call's end (which hashes
        #: them, or hands them to its record: ``_queued_bytes``), the writer (a request record
        #: queued alone: ``_Pending.unhashed``) or a drop of their record.
        self._unhashed_bytes = 0
        #: Whole calls' records queued with their body still to hash (``_made``), and its bytes.
        self._bodies = 0
        self._queued_bytes = 0
        #: Where the writer takes a batch's digests: one thread, off the event loop, where the
        #: hash runs hot, a batch at a time (taken one a call on the loop, cold, it cost several
        #: times as much); a body of 2 KB or more is hashed without the GIL.
        self._digests = Lane("record-digests", 1, DIGEST_TIMEOUT, DIGEST_TIMEOUT)
        #: The headers the last call sent, the recordable ones of them, and the last call's ``Common``
        #: (``_made``): consecutive calls nearly always share them.
        self._sent: tuple[tuple[str, str], ...] | None = None
        self._kept: tuple[tuple[str, str], ...] = ()
        #: The last headers ``sent_headers`` was given (a copy) and its answer for them.
        self._sent_as: CIMultiDict[str] | None = None
        self._sent_items: tuple[tuple[str, str], ...] = ()
        self._common: Common | None = None

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def start(self, call: CallInfo, raw: bytes, described: Described, projection: Projection | None) -> Recorder:
        """The ``request/recorded`` event of this call, never written in the request's own wait;
        the ``Recorder`` then watches the response.

        The record is held back until the call ends, for ``hold`` seconds at most: a call that
        ends by then is one row (its outcome in the request record), queued once; a longer call's
        request record is queued when the hold runs out and its outcome follows as a
        ``response/recorded`` event. With no hold the request record is queued now. A small body
        sent as it came (``UNHASHED``) is hashed out of the request's wait (by the writer's digests
        lane, nearly always), within ``UNHASHED_MAX_BYTES``."""
        full = self.full
        unhashed = None
        if described is UNHASHED:  # sent as it came: its digest is both, taken at the end (or now)
            if full or len(raw) > UNHASHED_BODY_MAX or self._unhashed_bytes + len(raw) > UNHASHED_MAX_BYTES:
                described = of_unchanged(raw)
            else:
                unhashed = raw
                self._unhashed_bytes += len(raw)
        # a body sent unchanged (nothing projected): its projected digest is its own (for one the
        # writer hashes, both are empty until it does)
        if projection is None:
            recorder = Recorder(self, call, described.projected_digest, described, 0, None, unhashed,
                                bool(described.refs), USAGE_SCAN_BYTES)
        else:
            recorder = Recorder(self, call, described.inbound_digest or sha256_id(raw), described,
                                projection.state.last_seq, None, unhashed, bool(described.refs), USAGE_SCAN_BYTES)
        if full:
            recorder.raw, recorder.soon, recorder.limit = raw, True, self.max_response_bytes
        if self.hold <= 0:
            recorder.release()
            return recorder
        # held since the call started (``perf_counter``, read once for the call): no clock read here
        self._held[recorder] = call.started
        if self._sweep_at is None:
            self._sweep_at = asyncio.get_running_loop().call_later(self.hold, self._sweep)
        return recorder

    def sent_headers(self, headers: CIMultiDict[str]) -> tuple[tuple[str, str], ...]:
        """``headers`` as a call sends them, for its record (``CallInfo.headers``): the last call's
        very tuple when they equal its headers (compared in C, names as HTTP compares them), so
        that ``_made`` looks a session's headers through once, not once a call."""
        if headers != self._sent_as:
            self._sent_as = headers.copy()
            self._sent_items = tuple(headers.items())
        return self._sent_items

    def _sweep(self) -> None:
        """Queue the request records whose hold ran out (the oldest first), and look again when
        the next one runs out."""
        self._sweep_at = None
        now = time.perf_counter()
        expired: list[Recorder] = []
        for recorder, started in self._held.items():  # oldest first: stop at the first still held
            until = started + self.hold
            if until > now:
                self._sweep_at = asyncio.get_running_loop().call_later(until - now, self._sweep)
                break
            expired.append(recorder)
        for recorder in expired:
            recorder.release()

    def _put(self, pending: _Pending) -> None:
        """Queue part of a call: its request record alone, or the response that follows it."""
        queue = self._queue
        if len(queue) >= self.queue_size:
            self._drop(pending, "QUEUE_FULL")
            return
        queue.append(pending)
        self._parts += 1
        self._queued(pending.soon)

    def _queued(self, soon: bool) -> None:
        """Tell the writer of a record just queued, and hurry it when the batch is full or the
        record is to be written ``soon``."""
        if not self._told:
            self._tell()
        if len(self._queue) >= self.batch:
            assert self._hurry is not None
            self._hurry.set()
        elif soon and self.image_wait < self.batch_wait:
            self._soon_timer()

    def _soon_timer(self) -> None:
        """A record to be written within ``image_wait`` is queued: a timer hurries its batch then."""
        if self._soon_at is None:
            self._soon_at = asyncio.get_running_loop().call_later(self.image_wait, self._soon_due)

    def _soon_due(self) -> None:
        """A record to be written soon (``_Pending.soon``) waited ``image_wait``: its batch goes now."""
        self._soon_at = None
        if self._hurry is not None:
            self._hurry.set()

    def _soon_going(self) -> None:
        """What the ``_soon_at`` timer was for is being written: it is not needed any more."""
        if self._soon_at is not None:
            self._soon_at.cancel()
            self._soon_at = None

    def _tell(self) -> None:
        """Wake the writer (started when there is none) for what is queued."""
        if self._writer is None or self._writer.done():
            self._wake, self._idle, self._hurry = asyncio.Event(), asyncio.Event(), asyncio.Event()
            self._writer = asyncio.get_running_loop().create_task(self._write())
        assert self._wake is not None and self._idle is not None
        self._told = True
        self._idle.clear()
        self._wake.set()

    async def drain(self) -> None:
        """Wait until every record queued so far is written (or dropped); the writer stops
        gathering while anyone drains."""
        self._draining += 1
        try:
            while self._queue or (self._writer is not None and not self._writer.done()
                                  and self._idle is not None and not self._idle.is_set()):
                assert self._idle is not None and self._hurry is not None
                self._hurry.set()
                await self._idle.wait()
        finally:
            self._draining -= 1

    async def close(self) -> None:
        """Queue the held request records of calls still in flight, write what is queued, then
        stop the writer (the app is shutting down)."""
        for recorder in list(self._held):
            recorder.release()
        if self._sweep_at is not None:
            self._sweep_at.cancel()
            self._sweep_at = None
        while True:
            self._soon_going()  # the drain writes it
            await self.drain()
            writer = self._writer
            if writer is None:
                self._digests.close()
                return
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            if not self._queue:
                self._digests.close()
                return
            self._tell()  # a call ended while the writer stopped: a new one writes its record

    async def _write(self) -> None:
        try:
            await self._writing()
        finally:  # a writer that ended (closed, or broken) is started again by the next record
            self._told = False

    async def _writing(self) -> None:
        assert self._wake is not None and self._idle is not None and self._hurry is not None
        while True:
            if not self._queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.batch_wait and not self._draining and not self._hurry.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), self.batch_wait)
            if len(self._queue) <= self.batch:
                self._hurry.clear()  # this batch takes everything queued: the next one may gather
                self._soon_going()
            self._told = False  # a record queued from now on tells the writer again
            queue = self._queue
            if len(queue) <= self.batch:  # everything queued (nearly always): taken in C
                batch = list(queue)
                queue.clear()
            else:
                batch = [queue.popleft() for _ in range(self.batch)]
            parts = self._parts > 0  # this batch may hold parts of calls
            if not queue:
                self._parts = 0
            self._taken += len(batch)
            sessions = _by_session(batch)
            del batch  # an idle writer holds no record (nor the body one holds until it is hashed)
            self._in_writing = set(sessions)
            try:
                if self._bodies:
                    await self._digested(sessions)
                await asyncio.gather(*(self._write_session(sid, items, parts) for sid, items in sessions.items()))
            finally:
                self._in_writing = set()

    async def _digested(self, sessions: dict[str, list[_Whole | _Pending]]) -> None:
        """The batch's whole calls with the body each still holds (``_made``) replaced by its
        digest, taken in the digests' lane (or here, when the lane cannot: it timed out, or is
        closed); a writer stopped meanwhile drops and counts the batch."""
        lists = list(sessions.values())
        try:
            try:
                digested, count, size = await self._digests.run(partial(_digest_all, lists))
            except Exception as exc:  # noqa: BLE001  # a hash cannot fail: the lane did not run it (starved, closed)
                get_logger().warning("record_digests_here", error=type(exc).__name__)
                digested, count, size = _digest_all(lists)
        except BaseException:  # cancelled (shutdown): the batch, untouched, is dropped and counted
            for items in lists:
                for item in items:
                    self._drop(item, "CANCELLED")
            raise
        self._bodies -= count
        self._queued_bytes -= size
        for session_id, items in zip(list(sessions), digested):
            sessions[session_id] = items

    def _hashed(self, raw: bytes) -> str:
        """The digest of a body sent as it came, taken by the writer: a request record queued
        alone (its call's hold ran out, or there is none)."""
        self._unhashed_bytes -= len(raw)
        return sha256_id(raw)

    def _pending(self, item: _Whole | _Pending) -> _Pending:
        """``item`` as a ``_Pending`` whose digests are taken: a whole call's record (its outcome
        in its request record), or a part of a call."""
        if type(item) is not tuple:
            pending: _Pending = item  # type: ignore[assignment]
            if pending.unhashed is not None:
                digest = self._hashed(pending.unhashed)
                pending.unhashed = None  # let go of once: a drop from here on counts nothing off
                pending.data = msgspec.structs.replace(pending.data, inbound_digest=digest, projected_digest=digest)
            return pending
        whole: _Whole = item
        # (digested by now: its inbound digest is a str)
        (record,) = CallRecords((whole[1],), [(0, *whole[2:13])]).records()  # type: ignore[list-item]
        return _Pending(whole[0], whole[2], record, (), None, whole[13])

    def _made(self, recorder: Recorder, status: int | None, latency: float, usage: dict[str, Any] | None,
              error_code: str | None) -> None:
        """Queue a whole call's record as its end makes it (``metadata`` mode): compact, so what a
        batch holds until it is written is a few hundred bytes a call (its digests, its outcome)
        and not what the call held (its headers, its recorder), which would crowd the caches; of
        a body sent as it came, the body itself until the digests lane hashes it."""
        call, described, unhashed = recorder.call, recorder.described, recorder.unhashed
        sent = call.headers
        # the headers a session's calls send are nearly always the same object (``sent_headers``):
        # looked through (in Python) once, not once a call
        if sent is not self._sent:
            if sent != self._sent:
                self._kept = recordable_headers(sent)
            self._sent = sent
        inbound: str | bytes
        if unhashed is not None:  # sent as it came: both digests are this one, which the writer takes
            inbound, projected = unhashed, ""
        else:
            inbound, projected = recorder.inbound, described.projected_digest
            if projected == inbound:
                projected = ""
        common = (call.route, call.fmt.NAME, call.upstream, call.method, call.path, self._kept, described.public_urls)
        if common == self._common:  # the last call's: the batch holds one of them
            common = self._common
        else:
            self._common = common
        queue = self._queue
        if unhashed is not None:  # nothing fails from here: its record holds it now, or it is let go of
            recorder.unhashed = None
            self._unhashed_bytes -= len(unhashed)
        if len(queue) >= self.queue_size:
            self._dropped("request", "QUEUE_FULL", call.request_id)
            self._dropped("response", "QUEUE_FULL", call.request_id)
            return
        if unhashed is not None:
            if self._queued_bytes + len(unhashed) <= QUEUED_BODIES_MAX_BYTES:  # counted as queued, not in flight
                self._bodies += 1
                self._queued_bytes += len(unhashed)
            else:  # the batches wait (a slow log): this call's end hashes its body itself
                inbound = sha256_id(unhashed)
        soon = recorder.soon
        queue.append((call.session_id, common, call.request_id, recorder.log_seq, inbound, projected, described.refs,
                      described.shape, status, latency, usage, error_code, recorder.truncated, soon))
        # ``_queued`` written out: every call takes it
        if not self._told:
            self._tell()
        if len(queue) >= self.batch:
            assert self._hurry is not None
            self._hurry.set()
        elif soon and self.image_wait < self.batch_wait:
            self._soon_timer()

    def _request(self, recorder: Recorder, response: ResponseRecorded | None, *, hashing: bool = True
                 ) -> RequestRecorded:
        """The request record of a call, with ``response`` in it (one row for the call); a body
        sent as it came is hashed now (unless not ``hashing``: the writer hashes it)."""
        call, inbound, described, log_seq, raw = (recorder.call, recorder.inbound, recorder.described,
                                                   recorder.log_seq, recorder.raw)
        unhashed = recorder.unhashed if hashing else None
        adapter, headers = call.fmt.NAME, recordable_headers(call.headers)
        # content-addressed: the blob's id is its bytes' digest (a body with the client's own images
        # is recorded by its spliced digest: ``describe.spliced_id``)
        blob = sha256_id(raw) if raw is not None else None
        if unhashed is not None:  # last, once nothing else can fail: the body is no longer held
            inbound = projected = self._hashed(unhashed)
            recorder.unhashed = None
        else:
            projected = described.projected_digest
        # positional, in ``RequestRecorded``'s field order (a test holds the two to the same fields)
        return RequestRecorded(call.request_id, call.route, adapter, call.upstream, call.method, call.path, log_seq,
                               inbound, projected, described.refs, described.shape, blob, described.public_urls,
                               response, headers)

    async def _write_session(self, session_id: str, items: list[_Whole | _Pending], parts: bool) -> None:
        try:
            if parts or self.full:  # each a ``_Pending``: a call's parts joined, its blobs stored
                await self._write_items(session_id, [self._pending(item) for item in items])
            else:
                await self._append_whole(session_id, items)  # type: ignore[arg-type]  # no parts: wholes only
        except Exception as exc:  # a record that cannot be made is dropped and counted: the writer goes on
            get_logger().exception("records_not_made", session=session_id, records=len(items))
            for item in items:
                self._drop(item, exc)
        finally:
            self._in_writing.discard(session_id)

    async def settle(self, session_id: str, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until the records queued so far for ``session_id``
        are written (or dropped); other sessions' traffic does not hold it up. Returns whether
        they were."""
        deadline = asyncio.get_running_loop().time() + timeout
        # how many records the writer must have taken for this session's last queued one to be
        # among them: found once (the queue holds up to ``queue_size``), not at every look
        until = self._taken
        for back, item in enumerate(reversed(self._queue)):
            if _session(item) == session_id:
                until += len(self._queue) - back
                break
        while self._taken < until or session_id in self._in_writing:
            if self._hurry is not None:
                self._hurry.set()
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    async def _write_items(self, session_id: str, items: list[_Pending]) -> None:
        """A session's queued records, in order, their blobs stored first, in one append
        (``_append``: a whole call is one record, a part of one is joined or named)."""
        if not self.full:  # no blobs
            await self._append(session_id, items)
            return
        ready: list[_Pending] = []
        for pending in items:
            try:
                for blob in pending.blobs:
                    await self.store.put_blob(blob)
            except Exception as exc:
                for kind in _kinds(pending.data):
                    self._dropped(kind, exc, pending.request_id)
                continue
            ready.append(pending)
        await self._append(session_id, ready)

    async def _append(self, session_id: str, group: list[_Pending]) -> None:
        """One append for the group. A call whose request and response are both in it is one
        row: the response rides in its request's record. Otherwise a response names its request
        by seq when that was written in an earlier append, else by ``request_seq = 0``: its
        request is in this same append, before it, and ``request_id`` joins the two."""
        rows: list[list[_Pending]] = []  # the pendings each record stands for
        data: list[RequestRecorded | ResponseRecorded] = []
        at: dict[str, int] = {}  # request records of this group, by request id: their index
        for pending in group:
            record = pending.data
            if isinstance(record, ResponseRecorded):
                index = at.pop(pending.request_id, None)
                if index is not None:  # one row for the call
                    request = data[index]
                    assert isinstance(request, RequestRecorded)
                    data[index] = msgspec.structs.replace(request, response=record)
                    rows[index].append(pending)
                    continue
                seq = self._seqs.pop(pending.request_id, None)  # one response per request
                if seq is None:  # its request record was dropped: so is this one
                    self._dropped("response", "REQUEST_NOT_RECORDED", pending.request_id)
                    continue
                record = msgspec.structs.replace(record, request_seq=seq)
            elif record.response is None:  # a request alone: its response may follow
                at[pending.request_id] = len(data)
            rows.append([pending])
            data.append(record)
        if not data:
            return
        try:
            events = await self.log.append(session_id, None, data, durable=False)
        except Exception as exc:
            for pendings in rows:
                for pending in pendings:
                    for kind in _kinds(pending.data):
                        self._dropped(kind, exc, pending.request_id)
            return
        if at:  # requests written alone (a whole call, nearly every row, waits for nothing)
            self._remember(rows, events)

    async def _append_whole(self, session_id: str, group: list[_Whole]) -> None:
        """The records of a group of whole calls only, as captured at their end (``metadata``
        mode: no blobs), in one ``append_calls``: each call's record holds its outcome, what the
        calls share is written once, and none is remembered."""
        # consecutive calls share one ``Common`` object (``_made``): found by identity, not hashed
        index: dict[int, int] = {}
        commons: list[Common] = []
        rows: list[CallRow] = []
        for whole in group:
            common = whole[1]
            at = index.get(id(common))
            if at is None:
                at = index[id(common)] = len(commons)
                commons.append(common)
            rows.append((at, *whole[2:13]))  # type: ignore[arg-type]  # digested: a str inbound digest
        try:
            await self.log.append_calls(session_id, CallRecords(tuple(commons), rows))
        except Exception as exc:
            for row in rows:
                self._dropped("request", exc, row[1])
                self._dropped("response", exc, row[1])

    def _remember(self, rows: list[list[_Pending]], events: list[Any]) -> None:
        """The seqs of request records whose response is still to come."""
        for pendings, event in zip(rows, events):
            pending = pendings[0]
            # a whole call (its outcome merged here or at its end) waits for nothing: remembering
            # it would push out the seqs of long calls still running
            if len(pendings) == 1 and isinstance(pending.data, RequestRecorded) and pending.data.response is None:
                self._seqs[pending.request_id] = event.seq
                while len(self._seqs) > 4 * self.queue_size:
                    self._seqs.popitem(last=False)

    def _drop(self, item: _Whole | _Pending, exc: BaseException | str) -> None:
        """Drop a queued record, or one about to be, and let go of the body it still holds to hash
        (a part of a call's, until ``_pending`` hashed it; a whole call's, until the digests lane did)."""
        unhashed: bytes | None = None
        if type(item) is tuple:  # a whole call: its body, when it still holds it, is where its digest goes
            kinds: tuple[str, ...] = ("request", "response")
            request_id = item[2]
            if type(item[4]) is bytes:
                self._queued_bytes -= len(item[4])
                self._bodies -= 1
        else:
            pending: _Pending = item  # type: ignore[assignment]
            kinds, request_id, unhashed = _kinds(pending.data), pending.request_id, pending.unhashed
            pending.unhashed = None
        for kind in kinds:
            self._dropped(kind, exc, request_id)
        if unhashed is not None:
            self._unhashed_bytes -= len(unhashed)

    def _dropped(self, kind: str, exc: BaseException | str, request_id: str) -> None:
        self.metrics.records_dropped[kind] += 1
        code = exc if isinstance(exc, str) else exc.code if isinstance(exc, ProjectionistError) else type(exc).__name__
        get_logger().warning("record_dropped", kind=kind, error=code, request_id=request_id)


def _digest_all(lists: list[list[_Whole | _Pending]]) -> tuple[list[list[_Whole | _Pending]], int, int]:
    """``lists`` (not changed) with each whole call's body (where a ``_Whole`` holds its inbound
    digest until the writer takes it) replaced by its digest; how many bodies, and their bytes."""
    out: list[list[_Whole | _Pending]] = []
    count = size = 0
    for items in lists:
        done: list[_Whole | _Pending] = []
        for item in items:
            if type(item) is tuple and type(item[4]) is bytes:
                body: bytes = item[4]
                item = (*item[:4], sha256_id(body), *item[5:])
                count += 1
                size += len(body)
            done.append(item)
        out.append(done)
    return out, count, size


def _by_session(batch: list[_Whole | _Pending]) -> dict[str, list[_Whole | _Pending]]:
    """A batch's records by session, in order."""
    sessions: dict[str, list[_Whole | _Pending]] = {}
    for item in batch:
        sessions.setdefault(_session(item), []).append(item)
    return sessions


def _session(item: _Whole | _Pending) -> str:
    """The session a queued record belongs to."""
    return item[0] if type(item) is tuple else item.session_id  # type: ignore[union-attr]


def _kinds(record: RequestRecorded | ResponseRecorded) -> tuple[str, ...]:
    """What a dropped record loses: a request, a response, or a whole call (both)."""
    if isinstance(record, ResponseRecorded):
        return ("response",)
    return ("request",) if record.response is None else ("request", "response")


class _Pending(msgspec.Struct, gc=False):
    """One record waiting for the writer (and the bodies its blobs hold, in ``full`` mode)."""

    session_id: str
    request_id: str
    data: RequestRecorded | ResponseRecorded
    blobs: tuple[bytes, ...] = ()
    #: A request record's body sent as it came, whose digest (both of them) the writer takes
    #: (``Recording._hash``); the record holds empty digests until then.
    unhashed: bytes | None = None
    #: Whether it is written within ``Recording.image_wait``: the call carried images (its request
    #: record has references: what a refusal's attribution counts), or the record holds bodies.
    soon: bool = False


class CallInfo(msgspec.Struct, frozen=True, gc=False):
    """What a record says about the call itself. ``headers`` are the ones it went upstream with,
    as they were sent (``prepare.Outgoing.sent``, credentials included): held in memory until the
    call's record is made, which keeps only ``outgoing.recordable_headers`` of them, never a
    key, token or cookie."""

    session_id: str
    request_id: str
    started: float
    route: str
    fmt: Any  # WireFormat: a module, which msgspec cannot type
    upstream: str
    method: str
    path: str
    headers: tuple[tuple[str, str], ...] = ()


#: A whole call's record in ``metadata`` mode, as its end made it (``Recording._made``): its session,
#: what it shares with other calls (``Common``), then a ``CallRow``'s fields after the first (request
#: id, log seq, digests, refs, shape, status, latency, usage, error code, truncated), then whether it
#: is to be written soon. Of a body sent as it came, the inbound digest is the body itself until
#: the writer's lane hashes it (``Recording._digested``); it holds no other body or header.
_Whole = tuple[str, Common, str, int, str | bytes, str, tuple[Any, ...], tuple[tuple[str, str], ...], int | None, float,
               dict[str, Any] | None, str | None, bool, bool]


class Meter:
    """Watches a relayed response (a relay ``Observer``) for what it reports of itself: its
    usage and model, read once, from the first ``limit`` bytes of it, when first asked. It keeps
    that bounded copy of the body itself (chunks past ``limit`` are not kept, and the copy is
    marked ``truncated``): one object a call, as every call has one."""

    __slots__ = ("limit", "chunks", "size", "truncated", "content_type", "complete", "_reported")

    def __init__(self, limit: int = USAGE_SCAN_BYTES) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False
        self.content_type = ""
        self.complete = False
        self._reported: tuple[dict[str, Any] | None, str | None] | None = None

    def chunk(self, data: bytes) -> None:
        if self.truncated:
            return
        if self.size + len(data) > self.limit:
            self.truncated = True
            return
        self.chunks.append(data)
        self.size += len(data)

    def begin(self, content_type: str) -> None:
        self.content_type = content_type

    def body_complete(self, status: int) -> None:
        self.complete = True

    def whole(self, content_type: str, data: bytes, status: int) -> None:
        """``begin``, ``chunk`` and ``body_complete`` of a body read whole, in one call."""
        self.content_type = content_type
        self.chunk(data)
        self.complete = True

    def body(self) -> bytes:
        """What was kept of the body."""
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def reported(self, fmt: WireFormat) -> tuple[dict[str, Any] | None, str | None]:
        """The usage and the model the answer reported, by ``fmt``'s reader."""
        if self._reported is None:
            self._reported = reported(fmt.usage, self.body(), self.content_type) if self.size else (None, None)
        return self._reported


#: A held request record's state (``Recorder.state``).
HELD: Final = 0
#: Its request record was queued alone (no hold, or the hold ran out): the response follows on its own.
RELEASED: Final = 1
#: The call's outcome is queued, or the call was discarded: nothing more is recorded.
DONE: Final = 2


class Recorder(Meter):
    """Watches one recorded call's response and queues its record once the call ended
    (``finished``, ``failed``, ``cancelled``): never in the request's wait. It holds what the
    request record says from the call's start (its ``call``, the inbound digest, what ``describe``
    found, the log seq projected on, the inbound body in ``full`` mode, the body to hash once out
    of the request's wait when it was sent as it came, and whether its record is to be written
    ``soon``: the call carried images, or the record holds bodies); at the end those and the
    outcome become one compact tuple (``_Whole``, ``Recording._made``), and the writer only
    numbers what the calls of a batch share: the call makes no event or envelope. A call whose
    hold ran out (``release``) has its request record queued alone, and its outcome follows as a
    ``response/recorded`` event."""

    __slots__ = ("recording", "call", "inbound", "described", "log_seq", "raw", "unhashed", "soon", "state")

    def __init__(self, recording: Recording, call: CallInfo, inbound: str, described: Described, log_seq: int,
                 raw: bytes | None, unhashed: bytes | None, soon: bool, limit: int) -> None:
        # ``Meter.__init__`` written out: every recorded call makes one
        self.limit = limit
        self.chunks = []
        self.size = 0
        self.truncated = False
        self.content_type = ""
        self.complete = False
        self._reported = None
        self.recording = recording
        self.call = call
        self.inbound = inbound
        self.described = described
        self.log_seq = log_seq
        self.raw = raw
        self.unhashed = unhashed
        self.soon = soon
        self.state = HELD

    @property
    def full(self) -> bool:
        """Whether the call is recorded with its bodies (``full`` mode)."""
        return self.recording.full

    def release(self) -> None:
        """Queue the held request record alone (no hold, the hold ran out, or the app is closing)."""
        if self.state != HELD:
            return
        self.state = RELEASED
        recording, raw, call = self.recording, self.raw, self.call
        recording._held.pop(self, None)
        blobs = (raw,) if raw is not None else ()
        request = recording._request(self, None, hashing=False)  # hashed by the writer, if to be
        recording._put(_Pending(call.session_id, call.request_id, request, blobs, self.unhashed,
                                bool(blobs or self.described.refs)))

    def discard(self) -> None:
        """The call was never sent (built again, it proved the same as the one refused): nothing is recorded."""
        unhashed = self.unhashed
        if self.state == HELD and unhashed is not None:  # (a request record queued already is hashed by the writer)
            self.recording._unhashed_bytes -= len(unhashed)
            self.unhashed = None
        self.state = DONE
        self.recording._held.pop(self, None)

    def finished(self, status: int) -> None:
        """The relay returned; a body that did not come through whole is ``INCOMPLETE``."""
        self._record(status, None if self.complete else "INCOMPLETE")

    def failed(self, code: str) -> None:
        """The call failed before its response started (the error went to the client)."""
        self._record(None, code)

    def cancelled(self) -> None:
        """The client left."""
        self._record(None, "CLIENT_DISCONNECTED")

    def _record(self, status: int | None, error_code: str | None) -> None:
        """Queue the call's outcome: with its request facts while those are still held (one
        row for the call, nearly every one), else as a ``response/recorded`` event naming it."""
        state = self.state
        if state == DONE:
            return
        self.state = DONE
        call = self.call
        # read once, for the access log too
        usage = (self._reported or self.reported(call.fmt))[0] if status is not None else None
        latency = round((time.perf_counter() - call.started) * 1_000_000) / 1000  # ``ms``, written out
        recording = self.recording
        if state != HELD:  # its request record was queued on its own: this one names it
            body = self.body() if recording.full and status is not None else None
            blobs = (body,) if body is not None else ()
            recording._put(_Pending(call.session_id, call.request_id,
                                    ResponseRecorded(call.request_id, 0, status, latency, usage, error_code,
                                                     sha256_id(body) if body is not None else None, self.truncated),
                                    blobs, None, bool(blobs or self.described.refs)))
            return
        held = recording._held
        if held:
            held.pop(self, None)
        try:
            if not recording.full:  # nearly every call: a compact record, made while what it says is at hand
                recording._made(self, status, latency, usage, error_code)
            else:
                self._with_bodies(status, latency, usage, error_code)
        except Exception as exc:  # a record that cannot be made is dropped and counted: the call went on
            get_logger().exception("record_not_made", request_id=call.request_id)
            unhashed = self.unhashed
            if unhashed is not None:
                recording._unhashed_bytes -= len(unhashed)
                self.unhashed = None
            for kind in ("request", "response"):
                recording._dropped(kind, exc, call.request_id)

    def _with_bodies(self, status: int | None, latency: float, usage: dict[str, Any] | None,
                     error_code: str | None) -> None:
        """Queue a whole call's record in ``full`` mode: its request record with the response in
        it, and its bodies as blobs."""
        call, recording, raw = self.call, self.recording, self.raw
        body = self.body() if status is not None else None
        response = ResponseRecorded(call.request_id, 0, status, latency, usage, error_code,
                                    sha256_id(body) if body is not None else None, self.truncated)
        kept = (body,) if body is not None else ()
        recording._put(_Pending(call.session_id, call.request_id, recording._request(self, response),
                                (raw, *kept) if raw is not None else kept, None, True))
