"""Reading an upstream's error can neither crash nor stall (pure): ``rejection`` is total over every
JSON value on every adapter, odd indexes in error paths name no part, and each adapter's refusal
patterns stay linear on a megabyte of text built to make them backtrack."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projectionist.adapters import anthropic_messages, gemini, openai_chat
from projectionist.adapters.base import SCAN_CHARS, WireFormat, known_pattern, part_pointer
from projectionist.adapters.registry import ADAPTERS
from projectionist.policy.profile import Rejection

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
#: Paths shaped like the ones providers send, with odd "digits" among the indexes, and loose
#: pieces, so the generated errors reach the pointer reading, not only the "not a refusal" return.
INDEXES = st.sampled_from(["0", "7", "123456789", "1234567890", "9" * 5000, "\u00b2", "\u0663", "\uff11", "x"])
STEPS = st.sampled_from(["messages", "content", "contents", "parts", "input", "output", "tool_result", "image",
                         "source", "base64", "data", "inline_data", "image_url", "", "[", "]", ":"])
DOTTED = st.builds("{}.{}.{}.{}.{}".format, st.sampled_from(["messages", "contents", "input"]), INDEXES,
                   st.sampled_from(["content", "parts", "output"]), INDEXES, st.sampled_from(["image", "inline_data"]))
BRACKETED = st.builds("{}[{}].{}[{}].image_url".format, st.sampled_from(["messages", "input"]), INDEXES,
                      st.sampled_from(["content", "output"]), INDEXES)
PATHS = DOTTED | BRACKETED | st.lists(STEPS | INDEXES, max_size=12).map(".".join)
CAUSES = st.sampled_from(["Could not process image", "invalid base64 data", "Invalid image.",
                          "Provided image is not valid", "Base64 decoding failed"])
MESSAGES = st.one_of(
    st.builds("{}: {}".format, PATHS, CAUSES),
    st.builds("Invalid value at '{}' (TYPE_BYTES), Base64 decoding failed".format, PATHS),
    st.text(),
)
ERRORS = st.one_of(
    st.builds(lambda m: {"type": "error", "error": {"type": "invalid_request_error", "message": m}}, MESSAGES),
    st.builds(lambda m, p, c: {"error": {"message": m, "param": p, "code": c}}, MESSAGES, PATHS | JSON,
              st.sampled_from(["invalid_image_format", None]) | JSON),
    st.builds(lambda m: [{"error": {"code": 400, "message": m, "status": "INVALID_ARGUMENT"}}], MESSAGES),
    MESSAGES,
    JSON,
)


@settings(max_examples=400, deadline=None)
@given(status=st.sampled_from([400, 413, 415, 422]), doc=ERRORS)
def test_rejection_never_raises_on_any_json_value(status: int, doc: Any) -> None:
    for adapter in ADAPTERS.values():
        found = adapter.rejection(status, doc)
        assert found is None or isinstance(found, Rejection)


@pytest.mark.parametrize("path", [
    "messages.0.content.\u00b2.image",          # superscript two: str.isdigit, not int()
    "messages.\u0663.content.1.image",          # Arabic-Indic three
    "messages.0.content.\uff11.image",          # fullwidth one
    "messages.1234567890.content.1.image",      # ten digits
    "messages." + "9" * 5000 + ".content.1.image",
    "messages.0.content.1.image." + "x" * SCAN_CHARS,
])
def test_an_odd_index_names_no_part(path: str) -> None:
    assert part_pointer(path, frozenset({"messages"}), frozenset({"content"})) is None


def test_nine_ascii_digits_still_name_a_part() -> None:
    path = "messages.123456789.content.0.image"
    assert part_pointer(path, frozenset({"messages"}), frozenset({"content"})) == "/messages/123456789/content/0"


MB = 1_000_000
#: Text each adapter's patterns could backtrack over: their literal openings repeated, without the
#: delimiter that would end a run.
HOSTILE: dict[str, list[str]] = {
    "anthropic_messages": ["image.source.base64", "image.source.base64.data", "messages.0.content.",
                           "The image was specified using the ", "Image format ", "image exceeds 9"],
    "openai_chat": ["Total image size is 1.", "Invalid image", "messages[0].content[1].",
                    "patches after processing, exceeding the limit of 9"],
    "gemini": ["Invalid value at '", "Invalid value at 'a.inline_data.data", ".inline_data.data",
               "Unsupported MIME type: image/"],
}
BY_NAME: dict[str, WireFormat] = {"anthropic_messages": anthropic_messages, "openai_chat": openai_chat,
                                  "gemini": gemini}


def repeated(fragment: str, size: int) -> str:
    return (fragment * (size // len(fragment) + 1))[:size]


def error_docs(message: str) -> list[Any]:
    return [{"type": "error", "error": {"type": "invalid_request_error", "message": message}},
            {"error": {"message": message, "param": message, "code": None}},
            {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_megabyte_of_hostile_text_is_read_quickly(name: str) -> None:
    adapter = BY_NAME[name]
    for fragment in HOSTILE[name]:
        for message in (repeated(fragment, MB), fragment + " " + repeated("x", MB)):
            for doc in error_docs(message):
                started = time.perf_counter()
                adapter.rejection(400, doc)
                elapsed = time.perf_counter() - started
                assert elapsed < 0.5, f"{name} took {elapsed:.2f} s on {fragment!r} repeated"  # ~10 ms linear


@pytest.mark.parametrize("name", HOSTILE)
def test_the_patterns_themselves_are_linear(name: str) -> None:
    """Uncut, on 256 KB: linear takes tens of ms; the old quadratic Anthropic pattern took seconds."""
    pattern = known_pattern(BY_NAME[name].REJECTIONS)  # type: ignore[attr-defined]
    for fragment in HOSTILE[name]:
        started = time.perf_counter()
        pattern.search(repeated(fragment, 256_000))
        elapsed = time.perf_counter() - started
        assert elapsed < 0.5, f"{name}'s patterns took {elapsed:.2f} s on {fragment!r} repeated"


def test_only_the_head_of_a_message_is_read_but_all_of_it_is_kept() -> None:
    tail = repeated("x", MB)
    message = "messages.0.content.1.image: Could not process image " + tail
    found = anthropic_messages.rejection(400, error_docs(message)[0])
    assert found is not None and found.site == "/messages/0/content/1" and found.message.endswith(tail)
    assert anthropic_messages.rejection(400, error_docs("x" * SCAN_CHARS + " Could not process image")[0]) is None
    assert openai_chat.rejection(400, error_docs("x" * SCAN_CHARS + " You uploaded an unsupported image")[1]) is None
    assert gemini.rejection(400, error_docs("x" * SCAN_CHARS + " Provided image is not valid")[2]) is None


def test_an_absurd_anthropic_path_cannot_push_the_cause_out_of_view() -> None:
    message = "messages." + "9" * 5000 + ".content.0.image.source.base64.data: invalid base64 data"
    found = anthropic_messages.rejection(400, error_docs(message)[0])
    assert found is not None and found.site is None
