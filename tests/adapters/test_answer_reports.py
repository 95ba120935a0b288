"""What an answer reports of itself: usage and model (``adapters.responses.reported``) and the
input/output token counts of any format's usage (``tokens``), table-driven over the four formats,
whole bodies and streams."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from projectionist.adapters import anthropic_messages, gemini, openai_chat, openai_responses
from projectionist.adapters.responses import reported, tokens


def sse(*docs: Any, event_names: bool = False) -> bytes:
    out = b""
    for doc in docs:
        if event_names and isinstance(doc, dict):
            out += b"event: " + str(doc.get("type")).encode() + b"\n"
        out += b"data: " + (doc if isinstance(doc, bytes) else msgspec.json.encode(doc)) + b"\n\n"
    return out


CHAT_STREAM = sse(
    {"object": "chat.completion.chunk", "model": "gpt-4o-2024-08-06", "choices": [{"delta": {"content": "hi"}}]},
    {"object": "chat.completion.chunk", "model": "gpt-4o-2024-08-06", "choices": [],
     "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}},
    b"[DONE]")
MESSAGES_STREAM = sse(
    {"type": "message_start", "message": {"model": "claude-sonnet-4-5", "usage": {
        "input_tokens": 12, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 3, "output_tokens": 1}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "usage is fine"}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 25}},
    {"type": "message_stop"}, event_names=True)
RESPONSES_STREAM = sse(
    {"type": "response.created", "response": {"model": "gpt-5", "usage": None}},
    {"type": "response.output_text.delta", "delta": "x"},
    {"type": "response.completed", "response": {"model": "gpt-5", "usage": {
        "input_tokens": 50, "output_tokens": 20, "total_tokens": 70}}}, event_names=True)
GEMINI_USAGE = {"promptTokenCount": 8, "candidatesTokenCount": 5, "thoughtsTokenCount": 4, "totalTokenCount": 17}
GEMINI_SSE = sse({"candidates": [], "modelVersion": "gemini-2.5-flash"},
                 {"candidates": [], "modelVersion": "gemini-2.5-flash", "usageMetadata": GEMINI_USAGE})


@pytest.mark.parametrize(("fmt", "body", "content_type", "model", "counts"), [
    (openai_chat, msgspec.json.encode({"model": "gpt-4o", "usage": {"prompt_tokens": 10, "completion_tokens": 7}}),
     "application/json", "gpt-4o", (10, 7)),
    (openai_chat, CHAT_STREAM, "text/event-stream; charset=utf-8", "gpt-4o-2024-08-06", (31, 9)),
    (anthropic_messages, msgspec.json.encode({"model": "claude-x", "usage": {"input_tokens": 3, "output_tokens": 4}}),
     "application/json", "claude-x", (3, 4)),
    # the stream's pieces merge: input from message_start, output from message_delta; cache reads
    # and writes are input tokens too
    (anthropic_messages, MESSAGES_STREAM, "text/event-stream", "claude-sonnet-4-5", (115, 25)),
    (openai_responses, RESPONSES_STREAM, "text/event-stream", "gpt-5", (50, 20)),
    (openai_responses, msgspec.json.encode({"model": "gpt-5", "usage": {"input_tokens": 1, "output_tokens": 2}}),
     "application/json", "gpt-5", (1, 2)),
    # thinking is billed as output
    (gemini, GEMINI_SSE, "text/event-stream", "gemini-2.5-flash", (8, 9)),
    (gemini, msgspec.json.encode([{"modelVersion": "gemini-2.5-pro"},
                                  {"modelVersion": "gemini-2.5-pro", "usageMetadata": GEMINI_USAGE}]),
     "application/json", "gemini-2.5-pro", (8, 9)),
])
def test_each_format_reports_its_usage_and_model(fmt: Any, body: bytes, content_type: str, model: str,
                                                  counts: tuple[int, int]) -> None:
    usage, named = reported(fmt.usage, body, content_type)
    assert named == model
    assert tokens(usage) == counts


@pytest.mark.parametrize(("body", "content_type"), [
    (b"", "application/json"),
    (b"<html>bad gateway</html>", "text/html"),
    (msgspec.json.encode({"error": {"message": "no usage here"}}), "application/json"),
    (sse({"choices": [{"delta": {"content": "no usage"}}]}, b"[DONE]"), "text/event-stream"),
    (b"data: {\"usage\": broken json\n\n", "text/event-stream"),
])
def test_answers_without_a_usage_report_none(body: bytes, content_type: str) -> None:
    assert reported(openai_chat.usage, body, content_type) == (None, None)
    assert tokens(None) == (None, None)


def test_a_count_the_usage_does_not_carry_stays_unknown() -> None:
    assert tokens({"input_tokens": 5}) == (5, None)
    assert tokens({"input_tokens": True, "output_tokens": "7"}) == (None, None)  # not counts


def test_the_counts_add_what_a_provider_bills_apart_and_only_counts() -> None:
    """Cache reads and writes are input, thinking is output; a member that is no count adds nothing."""
    assert tokens({"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 7}) == (12, 1)
    assert tokens({"input_tokens": 5, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 2}) == (14, None)
    assert tokens({"input_tokens": 5, "cache_read_input_tokens": True, "cache_creation_input_tokens": "2"}) == (5, None)
    assert tokens({"prompt_tokens": 3, "completion_tokens": 4, "thoughtsTokenCount": 9}) == (3, 13)
