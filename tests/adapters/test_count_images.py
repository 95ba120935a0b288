"""``count_images`` per adapter (pure): every image part of a request body, whatever its source
(a reference the proxy projects, a client-inlined image, an http(s) URL, a provider file id), in
the places ``find_refs`` scans; never fewer than the references it finds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from projectionist.adapters import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from projectionist.adapters.base import WireFormat, refs
from projectionist.adapters.registry import ADAPTERS
from tests.paths import GOLDEN

REF = "attachment:sha256:" + "a" * 64
FILE_ID = "sha256:" + "b" * 64
DATA = "data:image/png;base64,iVBORw0KGgo="
URL = "https://example.com/cat.png"

CHAT = {"model": "m", "messages": [
    {"role": "system", "content": "text only"},
    {"role": "user", "content": [
        {"type": "text", "text": REF},
        {"type": "image_url", "image_url": {"url": REF, "detail": "low"}},       # 1 reference
        {"type": "image_url", "image_url": {"url": DATA}},                       # 2 inlined
        {"type": "image_url", "image_url": URL},                                 # 3 bare-string URL
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ]},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "image_url", "image_url": {"url": URL}}]},  # 4
    "not a message",
]}

RESPONSES = {"model": "m", "prompt": {"id": "p", "variables": {
    "shot": {"type": "input_image", "image_url": REF},                           # 1 reference
    "city": "Paris",
    "doc": {"type": "input_file", "file_id": "file-x"},
}}, "input": [
    {"role": "developer", "content": "text only"},
    {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "file_id": FILE_ID},                             # 2 reference (file id)
        {"type": "input_image", "image_url": DATA},                              # 3 inlined
        {"type": "input_image", "image_url": URL},                               # 4 URL
        {"type": "input_image", "file_id": "file-provider123"},                  # 5 provider file id
        {"type": "input_file", "file_data": "data:application/pdf;base64,JVBER"},
    ]},
    {"type": "function_call_output", "call_id": "c1", "output": [
        {"type": "input_text", "text": "shot"}, {"type": "input_image", "image_url": DATA}]},  # 6
    {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_image", "image_url": REF}]},  # 7
    {"type": "function_call_output", "call_id": "c3", "output": "a string"},
    {"type": "computer_call_output", "call_id": "c4",
     "output": {"type": "computer_screenshot", "image_url": DATA}},              # 8 screenshot
    {"type": "computer_call_output", "call_id": "c5", "output": {"type": "other"}},
]}

ANTHROPIC = {"model": "m", "max_tokens": 1, "messages": [
    {"role": "user", "content": "text only"},
    {"role": "user", "content": [
        {"type": "text", "text": REF},
        {"type": "image", "source": {"type": "url", "url": REF}},                # 1 reference
        {"type": "image", "source": {"type": "file", "file_id": FILE_ID}},       # 2 reference (file id)
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},  # 3
        {"type": "image", "source": {"type": "url", "url": URL}},                # 4 URL
        {"type": "image", "source": {"type": "file", "file_id": "file_011"}},    # 5 provider file id
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}},
    ]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "text", "text": "shot"},
        {"type": "image", "source": {"type": "url", "url": URL}},                # 6 nested
        {"type": "image", "source": {"type": "url", "url": REF}},                # 7 nested reference
    ]}, {"type": "tool_result", "tool_use_id": "t2", "content": "a string"}]},
]}

GEMINI = {"contents": [
    {"role": "user", "parts": [
        {"text": REF},
        {"file_data": {"mime_type": "image/png", "file_uri": REF}},              # 1 reference
        {"fileData": {"fileUri": REF}},                                          # 2 reference, no mime type
        {"inline_data": {"mime_type": "image/png", "data": "iVBORw0KGgo="}},      # 3 inlined
        {"inlineData": {"mimeType": "IMAGE/JPEG", "data": "/9j/"}},               # 4 inlined, camelCase
        {"fileData": {"mimeType": "image/webp", "fileUri": URL}},                 # 5 URL
        {"file_data": {"mime_type": "application/pdf", "file_uri": "https://example.com/a.pdf"}},
        {"inline_data": {"mime_type": "audio/wav", "data": "AAAA"}},
    ]},
    {"role": "user", "parts": [{"functionResponse": {"name": "shot", "response": {}, "parts": [
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},         # 6 nested
        {"file_data": {"mime_type": "image/png", "file_uri": REF}},               # 7 nested reference
    ]}}]},
    {"role": "model"},
]}

CASES: list[tuple[WireFormat, Any, int]] = [
    (openai_chat, CHAT, 4), (openai_responses, RESPONSES, 8), (anthropic_messages, ANTHROPIC, 7), (gemini, GEMINI, 7)]


@pytest.mark.parametrize(("adapter", "body", "count"), CASES, ids=lambda v: getattr(v, "NAME", ""))
def test_every_image_part_is_counted_whatever_its_source(adapter: WireFormat, body: Any, count: int) -> None:
    assert adapter.count_images(body) == count
    assert count > len(refs(adapter.find_slots(body))) > 0


@pytest.mark.parametrize("adapter", list(ADAPTERS.values()), ids=lambda a: a.NAME)
@pytest.mark.parametrize("body", [None, 3, "text", [], {}, {"messages": "x", "input": 1, "contents": {}},
                                  {"messages": [{"content": [None, 1]}], "input": [None], "contents": [None]}])
def test_a_body_without_images_counts_none(adapter: WireFormat, body: Any) -> None:
    assert adapter.count_images(body) == 0


def test_a_batch_counts_no_images_of_its_own() -> None:
    """A batch's requests are each under the limits on their own: no one count of the body applies."""
    batch = {"requests": [{"custom_id": "a", "params": ANTHROPIC}, {"custom_id": "b", "params": ANTHROPIC}]}
    assert anthropic_batches.count_images(batch) == 0
    assert len(refs(anthropic_batches.find_slots(batch))) == 2 * len(refs(anthropic_messages.find_slots(ANTHROPIC)))


@pytest.mark.parametrize("name", [n for n in ADAPTERS if n != "anthropic_batches"])
def test_no_fewer_than_the_references_in_a_golden_request(name: str) -> None:
    adapter = ADAPTERS[name]
    body = json.loads((GOLDEN / f"{name}.request.json").read_text(encoding="utf-8"))
    found = len(refs(adapter.find_slots(body)))
    assert found > 0 and adapter.count_images(body) >= found


def test_no_fewer_than_the_references_in_each_request_of_the_golden_batch() -> None:
    batch = json.loads((GOLDEN / "anthropic_batches.request.json").read_text(encoding="utf-8"))
    params = [request["params"] for request in batch["requests"]]
    assert sum(len(refs(anthropic_messages.find_slots(p))) for p in params) > 0
    for body in params:
        assert anthropic_messages.count_images(body) >= len(refs(anthropic_messages.find_slots(body)))
