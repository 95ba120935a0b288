"""The golden requests of the OpenAI Chat and Anthropic Messages adapters through the proxy: the
upstream receives exactly ``tests/golden/<name>.projected.json``, the failures are recorded once,
and sending the request again gives the same bytes from the log alone, without reading the
quarantined references. The adapter alone on the same requests: ``tests/adapters/test_golden_chat.py``.
"""

from __future__ import annotations

import pytest

from tests.conftest import Harness
from tests.golden_chat import CASES, FAILING, F, M, assert_resent_identically_without_reads, load, send_golden

SID = "golden-1"


@pytest.mark.parametrize(("name", "path"), [("openai_chat", "/v1/chat/completions"),
                                            ("anthropic_messages", "/v1/messages")])
async def test_the_proxy_sends_the_golden_body_upstream(harness: Harness, name: str, path: str) -> None:
    raw = await send_golden(harness, name, path, SID)
    assert harness.upstream.last.json() == load(name, "projected")
    adapter, expected = CASES[name]
    failing = list(dict.fromkeys(aid for _, aid, _ in expected if aid in FAILING))
    names: dict[str, str | None] = {}
    for _, aid, nm in expected:
        if names.get(aid) is None:
            names[aid] = nm
    events = await harness.events(SID)
    assert [e["data"] for e in events] == [
        {"attachment_id": aid, "failure": FAILING[aid][0], "retryable": FAILING[aid][1], "name": names[aid]}
        for aid in failing]
    assert harness.store.reads[M] == 1
    assert harness.store.reads.get(F, 0) == (2 if F in failing else 0)  # one read + one immediate retry
    await assert_resent_identically_without_reads(harness, path, raw, SID, len(failing))
