"""The official ``openai`` and ``anthropic`` SDKs, unmodified, pointed at the proxy."""

from __future__ import annotations

import base64
from typing import Any

import anthropic
import openai
import pytest

from projectionist.policy.errors import NOT_FOUND, READ_FAILED
from tests.conftest import BACKENDS, Harness
from tests.fakes import fail_with
from tests.imaging import make_image, ref_id

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


def openai_client(harness: Harness, session: str | None = "sdk", **kw: Any) -> openai.AsyncOpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.AsyncOpenAI(base_url=str(harness.client.make_url("/v1")), api_key="sk-client",
                              default_headers=headers, **kw)


def anthropic_client(harness: Harness, session: str | None = "sdk", **kw: Any) -> anthropic.AsyncAnthropic:
    headers = {"X-Session-Id": session} if session else {}
    return anthropic.AsyncAnthropic(base_url=str(harness.client.make_url("")), api_key="sk-ant-client",
                                    default_headers=headers, **kw)


def chat_messages(*ids: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "describe"}]
    parts += [{"type": "image_url", "image_url": {"url": f"attachment:{i}"}} for i in ids]
    return [{"role": "user", "content": parts}]


def anthropic_messages(*ids: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "describe"}]
    blocks += [{"type": "image", "source": {"type": "url", "url": f"attachment:{i}"}} for i in ids]
    return [{"role": "user", "content": blocks}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_openai_sdk_healthy_and_missing_references(harness: Harness, stream: bool) -> None:
    data = make_image(color=40)
    ok = await harness.admit(data)
    gone = ref_id(make_image(color=41))
    async with openai_client(harness) as client:
        if stream:
            chunks = await client.chat.completions.create(model="m", messages=chat_messages(ok, gone), stream=True)  # type: ignore[arg-type]
            text = "".join([c.choices[0].delta.content or "" async for c in chunks])
            assert text == "tok1 tok2 tok3 tok4 "
        else:
            completion = await client.chat.completions.create(model="m", messages=chat_messages(ok, gone))  # type: ignore[arg-type]
            assert completion.choices[0].message.content == "Hello from the fake upstream."
    sent = harness.upstream.last
    assert sent.headers["Authorization"] == "Bearer sk-client"
    parts = sent.json()["messages"][0]["content"]
    assert parts[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(data).decode()
    assert parts[2] == {"type": "text", "text": f"[image unavailable: not_found ({gone[:15]})]"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_anthropic_sdk_healthy_and_missing_references(harness: Harness, stream: bool) -> None:
    data = make_image(color=42)
    ok = await harness.admit(data)
    gone = ref_id(make_image(color=43))
    async with anthropic_client(harness) as client:
        if stream:
            async with client.messages.stream(model="m", max_tokens=10, messages=anthropic_messages(ok, gone)) as s:  # type: ignore[arg-type]
                text = "".join([t async for t in s.text_stream])
            assert text == "tok0 tok1 tok2 tok3 tok4 "
        else:
            message = await client.messages.create(model="m", max_tokens=10, messages=anthropic_messages(ok, gone))  # type: ignore[arg-type]
            assert message.content[0].text == "Hello from the fake upstream."  # type: ignore[union-attr]
    blocks = harness.upstream.last.json()["messages"][0]["content"]
    assert blocks[1]["source"] == {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}
    assert blocks[2] == {"type": "text", "text": f"[image unavailable: not_found ({gone[:15]})]"}


async def test_openai_sdk_raises_typed_errors_with_the_code(harness: Harness) -> None:
    gone = ref_id(make_image(color=44))
    async with openai_client(harness, session=None, max_retries=0) as client:
        with pytest.raises(openai.UnprocessableEntityError) as missing:
            await client.chat.completions.create(model="m", messages=chat_messages(gone))  # type: ignore[arg-type]
        assert missing.value.status_code == 422 and missing.value.code == NOT_FOUND
        ok = await harness.admit(color=45)
        harness.store.script = fail_with(READ_FAILED)
        with pytest.raises(openai.InternalServerError) as flaky:
            await client.chat.completions.create(model="m", messages=chat_messages(ok), stream=True)  # type: ignore[arg-type]
        assert flaky.value.status_code == 503 and flaky.value.code == READ_FAILED
    assert harness.upstream.received == []


async def test_anthropic_sdk_raises_typed_errors_with_the_code(harness: Harness) -> None:
    gone = ref_id(make_image(color=46))
    async with anthropic_client(harness, session=None, max_retries=0) as client:
        with pytest.raises(anthropic.UnprocessableEntityError) as missing:
            await client.messages.create(model="m", max_tokens=10, messages=anthropic_messages(gone))  # type: ignore[arg-type]
        assert missing.value.status_code == 422
        assert missing.value.error_code == NOT_FOUND
        assert missing.value.type == "invalid_request_error"
        ok = await harness.admit(color=47)
        harness.store.script = fail_with(READ_FAILED)
        with pytest.raises(anthropic.InternalServerError) as flaky:
            await client.messages.create(model="m", max_tokens=10, messages=anthropic_messages(ok), stream=True)  # type: ignore[arg-type]
        assert flaky.value.status_code == 503 and flaky.value.error_code == READ_FAILED
    assert harness.upstream.received == []


async def test_anthropic_sdk_file_id_reference_and_bad_reference(harness: Harness) -> None:
    ok = await harness.admit(color=48)
    async with anthropic_client(harness, max_retries=0) as client:
        await client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "file", "file_id": ok}}]}])  # type: ignore[list-item]
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "file", "file_id": "sha256:zz"}}]}])  # type: ignore[list-item]
    assert bad.value.error_code == "INVALID_ATTACHMENT_REF"
    assert harness.upstream.last.json()["messages"][0]["content"][0]["source"]["type"] == "base64"


def chat_tool_messages(*ids: str) -> list[dict[str, Any]]:
    """A tool call and its result, whose content list carries the image references."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": "screenshot taken"}]
    parts += [{"type": "image_url", "image_url": {"url": f"attachment:{i}"}} for i in ids]
    return [{"role": "user", "content": "take a screenshot"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": parts}]


def anthropic_tool_messages(*ids: str) -> list[dict[str, Any]]:
    """A tool use and its ``tool_result``, whose content list carries the image references."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "screenshot taken"}]
    blocks += [{"type": "image", "source": {"type": "url", "url": f"attachment:{i}"}} for i in ids]
    return [{"role": "user", "content": "take a screenshot"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": blocks}]}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_openai_sdk_tool_message_image_references(harness: Harness, stream: bool) -> None:
    data = make_image(color=50)
    ok = await harness.admit(data)
    gone = ref_id(make_image(color=51))
    messages = chat_tool_messages(ok, gone)
    async with openai_client(harness) as client:
        if stream:
            chunks = await client.chat.completions.create(model="m", messages=messages, stream=True)  # type: ignore[arg-type]
            text = "".join([c.choices[0].delta.content or "" async for c in chunks])
            assert text == "tok1 tok2 tok3 tok4 "
        else:
            completion = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            assert completion.choices[0].message.content == "Hello from the fake upstream."
    sent = harness.upstream.last
    assert sent.path_qs == "/v1/chat/completions"
    assert sent.headers["Authorization"] == "Bearer sk-client"
    upstream_messages = sent.json()["messages"]
    assert upstream_messages[:2] == messages[:2]
    assert upstream_messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": [
        {"type": "text", "text": "screenshot taken"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}},
        {"type": "text", "text": f"[image unavailable: not_found ({gone[:15]})]"}]}
    assert harness.store.reads == {ok: 1, gone: 1}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_anthropic_sdk_tool_result_image_references(harness: Harness, stream: bool) -> None:
    data = make_image(color=52)
    ok = await harness.admit(data)
    gone = ref_id(make_image(color=53))
    messages = anthropic_tool_messages(ok, gone)
    async with anthropic_client(harness) as client:
        if stream:
            async with client.messages.stream(model="m", max_tokens=10, messages=messages) as s:  # type: ignore[arg-type]
                text = "".join([t async for t in s.text_stream])
            assert text == "tok0 tok1 tok2 tok3 tok4 "
        else:
            message = await client.messages.create(model="m", max_tokens=10, messages=messages)  # type: ignore[arg-type]
            assert message.content[0].text == "Hello from the fake upstream."  # type: ignore[union-attr]
    sent = harness.upstream.last
    assert sent.path_qs == "/v1/messages"
    upstream_messages = sent.json()["messages"]
    assert upstream_messages[:2] == messages[:2]
    assert upstream_messages[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "text", "text": "screenshot taken"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(data).decode()}},
            {"type": "text", "text": f"[image unavailable: not_found ({gone[:15]})]"}]}]}
    assert harness.store.reads == {ok: 1, gone: 1}
