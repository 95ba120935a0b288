"""An older replica (a rolling deploy, or a rollback) reads a log that holds a rejection: it is an
event type of its own (``attachment/rejected``), which the older version skips, and a checkpoint
restating one carries it in a field the older version ignores.

``policy/events.py`` promises "an event type this version does not know decodes to UnknownEvent
... so an older replica can read a newer log". The schema below is 3e4ef79's, verbatim in what
matters (``Quarantine``, ``Held``, ``Checkpoint`` and the decode rule)."""

from __future__ import annotations

from typing import Literal

import msgspec
import pytest

from projectionist.policy.events import encode_event
from projectionist.proxy.inbound.services import SERVICES

# -- 3e4ef79's schema ------------------------------------------------------------------------------
Failure = Literal["not_found", "corrupt", "read_failed"]


class Quarantine(msgspec.Struct, frozen=True, omit_defaults=True):
    attachment_id: str
    failure: Failure
    retryable: bool
    name: str | None = None


class Held(msgspec.Struct, frozen=True):
    quarantine: Quarantine
    since: str


class Checkpoint(msgspec.Struct, frozen=True):
    state_seq: int
    quarantined: tuple[Held, ...] = ()


class _Envelope(msgspec.Struct, frozen=True, tag_field="type"):
    seq: int
    time: str


class QuarantineEvent(_Envelope, frozen=True, tag="attachment/quarantine"):
    data: Quarantine


class CheckpointEvent(_Envelope, frozen=True, tag="session/checkpoint"):
    data: Checkpoint


class UnknownEvent(msgspec.Struct, frozen=True):
    type: str
    seq: int
    time: str
    data: msgspec.Raw


OLD_KNOWN = {"attachment/quarantine", "attachment/recovered", "session/forked", "request/recorded",
             "response/recorded", "session/checkpoint"}
_decoder = msgspec.json.Decoder(QuarantineEvent | CheckpointEvent)
_unknown = msgspec.json.Decoder(UnknownEvent)


def old_decode_event(raw: bytes) -> object:
    """3e4ef79's rule: a known type with a bad body is corruption (LOG_CORRUPT), not evolution."""
    unknown = _unknown.decode(raw)
    if unknown.type not in ("attachment/quarantine", "session/checkpoint"):
        return unknown  # (the other known types are not at issue here)
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError:
        if unknown.type in OLD_KNOWN:
            raise
        return unknown


async def test_an_older_replica_reads_a_log_that_holds_a_rejection(make_harness: pytest.FixtureRequest) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})  # type: ignore[operator]
    bad = await harness.admit(color=41)
    harness.upstream.refused[bad] = False
    assert (await harness.chat("mixed", bad)).status == 200  # quarantined as rejected, re-sent
    events = await harness.app[SERVICES].log.read("mixed")
    assert any(getattr(e, "data", None) is not None and getattr(e.data, "failure", None) == "rejected" for e in events)
    for event in events:
        old_decode_event(encode_event(event))  # ValidationError today: LOG_CORRUPT on the older replica


async def test_an_older_replica_reads_a_log_that_holds_what_fitting_recorded(
        make_harness: pytest.FixtureRequest) -> None:
    """Bytes a client inlined that are no image (a quarantine with ``inline``), the variant pinned
    for an inlined image, and a rule an upstream taught (``upstream/learnt``, a type the older
    version does not know: skipped), each in its own event and in a checkpoint restating them."""
    import base64

    from projectionist.policy.events import CheckpointEvent as NewCheckpoint, Learnt
    from projectionist.policy.fold import checkpoint_of, fold
    from tests.imaging import make_image

    harness = await make_harness(**{"record.mode": "metadata"})  # type: ignore[operator]
    wide = base64.b64encode(make_image(9000, 20, color=3)).decode()
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": wide}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}}]}]}
    resp = await harness.client.post("/v1/messages", json=body, headers={"X-Session-Id": "fitted"})
    assert resp.status == 200, await resp.text()
    log = harness.app[SERVICES].log
    last = (await log.read("fitted"))[-1].seq
    await log.append("fitted", last, [Learnt("anthropic", "m", "many_images", images=4, side=1000)])
    events = await log.read("fitted")
    kinds = {type(e).__name__ for e in events}
    assert {"QuarantineEvent", "VariantEvent", "LearntEvent"} <= kinds, kinds
    for event in events:
        old_decode_event(encode_event(event))
    state = fold(events)
    assert state.learnt and state.variants and state.quarantined
    old_decode_event(encode_event(NewCheckpoint(seq=state.last_seq + 1, time="t", data=checkpoint_of(state))))
