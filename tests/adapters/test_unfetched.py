"""Images the provider fetches by URL, per adapter (pure): where each format carries one
(``find_urls``), every known "could not download / fetch" answer (with the report it was seen in)
read as the URL's failure and the part it names, and the answers that are not about a download
(a refusal of an image's content, other errors) kept apart."""

from __future__ import annotations

import re
from typing import Any

import pytest

from projectionist.adapters import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from projectionist.adapters.base import FetchAnswers, KnownFetch, WireFormat, links
from projectionist.adapters.registry import ADAPTERS
from projectionist.policy.model import HttpRefs
from projectionist.policy.profile import Rejection

A, O, G = anthropic_messages, openai_chat, gemini
SIGNED = ("https://bucket.s3.amazonaws.com/u/1/cat.png?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=300"
          "&X-Amz-Signature=5f1e0c6a9d")


def anthropic_error(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}, "request_id": "req_1"}


def openai_error(message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def google_error(message: str) -> dict[str, Any]:
    return {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}


# --- every known answer: (adapter, body, the site it names, what it says, where it was seen) ---

UNFETCHED: list[tuple[WireFormat, Any, str | None, str, str]] = [
    (O, openai_error(f"Error while downloading {SIGNED}.", "invalid_image_url"), None, "not_found",
     "https://github.com/openai/openai-python/pull/2790"),
    (O, openai_error("Error while downloading https://files.gumroad.com/bad.psd.", "invalid_image_url"), None,
     "not_found", "https://github.com/rashadwest/Sportstechwest/blob/HEAD/workflows/BallCODE-Book/EXEC-91-FIX.md"),
    (O, openai_error(f"Timeout while downloading {SIGNED}", "invalid_value", "url"), None, "read_failed",
     "https://github.com/vercel/ai/issues/8857"),
    (O, openai_error(f"Timeout while downloading {SIGNED}."), None, "read_failed",
     "https://github.com/crmne/ruby_llm/issues/135"),
    (O, openai_error("Failed to download image from =. Image URL is invalid."), None, "not_found",
     "https://github.com/rashadwest/Sportstechwest/blob/HEAD/workflows/BallCODE-Book/FIX-IMAGE-URL-EXPRESSION.md"),
    (O, openai_error("The provided image url is not accessible.", "url_access_error"), None, "not_found",
     "https://portkey.ai/collection/url-access-error-10057"),
    (O, openai_error("<400> InternalError.Algo.InvalidParameter: Failed to download multimodal content",
                     "invalid_parameter_error"), None, "not_found",
     "https://github.com/agentscope-ai/agentscope-java/issues/2700"),
    (O, openai_error("Invalid image URL.", "invalid_image_url", "messages[2].content[1].image_url"),
     "/messages/2/content/1", "not_found",
     "synthetic message, the code alone: https://github.com/BerriAI/litellm/issues/8709"),
    (A, anthropic_error("messages.0.content.1.image.source.url: Unable to download the file. Please verify the URL "
                        "and try again."), "/messages/0/content/1", "not_found", "(public test suites, no address)"),
    (A, anthropic_error("messages.4.content.0.tool_result.content.2.image.source.url: This URL is disallowed by the "
                        "website's robots.txt file"), "/messages/4/content/0/content/2", "not_found",
     "https://github.com/vercel/ai/issues/6279"),
    (G, google_error("Cannot fetch content from the provided URL."), None, "read_failed",
     "https://github.com/googleapis/js-genai/issues/1385"),
    (G, google_error("Invalid or unsupported file uri: https://upload.wikimedia.org/wikipedia/commons/4/4d/Cat.jpg"),
     None, "not_found", "https://github.com/BoundaryML/baml/issues/1548"),
]


def _message(body: Any) -> str:
    return str(body["error"]["message"])


@pytest.mark.parametrize(("adapter", "body", "site", "failure", "source"), UNFETCHED, ids=[r[4] for r in UNFETCHED])
def test_a_known_download_failure_is_read_as_the_urls_failure(adapter: WireFormat, body: Any, site: str | None,
                                                              failure: str, source: str) -> None:
    assert adapter.rejection(400, body) == Rejection(_message(body), site, failure)  # type: ignore[arg-type]


@pytest.mark.parametrize(("table", "adapter"), [(A.UNFETCHED, A), (O.UNFETCHED, O), (G.UNFETCHED, G)],
                         ids=["anthropic", "openai", "gemini"])
def test_every_known_answer_has_a_case_here_and_its_source(table: tuple[KnownFetch, ...], adapter: WireFormat) -> None:
    for pattern, failure, source in table:
        # one answer is seen only quoted in test suites without a public address: it says so
        assert source.startswith("https://") or source == "(public test suites, no address)", source
        cases = [(_message(body), said) for a, body, _, said, _ in UNFETCHED if a is adapter]
        assert any(re.search(pattern, text, re.IGNORECASE) and said == failure for text, said in cases), pattern


def test_the_responses_adapter_reads_openais_answers() -> None:
    body = openai_error(f"Timeout while downloading {SIGNED}", "invalid_value", "url")
    assert openai_responses.rejection(400, body) == Rejection(_message(body), None, "read_failed")


def test_the_first_known_answer_decides() -> None:
    answers = FetchAnswers((("gone", "not_found", "https://a"), ("gone for now", "read_failed", "https://b")))
    assert answers.failure("it is gone for now") == "not_found"
    assert answers.failure("slow") is None
    assert answers.failure("x" * 5000 + " gone") is None  # past what is read


NOT_DOWNLOADS: list[tuple[WireFormat, int, Any, str | None]] = [
    # refusals of an image's content stay refusals of its content
    (A, 400, anthropic_error("messages.0.content.1.image.source.base64: image exceeds 5 MB maximum"), "rejected"),
    (A, 400, anthropic_error("Could not process image"), "rejected"),
    (O, 400, openai_error("Invalid image."), "rejected"),
    (O, 400, openai_error("You uploaded an unsupported image.", "invalid_image_format"), "rejected"),
    (G, 400, google_error("Unable to process input image."), "rejected"),
    # a download failure in another status is no answer of the known kind
    (O, 500, openai_error(f"Error while downloading {SIGNED}."), None),
    (O, 429, openai_error(f"Timeout while downloading {SIGNED}", "rate_limit_exceeded"), None),
    (G, 503, google_error("Cannot fetch content from the provided URL."), None),
    (A, 500, anthropic_error("Unable to download the file."), None),
    # the words elsewhere than where the provider puts them
    (O, 400, openai_error("Your prompt mentions: Error while downloading https://x/a.png"), None),
    # other errors
    (O, 400, openai_error("Invalid 'messages[1].content': string too long.", "string_above_max_length"), None),
    (G, 400, google_error("Invalid or unsupported file uri: files/abc-123"), None),
    (A, 400, anthropic_error("messages: text content blocks must be non-empty"), None),
]


@pytest.mark.parametrize(("adapter", "status", "body", "failure"), NOT_DOWNLOADS)
def test_answers_that_are_no_download_failure(adapter: WireFormat, status: int, body: Any, failure: str | None) -> None:
    found = adapter.rejection(status, body)
    assert (found.failure if found is not None else None) == failure


def test_a_batch_call_never_answers_with_a_download_failure() -> None:
    for _, body, _, _, _ in UNFETCHED:
        assert anthropic_batches.rejection(400, body) is None


# --- where each format carries an image the provider fetches ------------------------------------

PROXY = HttpRefs.of("https://proxy.example")
REF_URL = "https://proxy.example/v1/attachments/sha256:" + "a" * 64


def test_chat_finds_image_urls_the_provider_fetches() -> None:
    body = {"messages": [
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": SIGNED, "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="}},
            {"type": "image_url", "image_url": {"url": "attachment:sha256:" + "b" * 64}},
            {"type": "image_url", "image_url": {"url": REF_URL}},
            {"type": "image_url", "image_url": "HTTP://legacy.example/a.png"},
            {"type": "text", "text": "https://not.an.image/"}]},
        {"role": "tool", "tool_call_id": "t", "content": [
            {"type": "image_url", "image_url": {"url": "https://proxy.example/other/x.png"}}]}]}
    found = links(openai_chat.find_slots(body, PROXY))
    assert [(link.url, link.index) for link in found] == [
        (SIGNED, 0), ("HTTP://legacy.example/a.png", 4), ("https://proxy.example/other/x.png", 0)]
    assert found[0].parent is body["messages"][0]["content"]
    assert links(openai_chat.find_slots(body))[1].url == REF_URL  # without the proxy's URL it is an ordinary URL


def test_responses_finds_input_images_and_screenshots() -> None:
    body = {"input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": SIGNED},
                                     {"type": "input_image", "file_id": "file-abc"}]},
        {"type": "computer_call_output", "call_id": "c", "output": {
            "type": "computer_screenshot", "image_url": "https://shots.example/1.png"}},
        {"type": "function_call_output", "call_id": "f", "output": [
            {"type": "input_image", "image_url": "https://tools.example/chart.webp"}]}],
        "prompt": {"id": "p", "variables": {"logo": {"type": "input_image", "image_url": "https://cdn.example/l.gif"}}}}
    found = links(openai_responses.find_slots(body))
    assert [link.url for link in found] == ["https://cdn.example/l.gif", SIGNED, "https://shots.example/1.png",
                                            "https://tools.example/chart.webp"]
    assert found[2].host == (body["input"], 1)  # a screenshot slot cannot hold text


def test_anthropic_finds_url_sources_of_image_blocks_only() -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": SIGNED}},
        {"type": "document", "source": {"type": "url", "url": "https://docs.example/a.pdf"}},
        {"type": "image", "source": {"type": "url", "url": "attachment:sha256:" + "c" * 64}},
        {"type": "image", "source": {"type": "file", "file_id": "file_011"}},
        {"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://tools.example/t.png"}}]}]}]}
    assert [link.url for link in links(anthropic_messages.find_slots(body))] == [SIGNED, "https://tools.example/t.png"]
    batch = {"requests": [{"custom_id": "a", "params": body}, {"custom_id": "b", "params": body}]}
    assert len(links(anthropic_batches.find_slots(batch))) == 4


def test_gemini_finds_image_uris_outside_google() -> None:
    parts: list[Any] = [
        {"file_data": {"file_uri": SIGNED, "mime_type": "image/png"}},
        {"fileData": {"fileUri": "https://cdn.example/a.jpg"}},                   # no type: an image's name
        {"file_data": {"file_uri": "https://cdn.example/clip", "mime_type": "video/mp4"}},
        {"file_data": {"file_uri": "https://cdn.example/data.bin"}},              # no type, no image name
        {"file_data": {"file_uri": "https://generativelanguage.googleapis.com/v1beta/files/abc",
                       "mime_type": "image/png"}},
        {"file_data": {"file_uri": "https://www.youtube.com/watch?v=x", "mime_type": "video/mp4"}},
        {"file_data": {"file_uri": "gs://bucket/a.png", "mime_type": "image/png"}},
        {"function_response": {"name": "f", "response": {}, "parts": [
            {"file_data": {"file_uri": "https://storage.googleapis.com/b/signed.png", "mime_type": "image/png"}}]}}]
    body = {"contents": [{"role": "user", "parts": parts}]}
    found = links(gemini.find_slots(body))
    assert [link.url for link in found] == [SIGNED, "https://cdn.example/a.jpg",
                                            "https://storage.googleapis.com/b/signed.png"]
    assert found[2].host == (parts, 7)


@pytest.mark.parametrize("adapter", [ADAPTERS[name] for name in sorted(ADAPTERS)], ids=sorted(ADAPTERS))
def test_every_adapter_finds_nothing_in_a_body_that_is_no_request(adapter: WireFormat) -> None:
    for body in (None, 7, "", [], {}, {"messages": "x"}, {"contents": [None]}, {"input": [{"type": 3}]}):
        assert links(adapter.find_slots(body)) == []
    assert adapter.URL_MARKERS and all(isinstance(marker, bytes) for marker in adapter.URL_MARKERS)
