"""The relay's edge cases that a full server makes hard to reach: a client gone before the response starts."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from unittest import mock

from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict
from yarl import URL

from projectionist.proxy.upstream.client import Client
from projectionist.proxy.call.relay import relay
from projectionist.proxy.inbound.context import Timing
from tests.fakes import FakeUpstream


async def test_client_gone_before_the_response_starts_is_not_an_error(upstream: FakeUpstream) -> None:
    """The transport is already closing when the upstream answers (the client hung up while the
    upstream worked): the relay returns quietly instead of raising a connection error."""
    transport = mock.Mock()
    transport.is_closing.return_value = True
    protocol = mock.Mock(transport=transport)
    writer = StreamWriter(protocol, asyncio.get_running_loop())
    request = make_mocked_request("POST", "/v1/chat/completions", writer=writer, protocol=protocol,
                                  transport=transport)
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    session = Client(5, 30)
    try:
        timing = Timing(time.perf_counter())
        response = await relay(request, session, URL(upstream.url + "/v1/chat/completions"),
                               json.dumps(body).encode(), CIMultiDict({"Content-Type": "application/json"}), timing)
    finally:
        await session.close()
    assert timing.status == 200  # the upstream was called and answered
    assert upstream.last.json() == body
    assert response.status == 200
    transport.write.assert_not_called()  # nothing was written to the departed client
    transport.writelines.assert_not_called()
