"""The official SDKs configured by environment variables alone (``OPENAI_BASE_URL``,
``ANTHROPIC_BASE_URL``, their keys; clients built with no arguments), the session in the base URL
(``/s/{session}/...``), against a running proxy: the session's log gets the calls and a missing
image becomes a placeholder. ``google-genai`` takes the same base URL through ``http_options``."""

from __future__ import annotations

import base64
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import BACKENDS, Harness
from tests.fakes import FakeUpstream
from tests.imaging import make_image, ref_id

pytestmark = [pytest.mark.parametrize("backend", BACKENDS, indirect=True),
              # google-genai subclasses aiohttp.ClientSession, which aiohttp deprecates (not our concern)
              pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")]
SESSION = "sdk-by-url"


@pytest.fixture
async def recorded(make_harness: Any, upstream: FakeUpstream) -> Harness:
    """A proxy that records every call of a session (``gemini`` points at the fake too)."""
    return await make_harness(**{"record.mode": "metadata",
                                 "upstreams.gemini": {"format": "gemini", "url": upstream.url}})


def base(harness: Harness, path: str) -> str:
    return str(harness.client.make_url(path))


async def recorded_calls(harness: Harness) -> list[dict[str, Any]]:
    await harness.app[SERVICES].recording.drain()  # records are written off the request path
    return [e["data"] for e in await harness.events(SESSION) if e["type"] == "request/recorded"]


def quarantined(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["attachment_id"] for e in events if e["type"] == "attachment/quarantine"]


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def placeholder(attachment_id: str) -> str:
    return f"[image unavailable: not_found ({attachment_id[:15]})]"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_openai_sdk_from_the_environment_alone(
    recorded: Harness, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", base(recorded, f"/s/{SESSION}/v1"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    data = make_image(color=160)
    gone = ref_id(make_image(color=161))
    async with openai.AsyncOpenAI() as client:
        uploaded = await client.files.create(file=("shot.png", data, "image/png"), purpose="vision")
        assert uploaded.id == ref_id(data)  # the Files API under the prefix: admitted, not forwarded
        messages: Any = [{"role": "user", "content": [
            {"type": "text", "text": "describe"},
            {"type": "image_url", "image_url": {"url": f"attachment:{uploaded.id}"}},
            {"type": "image_url", "image_url": {"url": f"attachment:{gone}"}}]}]
        if stream:
            chunks = await client.chat.completions.create(model="m", messages=messages, stream=True)
            assert "".join([c.choices[0].delta.content or "" async for c in chunks]) == "tok1 tok2 tok3 tok4 "
        else:
            completion = await client.chat.completions.create(model="m", messages=messages)
            assert completion.choices[0].message.content == "Hello from the fake upstream."
    sent = recorded.upstream.last
    assert sent.path_qs == "/v1/chat/completions" and sent.headers["Authorization"] == "Bearer sk-from-env"
    parts = sent.json()["messages"][0]["content"]
    assert parts[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(data).decode()
    assert parts[2] == {"type": "text", "text": placeholder(gone)}
    [call] = await recorded_calls(recorded)
    assert (call["route"], call["path"]) == ("openai_chat", "/v1/chat/completions")
    assert quarantined(await recorded.events(SESSION)) == [gone]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_anthropic_sdk_from_the_environment_alone(
    recorded: Harness, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", base(recorded, f"/s/{SESSION}"))  # the SDK appends /v1/messages
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    data = make_image(color=162)
    ok = await recorded.admit(data)
    gone = ref_id(make_image(color=163))
    messages: Any = [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": f"attachment:{ok}"}},
        {"type": "image", "source": {"type": "url", "url": f"attachment:{gone}"}}]}]
    async with anthropic.AsyncAnthropic() as client:
        if stream:
            async with client.messages.stream(model="m", max_tokens=10, messages=messages) as s:
                assert "".join([t async for t in s.text_stream]) == "tok0 tok1 tok2 tok3 tok4 "
        else:
            message = await client.messages.create(model="m", max_tokens=10, messages=messages)
            assert message.content[0].text == "Hello from the fake upstream."  # type: ignore[union-attr]
        again = await client.messages.create(model="m", max_tokens=10, messages=messages)  # the next turn
        assert again.stop_reason == "end_turn"
    sent = recorded.upstream.received[0]
    assert sent.path_qs == "/v1/messages"
    headers = lower(sent.headers)  # the key from the environment, as this SDK version sends it
    assert "sk-ant-from-env" in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
    blocks = sent.json()["messages"][0]["content"]
    assert blocks[0]["source"] == {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}
    assert blocks[1] == {"type": "text", "text": placeholder(gone)}
    assert recorded.upstream.last.json()["messages"] == sent.json()["messages"]
    assert [c["path"] for c in await recorded_calls(recorded)] == ["/v1/messages", "/v1/messages"]
    assert quarantined(await recorded.events(SESSION)) == [gone]
    assert recorded.store.reads[gone] == 1  # the next turn read the session's log, not the store


async def test_sdks_get_their_own_typed_error_for_a_bad_session_in_the_url(
    recorded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", base(recorded, "/s/a%20b/v1"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", base(recorded, "/s/a%20b"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    async with openai.AsyncOpenAI(max_retries=0) as oai, anthropic.AsyncAnthropic(max_retries=0) as ant:
        with pytest.raises(openai.BadRequestError) as bad_openai:
            await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(anthropic.BadRequestError) as bad_anthropic:
            await ant.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert bad_openai.value.code == "INVALID_SESSION_ID"
    assert bad_anthropic.value.error_code == "INVALID_SESSION_ID"
    assert recorded.upstream.received == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_google_genai_with_the_session_in_its_base_url(recorded: Harness, stream: bool) -> None:
    data = make_image(color=164)
    ok = await recorded.admit(data)
    gone = ref_id(make_image(color=165))
    options = types.HttpOptions(base_url=base(recorded, f"/s/{SESSION}"), api_version="v1beta")
    client = genai.Client(api_key="g-key", http_options=options).aio
    contents = [types.Content(role="user", parts=[
        types.Part.from_uri(file_uri=f"attachment:{ok}", mime_type="image/png"),
        types.Part.from_uri(file_uri=f"attachment:{gone}", mime_type="image/png")])]
    if stream:
        chunks = await client.models.generate_content_stream(model="gemini-2.0-flash", contents=contents)
        assert "".join([c.text or "" async for c in chunks])
    else:
        response = await client.models.generate_content(model="gemini-2.0-flash", contents=contents)
        assert response.text
    sent = recorded.upstream.last
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    assert sent.path_qs == f"/v1beta/models/gemini-2.0-flash:{method}"
    parts = sent.json()["contents"][0]["parts"]
    assert parts[0]["inlineData"]["data"] == base64.b64encode(data).decode()  # the SDK writes camelCase
    assert parts[1] == {"text": placeholder(gone)}
    [call] = await recorded_calls(recorded)
    assert call["upstream"] == "gemini" and call["path"] == f"/v1beta/models/gemini-2.0-flash:{method}"
    assert quarantined(await recorded.events(SESSION)) == [gone]
