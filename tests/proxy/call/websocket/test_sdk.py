"""The official OpenAI Python SDK's ``client.responses.connect()`` through the proxy: its events
parse, a refused image is rescued before the SDK sees an error, the proxy's own refusals arrive as
the SDK's ``ResponseWsError``, a refused upgrade is the SDK's handshake error, and the snippet the
docs show runs as written."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from openai.types.responses.responses_server_event import ResponseWsError

from tests.conftest import Harness
from tests.imaging import make_image, ref_id
from tests.paths import ROOT
from tests.proxy.call.websocket.fake import FakeSocket

MakeWs = Callable[..., Awaitable[Harness]]


def sdk(harness: Harness, **headers: str) -> openai.AsyncOpenAI:
    base = str(harness.client.proxy.make_url("/v1"))
    return openai.AsyncOpenAI(base_url=base, api_key="sk-client-own-key", max_retries=0, default_headers=headers)


def content(*images: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "look"},
                                         *({"type": "input_image", "image_url": url} for url in images)]}]


async def turn(connection: Any, **fields: Any) -> list[Any]:
    await connection.response.create(model="gpt-test", **fields)
    got = []
    async for event in connection:
        got.append(event)
        if event.type in ("response.completed", "error"):
            return got
    raise AssertionError("the socket closed before the response ended")


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


async def test_the_sdk_gets_its_events(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    async with sdk(harness).responses.connect() as connection:
        got = await turn(connection, input="hello")
        again = await turn(connection, input="and again", previous_response_id=got[-1].response.id)
    assert got[-1].type == "response.completed" and got[-1].response.output_text == "tok0 tok1 tok2 "
    assert again[-1].type == "response.completed"
    assert [b["type"] for b in fake.bodies()] == ["response.create"] * 2
    assert fake.bodies()[1]["previous_response_id"] == "resp_fake"
    assert fake.handshakes[0].headers["Authorization"] == "Bearer sk-client-own-key"


async def test_a_refused_image_is_rescued_before_the_sdk_sees_an_error(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    image = make_image(color=61)
    fake.refused.add(ref_id(image))
    async with sdk(harness, **{"X-Session-Id": "sdk-1"}).responses.connect() as connection:
        got = await turn(connection, input=content(data_url(image)))
        assert [e.type for e in got if e.type == "error"] == [] and got[-1].type == "response.completed"
        later = await turn(connection, input=content(data_url(image)))  # the placeholder, unasked
        assert later[-1].type == "response.completed"
    assert fake.refusals == 1 and len(fake.messages) == 3
    first, resent, turn2 = (b["input"][0]["content"][1] for b in fake.bodies())
    assert first["image_url"] == data_url(image)
    assert resent == turn2 and resent["type"] == "input_text" and "rejected" in resent["text"]
    kinds = [e["type"] for e in await harness.events("sdk-1")]
    assert kinds.count("attachment/rejected") == 1


async def test_a_reference_is_projected_for_the_sdk(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws()
    attachment = await harness.admit(color=62)
    async with sdk(harness, **{"X-Session-Id": "sdk-2"}).responses.connect() as connection:
        got = await turn(connection, input=content(f"attachment:{attachment}"))
    assert got[-1].type == "response.completed"
    assert fake.bodies()[0]["input"][0]["content"][1]["image_url"] == data_url(make_image(color=62))


async def test_the_proxys_own_refusal_is_the_sdks_error_event(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**{"server.client_sessions": False})
    missing = "attachment:sha256:" + "0" * 64
    async with sdk(harness).responses.connect() as connection:
        [error] = await turn(connection, input=content(missing))
        # the socket goes on
        assert (await turn(connection, input="hello"))[-1].type == "response.completed"
    assert isinstance(error, ResponseWsError)
    assert (error.status, error.error.code, error.error.type) == (422, "ATTACHMENT_NOT_FOUND", "invalid_request_error")
    assert len(fake.messages) == 1


async def test_a_client_without_its_token_fails_the_sdks_handshake(make_ws: MakeWs, fake: FakeSocket,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "ct-alpha")
    harness = await make_ws()
    with pytest.raises(Exception) as refused:
        async with sdk(harness).responses.connect():
            pass
    assert "401" in str(refused.value)  # the client token is checked at the upgrade
    assert fake.handshakes == []


def shown_snippet() -> str:
    text = (ROOT / "docs" / "clients.md").read_text()
    start = text.index("## WebSockets")
    [snippet] = re.findall(r"```python\n(.*?)```", text[start:text.index("\n## ", start + 1)], re.S)
    return snippet


async def test_the_snippet_the_docs_show_runs_as_written(make_ws: MakeWs, fake: FakeSocket) -> None:
    harness = await make_ws(**{"server.client_sessions": False, "server.sessionless": "placeholder"})
    snippet = shown_snippet().replace("http://127.0.0.1:8787", str(harness.client.proxy.make_url("")).rstrip("/"))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.endswith("_BASE_URL")}
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", snippet, env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode(errors="replace")[-3000:]
    [message] = fake.bodies()
    assert message["input"][0]["content"][1]["type"] == "input_text"  # the missing image, as its placeholder
    assert fake.handshakes[0].headers["Authorization"] == "Bearer key-held-by-the-proxy"
