"""The golden Anthropic Message Batches request through the proxy (``POST /v1/messages/batches``):
the upstream receives exactly ``tests/golden/anthropic_batches.projected.json`` (the proxy's compact
encoding, key order kept), the failures are recorded once, and sending the batch again gives the same
bytes from the log alone. The adapter alone on the same batch: ``tests/adapters/test_golden_batches.py``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tests.conftest import Harness
from tests.golden_chat import F, M, assert_resent_identically_without_reads, load, send_golden
from tests.paths import GOLDEN

NAME = "anthropic_batches"
SID = "golden-batch"


async def test_the_proxy_sends_the_golden_body_upstream(harness: Harness) -> None:
    raw = await send_golden(harness, NAME, "/v1/messages/batches", SID)
    sent = harness.upstream.last
    assert (sent.method, sent.path_qs) == ("POST", "/v1/messages/batches")
    assert sent.json() == load(NAME, "projected")
    # The proxy's compact encoding of the golden body, key order kept.
    expected: Any = msgspec.json.encode(msgspec.json.decode((GOLDEN / f"{NAME}.projected.json").read_bytes()))
    assert sent.body == expected
    events = await harness.events(SID)
    assert [e["data"] for e in events] == [
        {"attachment_id": M, "failure": "not_found", "retryable": False, "name": "gone \N{FRAME WITH PICTURE}.png"},
        {"attachment_id": F, "failure": "read_failed", "retryable": True}]  # never named: no name
    assert harness.store.reads[M] == 1
    assert harness.store.reads[F] == 2  # one read + one immediate retry
    await assert_resent_identically_without_reads(harness, "/v1/messages/batches", raw, SID, 2)
