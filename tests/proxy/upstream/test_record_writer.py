"""The record writer gathers records for ``batch_wait`` before it writes them, so light traffic
pays one transaction for many calls, and a call that ended by then is one row; a drain (the admin
API, shutdown) never waits for the interval; a full batch goes at once; a full queue drops and
counts, never blocks; a call still running when its request is written gets its own response
record, naming that request's seq."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec
from multidict import CIMultiDict

from projectionist.adapters import openai_chat
from projectionist.policy.events import (CallRecords, EventData, RefRecord, RequestRecorded, ResponseRecorded,
                                          envelope)
from projectionist.proxy.observe.metrics import Metrics
from projectionist.proxy.call import record as record_module
from projectionist.proxy.call.describe import UNHASHED, Described, of_raw, sha256_id
from projectionist.proxy.call.record import CallInfo, Recorder, Recording
from projectionist.proxy.lanes import Lane
from projectionist.proxy.sessionlog.base import append_calls_as_events


class AppendsLog:
    """A session log that keeps each append call (one call is one transaction in a backend)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.seq: dict[str, int] = {}
        self.rows: list[EventData] = []

    async def append(self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *,
                     durable: bool = True) -> list[Any]:
        self.calls.append((session_id, len(data)))
        self.rows += data
        start = self.seq.get(session_id, 0)
        self.seq[session_id] = start + len(data)
        return [envelope(start + i, "2026-01-01T00:00:00Z", item) for i, item in enumerate(data, 1)]

    async def append_calls(self, session_id: str, calls: CallRecords) -> int:
        return await append_calls_as_events(self, session_id, calls)


def start(recording: Recording, index: int, session: str = "s") -> Recorder:
    raw = b'{"model": "m", "messages": []}'
    call = CallInfo(session, f"req-{index}", time.perf_counter(), "openai_chat", openai_chat, "openai", "POST",
                    "/v1/chat/completions")
    recorder = recording.start(call, raw, of_raw(raw), None)
    recorder.complete = True
    return recorder


def record(recording: Recording, index: int, session: str = "s") -> None:
    start(recording, index, session)._record(200, None)


def whole_calls(log: AppendsLog) -> list[str]:
    """The request ids of the rows that hold a whole call (the request with its response)."""
    return [row.request_id for row in log.rows if isinstance(row, RequestRecorded) and row.response is not None
            and row.response.request_id == row.request_id and row.response.status == 200]


def writer(batch_wait: float, queue_size: int = 10_000, batch: int = 256) -> tuple[Recording, AppendsLog]:
    log = AppendsLog()
    return Recording(log, None, "metadata", 1024, Metrics(), queue_size, batch,  # type: ignore[arg-type]
                     batch_wait=batch_wait), log


async def test_records_of_light_traffic_gather_into_one_write() -> None:
    recording, log = writer(batch_wait=0.3)
    for index in range(5):
        record(recording, index)
        await asyncio.sleep(0.01)  # calls a few milliseconds apart, as at concurrency 1
    assert log.calls == []  # nothing written yet: the writer is gathering
    await asyncio.sleep(1.0)
    assert len(log.calls) == 1  # one transaction
    assert whole_calls(log) == [f"req-{i}" for i in range(5)]  # one row per call, its response in it
    await recording.close()


def start_with_image(recording: Recording, index: int, session: str = "s") -> Recorder:
    """A call whose body carried one image (its request record has a reference)."""
    raw = b'{"model": "m", "messages": []}'
    call = CallInfo(session, f"img-{index}", time.perf_counter(), "openai_chat", openai_chat, "openai", "POST",
                    "/v1/chat/completions")
    described = Described(sha256_id(raw), (RefRecord("$.messages[0].content[0]", "sha256:" + "a" * 64, "client"),), ())
    recorder = recording.start(call, raw, described, None)
    recorder.complete = True
    return recorder


def image_writer(batch_wait: float, image_wait: float) -> tuple[Recording, AppendsLog]:
    log = AppendsLog()
    return Recording(log, None, "metadata", 1024, Metrics(), batch_wait=batch_wait,  # type: ignore[arg-type]
                     image_wait=image_wait), log


async def test_a_record_of_a_call_with_images_waits_only_image_wait_and_takes_its_batch_along() -> None:
    recording, log = image_writer(batch_wait=30.0, image_wait=0.05)
    record(recording, 1)  # a text call: it alone would wait the whole 30 s
    start_with_image(recording, 2)._record(200, None)
    record(recording, 3)
    await asyncio.sleep(0.5)
    # the batch went within image_wait, with the text calls queued around the image call in it
    assert log.calls == [("s", 3)]
    assert [row.request_id for row in log.rows] == ["req-1", "img-2", "req-3"]
    record(recording, 4)  # the next batch gathers again: no image in it
    await asyncio.sleep(0.3)
    assert len(log.calls) == 1
    await recording.close()
    assert [row.request_id for row in log.rows][-1] == "req-4"


async def test_records_of_calls_without_images_wait_for_batch_wait() -> None:
    recording, log = image_writer(batch_wait=0.6, image_wait=0.05)
    for index in range(3):
        record(recording, index)
    await asyncio.sleep(0.3)
    assert log.calls == []  # past image_wait, still gathering
    await asyncio.sleep(0.8)
    assert log.calls == [("s", 3)]
    await recording.close()


async def test_the_response_record_of_a_long_call_with_images_waits_only_image_wait() -> None:
    recording, log = image_writer(batch_wait=30.0, image_wait=0.05)
    recorder = start_with_image(recording, 5)
    await recording.drain()  # no hold: the request record is written while the call runs
    assert len(log.rows) == 1
    recorder._record(200, None)
    await asyncio.sleep(0.5)
    assert len(log.rows) == 2 and isinstance(log.rows[1], ResponseRecorded) and log.rows[1].request_seq == 1
    await recording.close()


class Blobs:
    """A store that keeps the blobs put into it."""

    def __init__(self) -> None:
        self.blobs: list[bytes] = []

    async def put_blob(self, data: bytes) -> str:
        self.blobs.append(data)
        return sha256_id(data)


async def test_a_record_that_holds_bodies_waits_only_image_wait() -> None:
    log, store = AppendsLog(), Blobs()
    recording = Recording(log, store, "full", 1024, Metrics(), batch_wait=30.0,  # type: ignore[arg-type]
                          image_wait=0.05)
    recorder = start(recording, 1)  # a text call, in full mode: its bodies ride in the record
    recorder.chunk(b'{"ok": true}')
    recorder.finished(200)
    await asyncio.sleep(0.5)  # not held in memory for batch_wait
    assert [row.request_id for row in log.rows] == ["req-1"] and len(store.blobs) == 2
    await recording.close()


async def test_image_wait_is_never_longer_than_batch_wait() -> None:
    recording, _ = image_writer(batch_wait=0.01, image_wait=5.0)
    assert recording.image_wait == 0.01
    start_with_image(recording, 1)._record(200, None)
    assert recording._soon_at is None  # the batch goes within batch_wait anyway: no timer
    await recording.close()


async def test_without_an_interval_each_record_goes_as_soon_as_the_writer_is_free() -> None:
    recording, log = writer(batch_wait=0.0)
    for index in range(3):
        record(recording, index)
        await asyncio.sleep(0.01)
    assert len(log.calls) >= 3
    await recording.close()


async def test_a_drain_never_waits_for_the_interval() -> None:
    recording, log = writer(batch_wait=30.0)
    record(recording, 1)
    started = time.monotonic()
    await asyncio.wait_for(recording.drain(), 5)
    assert time.monotonic() - started < 5 and whole_calls(log) == ["req-1"]
    await recording.close()


async def test_a_full_batch_goes_at_once() -> None:
    recording, log = writer(batch_wait=30.0, batch=8)
    for index in range(5):  # 10 records: a full batch and two more
        record(recording, index)
    await asyncio.sleep(0.2)
    assert whole_calls(log)[:4] == [f"req-{i}" for i in range(4)]  # the full batch went without waiting 30 s
    assert len(log.calls) == 2 and log.calls[0] == ("s", 4)  # 8 records, 4 rows, then the rest
    await recording.close()
    assert whole_calls(log) == [f"req-{i}" for i in range(5)]


async def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    recording, log = writer(batch_wait=30.0, queue_size=4)
    for index in range(3):  # 6 records into a queue of 4
        record(recording, index)
    assert recording.metrics.records_dropped["request"] + recording.metrics.records_dropped["response"] == 2
    await recording.close()
    assert whole_calls(log) == ["req-0", "req-1"] and len(log.rows) == 2


async def test_a_call_still_running_when_its_request_is_written_gets_a_response_record_of_its_own() -> None:
    recording, log = writer(batch_wait=0.0)
    recorder = start(recording, 7)
    await recording.drain()  # the request record is written while the call runs
    recorder._record(200, None)
    await recording.drain()
    [request, response] = log.rows
    assert isinstance(request, RequestRecorded) and request.response is None
    assert isinstance(response, ResponseRecorded)
    assert (response.request_id, response.request_seq, response.status) == ("req-7", 1, 200)  # names its seq
    await recording.close()


def holding(hold: float) -> tuple[Recording, AppendsLog]:
    log = AppendsLog()
    return Recording(log, None, "metadata", 1024, Metrics(), batch_wait=0.0,  # type: ignore[arg-type]
                     hold=hold), log


async def test_a_held_request_record_waits_for_its_outcome_and_the_call_is_one_row() -> None:
    recording, log = holding(hold=5.0)
    recorder = start(recording, 1)
    await asyncio.sleep(0.1)
    await recording.drain()
    assert log.rows == []  # held back while the call runs: nothing queued yet
    recorder._record(200, None)
    await recording.drain()
    assert whole_calls(log) == ["req-1"] and len(log.rows) == 1
    await recording.close()


async def test_a_call_longer_than_the_hold_gets_its_request_written_then_its_outcome_later() -> None:
    recording, log = holding(hold=0.1)
    recorder = start(recording, 2)
    await asyncio.sleep(0.3)
    await recording.drain()
    [request] = log.rows  # the hold ran out during the call
    assert isinstance(request, RequestRecorded) and request.response is None
    recorder._record(200, None)
    await recording.drain()
    [_, response] = log.rows
    assert isinstance(response, ResponseRecorded) and (response.request_seq, response.status) == (1, 200)
    await recording.close()


async def test_closing_writes_the_held_requests_of_calls_still_in_flight() -> None:
    recording, log = holding(hold=60.0)
    start(recording, 3)
    start(recording, 4)
    await recording.close()
    assert [(r.request_id, r.response) for r in log.rows if isinstance(r, RequestRecorded)] == [
        ("req-3", None), ("req-4", None)]


async def test_a_whole_call_the_queue_cannot_take_counts_as_a_request_and_a_response_dropped() -> None:
    log = AppendsLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), queue_size=1,  # type: ignore[arg-type]
                          batch_wait=30.0, hold=30.0)
    record(recording, 1)
    record(recording, 2)  # the queue holds one record: the first call's
    assert dict(recording.metrics.records_dropped) == {"request": 1, "response": 1}
    await recording.close()
    assert whole_calls(log) == ["req-1"]


async def test_each_hold_runs_out_on_its_own_time_oldest_first() -> None:
    recording, log = holding(hold=0.3)
    start(recording, 1)
    await asyncio.sleep(0.2)
    start(recording, 2)
    await asyncio.sleep(0.2)  # the first call's hold ran out, not the second's
    await recording.drain()
    assert [r.request_id for r in log.rows] == ["req-1"]
    await asyncio.sleep(0.2)
    await recording.drain()
    assert [r.request_id for r in log.rows] == ["req-1", "req-2"]
    await recording.close()


async def test_a_long_call_s_outcome_is_kept_however_many_whole_calls_end_meanwhile() -> None:
    # Only a request record written alone waits for a response naming its seq: whole calls
    # (one row) must not push a long call's seq out of the writer's memory (4 x queue_size).
    log = AppendsLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), queue_size=2,  # type: ignore[arg-type]
                          batch_wait=0.0, hold=0.1)
    long = start(recording, 0)
    await asyncio.sleep(0.3)  # the hold ran out: its request record is written alone
    await recording.drain()
    for index in range(1, 20):  # a busy proxy: many short calls end while the long one streams
        record(recording, index)
        await recording.drain()
    long._record(200, None)
    await recording.close()
    assert dict(recording.metrics.records_dropped) == {}
    [response] = [r for r in log.rows if isinstance(r, ResponseRecorded)]
    assert (response.request_id, response.request_seq, response.status) == ("req-0", 1, 200)


async def test_a_part_of_a_call_left_queued_behind_a_full_batch_is_still_joined() -> None:
    # Batches of whole calls alone are written as they are; one that may hold a part of a call
    # (a request alone, a response alone) is joined record by record. A part that a full batch
    # left in the queue keeps the next batch on the joining path.
    log = AppendsLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), 10_000, 2,  # type: ignore[arg-type]
                          batch_wait=30.0, hold=30.0)
    early = start(recording, 0)
    early.release()  # its hold ran out: its request record is queued alone
    record(recording, 1)
    early._record(200, None)  # its outcome, queued third: past the first batch of two
    await recording.drain()
    assert recording._parts == 0  # the queue was emptied: the next batch needs no joining
    record(recording, 2)
    await recording.drain()
    await recording.close()
    assert [type(row).__name__ for row in log.rows] == ["RequestRecorded", "RequestRecorded", "ResponseRecorded",
                                                          "RequestRecorded"]
    request, _, response, _ = log.rows
    assert isinstance(request, RequestRecorded) and request.response is None
    assert isinstance(response, ResponseRecorded) and (response.request_id, response.request_seq) == ("req-0", 1)
    assert whole_calls(log) == ["req-1", "req-2"]


def test_a_request_record_has_each_of_its_fields_where_the_recorder_means_it() -> None:
    # The recorder builds the record positionally (every call makes one): each field, given a
    # value of its own, must land under its own name.
    recording = Recording(AppendsLog(), None, "full", 1024, Metrics())  # type: ignore[arg-type]
    call = CallInfo("s", "req-9", 0.0, "route-x", openai_chat, "upstream-x", "METHOD-X", "/path-x",
                    (("header-x", "value-x"),))
    raw = b'{"model": "m"}'
    described = msgspec.structs.replace(of_raw(raw), projected_digest="sha256:projected", public_urls=("http://x/",))
    recorder = Recorder(recording, call, "sha256:inbound", described, 41, raw, None, True, 1024)
    response = ResponseRecorded("req-9", 0, 200, 1.5)
    record = recording._request(recorder, response)
    assert msgspec.structs.asdict(record) == msgspec.structs.asdict(RequestRecorded(
        request_id="req-9", route="route-x", adapter=openai_chat.NAME, upstream="upstream-x", method="METHOD-X",
        path="/path-x", log_seq=41, inbound_digest="sha256:inbound", projected_digest="sha256:projected",
        refs=described.refs, shape=described.shape, inbound_blob=sha256_id(raw), public_urls=("http://x/",),
        response=response, headers=(("header-x", "value-x"),)))


class HeldLog(AppendsLog):
    """An ``AppendsLog`` whose appends wait until ``opened`` is set (a log that is slow or down)."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()

    async def append(self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *,
                     durable: bool = True) -> list[Any]:
        await self.opened.wait()
        return await super().append(session_id, expected_seq, data, durable=durable)


def unchanged(recording: Recording, index: int, raw: bytes) -> Recorder:
    """A call whose body went upstream as it came, described as the request path describes it."""
    call = CallInfo("s", f"req-{index}", time.perf_counter(), "openai_chat", openai_chat, "openai", "POST",
                    "/v1/chat/completions")
    recorder = recording.start(call, raw, UNHASHED, None)
    recorder.complete = True
    return recorder


async def test_the_writer_takes_the_digest_of_a_body_sent_as_it_came_and_the_record_holds_it_twice() -> None:
    recording, log = writer(batch_wait=0.0)
    bodies = [b'{"model": "m", "messages": [{"role": "user", "content": "%d"}]}' % i for i in range(3)]
    for index, raw in enumerate(bodies):
        unchanged(recording, index, raw)._record(200, None)
    await recording.drain()
    rows = [row for row in log.rows if isinstance(row, RequestRecorded)]
    assert [(row.inbound_digest, row.projected_digest) for row in rows] == [(sha256_id(raw),) * 2 for raw in bodies]
    assert recording._unhashed_bytes == 0
    await recording.close()


async def test_the_bodies_queued_for_the_writer_to_hash_are_bounded_and_past_the_bound_a_call_hashes_its_own(
        monkeypatch: Any) -> None:
    """A log that is down must not let the queue hold every body of every call: past
    ``UNHASHED_MAX_BYTES`` the digest is taken on the call's own path, and every record is
    right either way; the count goes back to nothing once the log takes them."""
    bodies = [b'{"model": "m", "messages": [{"role": "user", "content": "%03d"}]}' % i for i in range(10)]
    bound = 4 * len(bodies[0])
    monkeypatch.setattr(record_module, "UNHASHED_MAX_BYTES", bound)
    log = HeldLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=0.0, hold=30.0)
    recorders = [unchanged(recording, index, raw) for index, raw in enumerate(bodies)]
    assert [recorder.unhashed is not None for recorder in recorders] == [True] * 4 + [False] * 6
    assert recording._unhashed_bytes == bound  # counted while the calls run, not only once queued
    recorders[0].discard()  # never sent: its body is not held any more
    assert recording._unhashed_bytes == bound - len(bodies[0])
    for recorder in recorders[1:]:
        recorder._record(200, None)
    await asyncio.sleep(0.05)  # the writer hashed its batch and waits on the log
    assert recording._unhashed_bytes == 0
    log.opened.set()
    await recording.drain()
    rows = [row for row in log.rows if isinstance(row, RequestRecorded)]
    assert [(row.inbound_digest, row.projected_digest) for row in rows] == [(sha256_id(raw),) * 2
                                                                            for raw in bodies[1:]]
    await recording.close()


async def test_a_body_dropped_by_a_log_that_fails_leaves_nothing_counted_to_hash() -> None:
    class FailingLog(AppendsLog):
        async def append(self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *,
                         durable: bool = True) -> list[Any]:
            raise OSError("disk gone")

    metrics = Metrics()
    recording = Recording(FailingLog(), None, "metadata", 1024, metrics, 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=0.0)
    for index in range(3):
        unchanged(recording, index, b'{"model": "m", "messages": []}')._record(200, None)
    await recording.drain()
    assert metrics.records_dropped["request"] == 3
    assert recording._unhashed_bytes == 0
    await recording.close()


async def test_a_body_whose_record_a_full_queue_drops_leaves_nothing_counted_to_hash() -> None:
    metrics, log = Metrics(), HeldLog()
    recording = Recording(log, None, "metadata", 1024, metrics, 1, 256,  # type: ignore[arg-type]
                          batch_wait=0.0)
    for index in range(3):  # the first waits in the queue, the others find it full
        unchanged(recording, index, b'{"model": "m", "messages": []}')._record(200, None)
    assert metrics.records_dropped["request"] == 2
    assert recording._unhashed_bytes == len(b'{"model": "m", "messages": []}')
    log.opened.set()
    await recording.close()
    assert recording._unhashed_bytes == 0


async def test_a_call_discarded_after_its_request_record_was_queued_is_counted_off_once() -> None:
    recording, log = writer(batch_wait=0.0)  # no hold: the request record is queued at once
    raw = b'{"model": "m", "messages": []}'
    unchanged(recording, 0, raw).discard()
    await recording.drain()
    assert recording._unhashed_bytes == 0
    assert [row.inbound_digest for row in log.rows if isinstance(row, RequestRecorded)] == [sha256_id(raw)]
    await recording.close()


async def test_a_large_body_is_hashed_on_its_own_call_s_path_and_its_record_is_the_same() -> None:
    """Past ``UNHASHED_BODY_MAX`` the hash costs far more than the writer saves: the call takes it."""
    recording, log = writer(batch_wait=0.0)
    small = b'{"model": "m", "messages": []}'
    filler = b"x" * record_module.UNHASHED_BODY_MAX
    large = b'{"model": "m", "messages": [{"role": "user", "content": "' + filler + b'"}]}'
    recorders = [unchanged(recording, 0, small), unchanged(recording, 1, large)]
    assert [recorder.unhashed is not None for recorder in recorders] == [True, False]
    assert recording._unhashed_bytes == len(small)
    for recorder in recorders:
        recorder._record(200, None)
    await recording.drain()
    rows = [row for row in log.rows if isinstance(row, RequestRecorded)]
    assert [(row.inbound_digest, row.projected_digest) for row in rows] == [(sha256_id(small),) * 2,
                                                                            (sha256_id(large),) * 2]
    assert recording._unhashed_bytes == 0
    await recording.close()


async def test_a_record_queued_while_close_stops_the_writer_is_still_written() -> None:
    """A call that ends while ``close`` waits for the cancelled writer: its record is written by a
    writer started for it, not left queued for a ``drain`` that would wait for ever."""
    recording, log = writer(batch_wait=0.0)  # no hold: a record is queued as its call starts
    unchanged(recording, 0, b'{"model": "m", "messages": []}')._record(200, None)
    await recording.drain()

    async def ends_meanwhile() -> None:  # runs at close's first wait: the cancelled writer's
        unchanged(recording, 1, b'{"model": "m", "messages": [1]}')._record(200, None)

    task = asyncio.get_running_loop().create_task(ends_meanwhile())
    await recording.close()
    await task
    assert whole_calls(log) == ["req-0", "req-1"]
    assert not recording._queue and recording._unhashed_bytes == 0
    await asyncio.wait_for(recording.drain(), 1.0)


async def test_records_the_writer_cannot_make_are_dropped_and_counted_and_the_writer_goes_on() -> None:
    """A record that cannot be made (a bug, a value no record can hold) costs that batch's
    records, counted as dropped, never the writer: a drain returns and later calls are written."""
    metrics, log = Metrics(), AppendsLog()
    recording = Recording(log, None, "metadata", 1024, metrics, 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=0.0, hold=30.0)
    raw = b'{"model": "m", "messages": []}'
    for index in range(3):  # a format with no name: its record cannot say which adapter went
        call = CallInfo("s", f"bad-{index}", time.perf_counter(), "openai_chat", object(), "openai", "POST",
                        "/v1/chat/completions")
        recording.start(call, raw, UNHASHED, None)._record(200, None)
    await asyncio.wait_for(recording.drain(), 5)
    assert (metrics.records_dropped["request"], metrics.records_dropped["response"]) == (3, 3)
    assert recording._unhashed_bytes == 0
    unchanged(recording, 3, raw)._record(200, None)
    await asyncio.wait_for(recording.drain(), 5)
    assert whole_calls(log) == ["req-3"]
    await recording.close()


async def test_each_record_keeps_the_recordable_part_of_the_headers_its_own_call_sent() -> None:
    """A call holds the headers it sent as they were (its key among them) until the writer makes
    its record: the record keeps the recordable ones, its own call's even where its neighbours
    in the batch sent others, and never the key."""
    log = AppendsLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=0.0, hold=30.0)
    plain = (("Content-Type", "application/json"), ("Authorization", "Bearer sk-upstream-key"))
    traced = (("Content-Type", "application/json"), ("X-Trace", "t1"), ("Authorization", "Bearer sk-upstream-key"))
    raw = b'{"model": "m", "messages": []}'
    for index, sent in enumerate([plain, plain, traced, plain, (("Authorization", "Bearer sk-upstream-key"),)]):
        call = CallInfo("s", f"req-{index}", time.perf_counter(), "openai_chat", openai_chat, "openai", "POST",
                        "/v1/chat/completions", sent)
        recorder = recording.start(call, raw, UNHASHED, None)
        recorder.complete = True
        recorder._record(200, None)
    await recording.drain()
    rows = [row for row in log.rows if isinstance(row, RequestRecorded)]
    assert [row.headers for row in rows] == [plain[:1], plain[:1], traced[:2], plain[:1], ()]
    assert b"sk-upstream-key" not in msgspec.json.encode(log.rows)
    await recording.close()


async def test_a_record_that_cannot_be_made_costs_its_own_call_only_and_lets_go_of_its_body_once() -> None:
    """A whole call's record is made at its end: one that cannot be made is dropped there and
    counted, its body let go of once, and the other records of its batch (a part of a call
    among them) are written."""
    metrics, log = Metrics(), AppendsLog()
    recording = Recording(log, None, "metadata", 1024, metrics, 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=0.05, hold=30.0)
    raw = b'{"model": "m", "messages": []}'

    def begun(index: int, fmt: Any = openai_chat) -> Recorder:
        return recording.start(CallInfo("s", f"req-{index}", time.perf_counter(), "openai_chat", fmt, "openai",
                                        "POST", "/v1/chat/completions"), raw, UNHASHED, None)

    running = begun(0)
    running.release()  # its request record alone: the batch takes the parts' path
    begun(1)._record(200, None)
    # the running call's; the one that ended, its record holds for the writer's lane to hash
    assert (recording._unhashed_bytes, recording._queued_bytes) == (len(raw), len(raw))
    begun(2, object())._record(200, None)  # a format with no name: its record cannot be made
    assert (recording._unhashed_bytes, recording._queued_bytes) == (len(raw), len(raw))
    assert (metrics.records_dropped["request"], metrics.records_dropped["response"]) == (1, 1)
    await asyncio.wait_for(recording.drain(), 5)
    assert recording._unhashed_bytes == 0
    assert [(row.request_id, row.response is None) for row in log.rows if isinstance(row, RequestRecorded)] == [
        ("req-0", True), ("req-1", False)]
    assert metrics.records_dropped["request"] == 1
    await recording.close()


async def test_a_header_no_record_can_hold_is_left_out_and_the_batch_it_is_in_is_written(tmp_path: Any) -> None:
    """aiohttp keeps a header's bytes that are no UTF-8 as surrogates: one client sending such a
    header must not cost the records of the calls written with its (other sessions' too)."""
    from projectionist.proxy.sessionlog.sqlite import SqliteLog

    log = SqliteLog(tmp_path / "log.db")
    recording = Recording(log, None, "metadata", 1024, Metrics(), 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=0.05, hold=30.0)
    raw = b'{"model": "m", "messages": []}'
    for session, sent in (("odd", (("X-Odd", "caf\udcff"), ("Accept", "*/*"))), ("other", (("Accept", "*/*"),))):
        call = CallInfo(session, f"req-{session}", time.perf_counter(), "openai_chat", openai_chat, "openai",
                        "POST", "/v1/chat/completions", sent)
        recording.start(call, raw, UNHASHED, None)._record(200, None)
    await recording.drain()
    try:
        for session in ("odd", "other"):
            [event] = await log.read(session)
            assert isinstance(event.data, RequestRecorded) and event.data.headers == (("Accept", "*/*"),)
    finally:
        await recording.close()
        await log.close()


async def test_settle_waits_for_its_own_session_s_records_queued_so_far_and_for_no_other_s() -> None:
    log = HeldLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=30.0, hold=30.0)
    raw = b'{"model": "m", "messages": []}'
    for session in ("a", "b"):
        call = CallInfo(session, f"req-{session}", time.perf_counter(), "openai_chat", openai_chat, "openai",
                        "POST", "/v1/chat/completions")
        recording.start(call, raw, UNHASHED, None)._record(200, None)
    assert await recording.settle("c", 1.0)  # nothing of its own queued: at once
    assert not await recording.settle("a", 0.2)  # hurried to the writer, which waits on the log
    log.opened.set()
    assert await recording.settle("a", 5.0)
    assert sorted(row.request_id for row in log.rows) == ["req-a", "req-b"]
    await recording.close()


def _ended(recording: Recording, bodies: list[bytes]) -> None:
    """One whole call a body, each sent as it came (its digest left to the writer), ended."""
    for index, raw in enumerate(bodies):
        call = CallInfo("s", f"req-{index}", time.perf_counter(), "openai_chat", openai_chat, "openai", "POST",
                        "/v1/chat/completions")
        recorder = recording.start(call, raw, UNHASHED, None)
        recorder.complete = True
        recorder._record(200, None)


def _digests(log: AppendsLog) -> list[tuple[str, str]]:
    return [(row.inbound_digest, row.projected_digest) for row in log.rows if isinstance(row, RequestRecorded)]


async def test_the_bodies_of_whole_calls_are_hashed_off_the_event_loop_a_batch_at_a_time(monkeypatch: Any) -> None:
    """A call ends without hashing its body: its record holds it (still counted against the
    bound) until the writer's digests lane hashes the batch's bodies, on its own thread."""
    threads: list[str] = []

    def hashing(data: bytes) -> str:
        threads.append(threading.current_thread().name)
        return sha256_id(data)

    monkeypatch.setattr(record_module, "sha256_id", hashing)
    log = AppendsLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=10.0, hold=30.0)
    bodies = [b'{"model": "m", "messages": [{"role": "user", "content": "%d"}]}' % n for n in range(5)]
    _ended(recording, bodies)
    assert threads == [] and (recording._unhashed_bytes, recording._queued_bytes) == (0, sum(map(len, bodies)))
    await asyncio.wait_for(recording.drain(), 5)
    assert threads == ["lane-record-digests-0"] * 5
    assert _digests(log) == [(sha256_id(body), sha256_id(body)) for body in bodies]
    assert (recording._unhashed_bytes, recording._queued_bytes, recording._bodies) == (0, 0, 0)
    await recording.close()


async def test_a_digests_lane_that_hangs_or_is_closed_costs_no_record() -> None:
    """The digests lane held by a call that hangs (no room in it within its timeout), or closed:
    the writer hashes the batch itself, and every record is written with its digest."""
    log = AppendsLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=0.0, hold=30.0)
    recording._digests = Lane("record-digests", 1, 0.2, 0.2, stuck_max=0)
    hung = threading.Event()
    with contextlib.suppress(TimeoutError):  # its caller leaves; the call keeps the lane's one place
        await recording._digests.run(lambda: hung.wait(10))
    bodies = [b'{"model": "m", "messages": [], "n": %d}' % n for n in range(3)]
    started = time.perf_counter()
    _ended(recording, bodies)
    await asyncio.wait_for(recording.drain(), 5)
    assert time.perf_counter() - started >= 0.2  # it waited for room in the lane, then went on
    hung.set()
    recording._digests.close()
    _ended(recording, bodies[:1])
    await asyncio.wait_for(recording.drain(), 5)
    assert _digests(log) == [(sha256_id(body), sha256_id(body)) for body in [*bodies, bodies[0]]]
    assert (recording._unhashed_bytes, recording._queued_bytes, recording._bodies) == (0, 0, 0)
    await recording.close()


async def test_a_writer_stopped_while_its_batch_is_hashed_drops_and_counts_the_batch() -> None:
    """Shutdown cancels a writer waiting for its batch's digests: each record is dropped and
    counted (request and response), and the bodies it held are let go of."""
    metrics, log = Metrics(), AppendsLog()
    recording = Recording(log, None, "metadata", 1024, metrics, 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=0.0, hold=30.0)
    recording._digests = Lane("record-digests", 1, 30.0, 30.0, stuck_max=0)
    hung = threading.Event()
    holding = asyncio.ensure_future(recording._digests.run(lambda: hung.wait(10)))
    await asyncio.sleep(0.05)
    _ended(recording, [b'{"model": "m", "messages": []}', b'{"model": "m", "messages": [1]}'])
    await asyncio.sleep(0.1)  # the writer took the batch and waits for room in the lane
    assert not recording._queue and recording._writer is not None
    recording._writer.cancel()
    await asyncio.gather(recording._writer, return_exceptions=True)
    assert (metrics.records_dropped["request"], metrics.records_dropped["response"]) == (2, 2)
    assert (recording._unhashed_bytes, recording._queued_bytes, recording._bodies) == (0, 0, 0) and log.rows == []
    hung.set()
    await holding
    await recording.close()


def test_the_headers_consecutive_calls_send_are_copied_once_while_they_stay_the_same() -> None:
    """``sent_headers`` gives the last call's very tuple for headers equal to its (so the record
    looks them through once), a copy of its own for any that differ, and never the caller's dict."""
    recording = Recording(AppendsLog(), None, "metadata", 1024, Metrics())  # type: ignore[arg-type]
    sent = CIMultiDict([("Content-Type", "application/json"), ("Authorization", "Bearer sk-upstream-key")])
    first = recording.sent_headers(sent)
    assert first == tuple(sent.items())
    assert recording.sent_headers(CIMultiDict(sent)) is first
    traced = CIMultiDict(sent)
    traced["X-Trace"] = "t1"
    assert recording.sent_headers(traced) == tuple(traced.items())
    sent["Content-Type"] = "text/plain"  # the caller's dict changed later: what was given holds
    assert first == (("Content-Type", "application/json"), ("Authorization", "Bearer sk-upstream-key"))
    assert recording.sent_headers(sent) == tuple(sent.items())


async def test_bodies_waiting_for_a_batch_never_make_a_call_hash_on_its_request_path(monkeypatch: Any) -> None:
    """The bodies queued records hold for the digests lane have their own bound: past it a call's
    end hashes its body itself; the calls in flight keep theirs to the end all the same."""
    body = b'{"model": "m", "messages": [], "pad": "0123456789"}'
    monkeypatch.setattr(record_module, "QUEUED_BODIES_MAX_BYTES", 2 * len(body))
    monkeypatch.setattr(record_module, "UNHASHED_MAX_BYTES", 2 * len(body))
    log = AppendsLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=10.0, hold=30.0)
    bodies = [body.replace(b"0123", b"%04d" % n) for n in range(4)]
    _ended(recording, bodies)
    assert (recording._bodies, recording._queued_bytes, recording._unhashed_bytes) == (2, 2 * len(body), 0)
    call = CallInfo("s", "req-9", time.perf_counter(), "openai_chat", openai_chat, "openai", "POST",
                    "/v1/chat/completions")
    assert recording.start(call, body, UNHASHED, None).unhashed is body  # not hashed before it is sent
    await asyncio.wait_for(recording.drain(), 5)
    assert _digests(log) == [(sha256_id(b), sha256_id(b)) for b in bodies]
    assert (recording._queued_bytes, recording._bodies) == (0, 0)
    await recording.close()


async def test_a_body_is_let_go_of_once_its_record_is_written() -> None:
    """Once a batch is written, neither the idle writer nor the idle digests lane holds a body
    any of its records held until it was hashed (found by a red-team probe: both did)."""
    log = AppendsLog()
    recording = Recording(log, None, "metadata", 1024, Metrics(), 10_000, 256,  # type: ignore[arg-type]
                          batch_wait=0.0, hold=30.0)
    body = bytes(bytearray(b'{"model": "m", "messages": [], "only": "here"}'))  # no constant holds it
    held = sys.getrefcount(body)
    _ended(recording, [body])
    assert sys.getrefcount(body) > held  # its record holds it for the lane
    await asyncio.wait_for(recording.drain(), 5)
    await asyncio.sleep(0.05)  # the lane's thread is back waiting for its next job
    assert _digests(log) == [(sha256_id(body), sha256_id(body))]
    assert sys.getrefcount(body) == held
    await recording.close()
