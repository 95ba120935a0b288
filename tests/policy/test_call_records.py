"""Whole calls' records in their short form (``events.CallRecords``, what ``metadata`` recording
appends): each call's ``RequestRecorded`` comes back with every field where it was meant, and the
stored bytes (``encode_calls``) read back as the very events each call's record would be alone."""

from __future__ import annotations

import msgspec
import pytest

from projectionist.policy.events import (
    CALLS_PREFIX,
    CallRecords,
    RefRecord,
    RequestEvent,
    RequestRecorded,
    ResponseRecorded,
    calls_events,
    encode_calls,
    encode_event,
)
from tests.records import COMMONS, whole_calls


def test_each_field_of_a_call_lands_where_its_record_means_it() -> None:
    # ``records`` builds positionally: each field, a value of its own, must come back by its name
    ref = RefRecord("$.messages[0]", "sha256:" + "a" * 64, "inlined")
    common = ("route-x", "adapter-x", "upstream-x", "METHOD-X", "/path-x", (("header-x", "value-x"),),
              ("http://public-x/",))
    calls = CallRecords((COMMONS[0], common), [(1, "req-9", 41, "sha256:inbound", "sha256:projected", (ref,),
                                                (("messages", "shape-x"),), 201, 2.5, {"total_tokens": 7},
                                                "ERROR-X", True)])
    assert calls.records() == [RequestRecorded(
        request_id="req-9", route="route-x", adapter="adapter-x", upstream="upstream-x", method="METHOD-X",
        path="/path-x", log_seq=41, inbound_digest="sha256:inbound", projected_digest="sha256:projected",
        refs=(ref,), shape=(("messages", "shape-x"),), inbound_blob=None, public_urls=("http://public-x/",),
        response=ResponseRecorded(request_id="req-9", request_seq=0, status=201, latency_ms=2.5,
                                  usage={"total_tokens": 7}, error_code="ERROR-X", response_blob=None,
                                  response_truncated=True),
        headers=(("header-x", "value-x"),))]


def test_an_empty_projected_digest_is_the_inbound_one() -> None:
    (record,) = CallRecords(COMMONS, [(0, "r", 0, "sha256:in", "", (), (), 200, 1.0, None, None, False)]).records()
    assert record.projected_digest == record.inbound_digest == "sha256:in"


def test_the_stored_bytes_read_back_as_each_record_stored_alone_in_a_third_of_the_bytes() -> None:
    calls = whole_calls(12)
    stored = encode_calls(5, "2026-12-07T00:00:00.000Z", calls)
    assert stored.startswith(CALLS_PREFIX)
    events = calls_events(stored)
    assert events == [RequestEvent(seq, "2026-12-07T00:00:00.000Z", record)
                      for seq, record in enumerate(calls.records(), 5)]
    alone = [encode_event(event) for event in events]
    assert len(stored) * 2 < sum(map(len, alone))  # the shared parts once, no field names, no envelopes


def test_a_row_that_names_a_shared_part_it_does_not_hold_does_not_decode() -> None:
    stored = encode_calls(1, "t", CallRecords(COMMONS[:1], [(1, "r", 0, "sha256:in", "", (), (), 200, 1.0, None,
                                                               None, False)]))
    with pytest.raises(msgspec.DecodeError):
        calls_events(stored)
    with pytest.raises(msgspec.DecodeError):
        calls_events(stored.replace(b'"calls"', b'"other"'))
