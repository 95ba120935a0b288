"""Bodies no client should send: nested past the parser's depth, or labelled with an encoding they
are not in. Each is the client's error in its own wire shape, never a 500."""

from __future__ import annotations

import pytest

from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness

DEEP = b'{"model": "m", "messages": ' + b"[" * 5000 + b'"sha256:"' + b"]" * 5000 + b"}"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages",
                                  "/v1beta/models/g:generateContent", "/v1/messages/batches"])
async def test_json_nested_past_the_parsers_depth_is_invalid_json(harness: Harness, path: str) -> None:
    resp = await harness.client.post(path, data=DEEP, headers={"Content-Type": "application/json",
                                                               "X-Session-Id": "deep"})
    assert resp.status == 400 and resp.headers["x-projectionist-error-code"] == "INVALID_JSON"
    assert harness.upstream.received == [] and harness.store.total == 0


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/attachments"])
async def test_a_body_that_is_not_in_its_declared_encoding_is_a_400(harness: Harness, encoding: str, path: str) -> None:
    resp = await harness.client.post(path, data=b"this is not " + encoding.encode(), headers={
        "Content-Encoding": encoding, "Content-Type": "application/json" if "chat" in path else "image/png",
        "X-Session-Id": "enc"})
    assert resp.status == 400, await resp.text()
    assert resp.headers["x-projectionist-error-code"] == "INVALID_BODY"
    assert harness.upstream.received == []
