"""The adapters find the images a client inlined itself, the session a body names, and a
conversation's opening, in every wire format (pure tables)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from projectionist.adapters import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from projectionist.adapters.base import WireFormat, data_url_base64, inlined
from projectionist.policy.model import ImageRef, Placeholder

B64 = base64.b64encode(b"\x89PNG a client's own image bytes").decode()
URL = f"data:image/png;base64,{B64}"


def chat() -> dict[str, Any]:
    return {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": URL, "detail": "high"}},
                                     {"type": "image_url", "image_url": "https://example.com/a.png"}]},
        {"role": "tool", "content": [{"type": "image_url", "image_url": URL}]}]}


def responses() -> dict[str, Any]:
    return {"instructions": "be brief", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "look"},
                                     {"type": "input_image", "image_url": URL, "detail": "auto"}]},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": URL}]},
        {"type": "computer_call_output", "call_id": "d", "output": {"type": "computer_screenshot", "image_url": URL}}]}


def anthropic() -> dict[str, Any]:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    return {"system": "be brief", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"}, image,
                                     {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [dict(image)]}]}]}


def gemini_body() -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [
        {"text": "look"}, {"inline_data": {"mime_type": "image/png", "data": B64}},
        {"inlineData": {"mimeType": "image/png", "data": B64}},
        {"inline_data": {"mime_type": "application/pdf", "data": B64}},
        {"functionResponse": {"name": "f", "parts": [{"inlineData": {"mimeType": "image/png", "data": B64}}]}}]}]}


CASES = [(openai_chat, chat, 2), (openai_responses, responses, 3), (anthropic_messages, anthropic, 2),
         (gemini, gemini_body, 3)]


@pytest.mark.parametrize(("fmt", "body", "count"), CASES, ids=lambda v: getattr(v, "NAME", ""))
def test_every_base64_image_is_found_with_its_place_and_its_value(fmt: WireFormat, body: Any, count: int) -> None:
    tree = body()
    found = inlined(fmt.find_slots(tree))
    assert len(found) == count
    for image in found:
        assert image.data == B64
        assert image.holder[image.key] is image.value  # the very string in the tree
        assert image.value in (URL, B64)


@pytest.mark.parametrize(("fmt", "body", "count"), CASES, ids=lambda v: getattr(v, "NAME", ""))
def test_a_placeholder_replaces_the_part_and_nothing_else(fmt: WireFormat, body: Any, count: int) -> None:
    tree = body()
    found = inlined(fmt.find_slots(tree))
    sites = [image.site(ImageRef("sha256:" + "a" * 64)) for image in found]
    fmt.render(sites, tuple(Placeholder("rejected", f"[gone {i}]") for i in range(len(sites))))
    text = json.dumps(tree)
    assert B64 not in text or fmt is gemini  # gemini: the pdf part is no image and stays
    assert all(f"[gone {i}]" in text for i in range(len(sites)))
    # a screenshot slot cannot hold text: it holds the blank image, the text follows it
    assert [image.value for image in inlined(fmt.find_slots(tree))] == ([openai_responses.BLANK_PNG]
                                                                if fmt is openai_responses else [])


def test_a_batch_finds_the_images_of_every_request() -> None:
    body = {"requests": [{"custom_id": "a", "params": anthropic()}, {"custom_id": "b", "params": anthropic()}]}
    assert len(inlined(anthropic_batches.find_slots(body))) == 4
    assert anthropic_batches.opening(body) is None and anthropic_batches.session_hint(body) is None


@pytest.mark.parametrize("url", ["data:image/png;base64,QUJD", "data:;base64,QUJD", "data:image/png;name=a.png;base64,QUJD"])
def test_data_urls_give_their_base64(url: str) -> None:
    assert data_url_base64(url) == "QUJD"


@pytest.mark.parametrize("url", ["data:image/png,QUJD", "https://x/y.png", "attachment:sha256:" + "a" * 64, "data:"])
def test_other_urls_give_none(url: str) -> None:
    assert data_url_base64(url) is None


UUID = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"


@pytest.mark.parametrize(("user_id", "expected"), [
    (f"user_{'a' * 64}_account__session_{UUID}", UUID),  # Claude Code 1.0.x
    (f"user_{'a' * 64}_account_{UUID}_session_Z{UUID}", None),  # not a uuid shape: no hint
    (json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": UUID}), UUID),  # 2.1.x
    ("someone@example.com", None),
    ("{not json", None),
    (json.dumps({"session_id": 7}), None),
])
def test_claude_codes_session_in_metadata_user_id(user_id: str, expected: str | None) -> None:
    hint = anthropic_messages.session_hint({"metadata": {"user_id": user_id}, "messages": []})
    assert hint == (("claude-code", expected) if expected else None)


def test_a_responses_body_names_its_conversation_else_its_prompt_cache_key() -> None:
    assert openai_responses.session_hint({"conversation": "conv_1", "prompt_cache_key": "k"}) == ("conversation", "conv_1")
    assert openai_responses.session_hint({"conversation": {"id": "conv_2"}}) == ("conversation", "conv_2")
    assert openai_responses.session_hint({"prompt_cache_key": UUID}) == ("cache-key", UUID)
    assert openai_responses.session_hint({"input": "hi"}) is None
    assert openai_chat.session_hint(chat()) is None and gemini.session_hint(gemini_body()) is None


def test_the_opening_is_what_every_later_turn_resends() -> None:
    later = chat()
    later["messages"].append({"role": "assistant", "content": "a cat"})
    assert openai_chat.opening(later) == openai_chat.opening(chat()) == chat()["messages"][:2]
    assert anthropic_messages.opening(anthropic()) == ["be brief", anthropic()["messages"][0]]
    assert openai_responses.opening({"input": "hi", "instructions": "x"}) == ["x", "hi"]
    assert gemini.opening(gemini_body()) == [None, gemini_body()["contents"][0]]
    assert openai_chat.opening({"messages": [{"role": "system", "content": "x"}]}) is None
