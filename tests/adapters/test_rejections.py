"""Provider image profiles and image-refusal readers, per adapter (pure): every known refusal shape
(with the public report it was seen in), the part it names, the errors that are not image
refusals, and the documented limits as ``breaks`` applies them."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest

from projectionist.adapters import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from projectionist.adapters.base import Known, WireFormat, part_pointer
from projectionist.adapters.registry import ADAPTERS
from projectionist.policy.profile import Rejection, breaks


def anthropic_error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_011CVo9kA6fkxjmjgMDhqCwv"}


def openai_error(message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def google_error(message: str, code: int = 400, status: str = "INVALID_ARGUMENT") -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


# --- every known refusal: (adapter, status, body, the site it names, where the shape was seen) ---

A = anthropic_messages
O = openai_chat
G = gemini
REFUSALS: list[tuple[WireFormat, Any, str | None, str]] = [
    (A, anthropic_error("messages.38.content.1.image.source.base64.data: At least one of the image dimensions "
                        "exceeds max allowed size for many-images requests: 2000 pixels"),
     "/messages/38/content/1", "https://github.com/langgenius/dify/issues/11177"),
    (A, anthropic_error("messages.0.content.1.image.source.base64: image exceeds 5 MB maximum"),
     "/messages/0/content/1", "the wording without its byte counts: https://github.com/gptme/gptme/issues/185"),
    (A, anthropic_error("messages.11.content.8.image.source.base64.data: At least one of the image dimensions "
                        "exceed max allowed size"),
     "/messages/11/content/8", "the wording without its pixels: https://github.com/anthropics/claude-code/issues/4778"),
    (A, anthropic_error("Could not process image"), None, "https://github.com/anthropics/claude-code/issues/1747"),
    (A, anthropic_error("messages.18.content.1.image.source.base64.data: Image does not match the provided media "
                        "type image/png"),
     "/messages/18/content/1", "https://github.com/anthropics/claude-code/issues/13131"),
    (A, anthropic_error("messages.83.content.0.tool_result.content.1.image.source.base64: The image was specified "
                        "using the image/jpeg media type, but the image appears to be a image/png image"),
     "/messages/83/content/0/content/1", "https://github.com/vybestack/llxprt-code/issues/2130"),
    (A, anthropic_error("messages.34.content.2.image.source.base64.data: Image format image/png not supported"),
     "/messages/34/content/2", "https://github.com/anthropics/claude-code/issues/28485"),
    (A, anthropic_error("messages.118.content.4.image.source.base64: image cannot be empty"),
     "/messages/118/content/4", "https://github.com/anthropics/claude-code/issues/12750"),
    (A, anthropic_error("messages.10.content.1.image.source.base64: invalid base64 data"),
     "/messages/10/content/1", "https://github.com/openclaw/openclaw/pull/13784"),
    (A, anthropic_error("messages.10.content.0.tool_result.content.0.image.source.base64.media_type: Input should "
                        "be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'"),
     "/messages/10/content/0/content/0", "https://github.com/anthropics/claude-code/issues/400"),
    (O, openai_error("Invalid image."), None, "https://github.com/ijwfly/chatgpt-tg/issues/14"),
    (O, openai_error("You uploaded an unsupported image. Please make sure your image is below 20 MB in size and is "
                     "of one the following formats: ['png', 'jpeg', 'gif', 'webp'].", "sanitizer_server_error"),
     None, "https://github.com/CosmosShadow/gptpdf/issues/6"),
    (O, openai_error("You uploaded an unsupported image. Please make sure your image has of one the following "
                     "formats: ['png', 'jpeg', 'gif', 'webp'].", "invalid_image_format"),
     None, "https://github.com/STranslate/STranslate/issues/277"),
    (O, openai_error("Invalid image URL: 'messages[0].content[1].image_url.url'. Expected a base64-encoded data URL "
                     "with an image MIME type (e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got a value "
                     "without the 'data:' prefix.", "invalid_value", "messages[0].content[1].image_url.url"),
     "/messages/0/content/1", "https://github.com/Alibaba-NLP/OmniSearch/issues/3"),
    (O, openai_error("Invalid 'input[101].content[1].image_url'. Expected a base64-encoded data URL with an image "
                     "MIME type (e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got empty base64-encoded "
                     "bytes.", "invalid_value", "input[101].content[1].image_url"),
     "/input/101/content/1", "https://github.com/anomalyco/opencode/issues/23983"),
    (O, openai_error("Total image size is 50.6MB, which exceeds the allowed limit of 50.0MB."),
     None, "https://github.com/open-webui/open-webui/issues/26967"),
    (O, openai_error("The image you provided requires 35721 patches after processing, exceeding the limit of 30000. "
                     "Please resize the image and try again."),
     None, "https://github.com/NousResearch/hermes-agent/pull/106186"),
    (O, openai_error("Invalid MIME type for image content.", "invalid_image_format", "messages.[1].content.[0].image_url"),
     "/messages/1/content/0", "synthetic message, the code alone: https://github.com/STranslate/STranslate/issues/277"),
    (O, openai_error("The image data you provided does not represent a valid image. Please check your input and try "
                     "again with one of the supported image formats: ['image/jpeg', 'image/png', 'image/gif', "
                     "'image/webp'].", "invalid_value", "input"),
     None, "https://github.com/openai/openai-dotnet/issues/708"),
    (O, {"code": "invalid-argument", "error": "Invalid PNG image."}, None,
     "https://github.com/NousResearch/hermes-agent/issues/69078"),
    (O, {"code": "invalid-argument", "error": "Base64 string of provided image cannot be decoded."}, None,
     "https://github.com/NousResearch/hermes-agent/pull/69104"),
    (O, openai_error("Invalid request: prepare image failed error, status code: 400, message: failed to decode image: "
                     "unsupported image format"), None, "https://github.com/MoonshotAI/kimi-cli/issues/1066"),
    (O, openai_error("Unsupported image. Please try another one."), None,
     "https://github.com/MoonshotAI/kimi-code/pull/2362"),
    (O, {"code": "InvalidParameter.DataInspection", "message": "x", "error": "The media format is not supported or "
         "incorrect for the data inspection."}, None, "https://github.com/alibaba/spring-ai-alibaba/issues/319"),
    (O, openai_error("<400> InternalError.Algo.InvalidParameter: The image length and width do not meet the model "
                     "restrictions. [height:1 or width:1 must be larger than 10]"), None,
     "https://github.com/QwenLM/qwen-code/issues/2505"),
    (O, {"object": "error", "message": "x", "error": {"message": "cannot identify image file <_io.BytesIO object at "
                                                       "0x7f>", "type": "BadRequestError"}}, None,
     "https://github.com/vllm-project/vllm/pull/19202"),
    (O, openai_error("invalid image input"), None, "https://github.com/ollama/ollama/blob/main/openai/openai.go"),
    (O, openai_error("Failed to create new sequence: failed to process inputs: image: unknown format"), None,
     "https://github.com/ollama/ollama/issues/11320"),
    (O, openai_error("illegal base64 data at input byte 4"), None, "https://github.com/jakobdylanc/llmcord/issues/29"),
    (O, {"error": {"message": "Provider returned error", "code": 400, "metadata": {
        "raw": '{"error":{"message":"Invalid image.","type":"invalid_request_error"}}', "provider_name": "OpenAI"}}},
     None, "OpenRouter's wrapper: https://github.com/danny-avila/LibreChat/issues/6333"),
    (G, google_error("Unable to process input image. Please retry or report in "
                     "https://developers.generativeai.google/guide/troubleshooting"),
     None, "https://github.com/google-gemini/gemini-cli/issues/5064"),
    (G, [{"error": {"code": 400, "message": "Provided image is not valid.",
                    "errors": [{"message": "Provided image is not valid.", "domain": "global", "reason": "badRequest"}],
                    "status": "INVALID_ARGUMENT"}}],
     None, "https://github.com/google-gemini/gemini-cli/issues/27244"),
    (G, google_error("Provided image is not valid"), None, "https://github.com/AmberSahdev/Open-Interface/issues/64"),
    (G, google_error("Unsupported MIME type: image/jpg"), None, "https://github.com/ogkalu2/comic-translate/pull/399"),
    (G, google_error("Invalid value at 'contents[0].parts[2].inline_data.data' (TYPE_BYTES), Base64 decoding failed "
                     "for \"https://example.s3/image.png\""),
     "/contents/0/parts/2", "https://github.com/danny-avila/LibreChat/issues/6593"),
    (G, google_error("Invalid value at 'contents[2].parts[0].inline_data.data' (TYPE_BYTES), Base64 decoding failed "
                     "for \"/api/attachments/file?id=1\" Invalid value at 'contents[2].parts[1].inline_data.data' "
                     "(TYPE_BYTES), Base64 decoding failed for \"/api/attachments/file?id=2\""),
     "/contents/2/parts/0", "https://github.com/bobrware/bobrchat/issues/135"),
]


def _message(body: Any) -> str:
    error = (body[0] if isinstance(body, list) else body)["error"]
    if isinstance(error, str):  # xAI's flat shape
        return error
    if error["message"] == "Provider returned error":  # OpenRouter's wrapper: the provider's own answer
        return _message(json.loads(error["metadata"]["raw"]))
    return str(error["message"])


# --- every known answer about the images' context: (adapter, status, body, rule, side, bytes, source) ---

CONTEXTS: list[tuple[WireFormat, int, Any, str, int, int, str]] = [
    (A, 400, anthropic_error("messages.88.content.1.image.source.base64.data: At least one of the image dimensions "
                             "exceed max allowed size for many-image requests: 2000 pixels"),
     "many_images", 2000, 0, "https://github.com/anthropics/claude-code/issues/52220"),
    (A, 400, anthropic_error("messages.3.content.8.image.source.base64.data: At least one of the image dimensions "
                             "exceed max allowed size for many-image requests: 2000 pixels"),
     "many_images", 2000, 0, "https://github.com/anthropics/claude-code/issues/4778"),
    (A, 400, anthropic_error("messages.11.content.8.image.source.base64.data: At least one of the image dimensions "
                             "exceed max allowed size: 8000 pixels"),
     "image_side", 8000, 0, "https://github.com/can1357/oh-my-pi/pull/10633"),
    (A, 400, anthropic_error("messages.0.content.1.image.source.base64: image exceeds 5 MB maximum: 5327908 bytes > "
                             "5242880 bytes"),
     "image_bytes", 0, 5242880 * 3 // 4, "https://github.com/nraiden/cofounder/issues/53"),
    (A, 400, anthropic_error("messages.168.content.0.tool_result.content.1.image.source.base64: image exceeds 5 MB "
                             "maximum: 5649924 bytes > 5242880 bytes"),
     "image_bytes", 0, 5242880 * 3 // 4, "https://github.com/earendil-works/pi/pull/424"),
    (A, 400, anthropic_error("messages.0.content.1.image.source.base64: image exceeds 5 MB maximum: 6129904 bytes > "
                             "5242880 bytes"),
     "image_bytes", 0, 5242880 * 3 // 4, "https://github.com/mozilla-ai/clawbolt/issues/936"),
    (A, 400, anthropic_error("messages.0.content.1.image: image exceeds 10 MB maximum: 12058221 bytes > 10485760 "
                             "bytes"),
     "image_bytes", 0, 10485760 * 3 // 4, "https://platform.claude.com/docs/en/build-with-claude/vision"),
    (O, 400, openai_error("Invalid content type. image_url is only supported by certain models.", None,
                          "messages.[1].content.[1].type"),
     "no_images", 0, 0, "https://github.com/browser-use/web-ui/issues/274"),
    (O, 400, openai_error("This model does not support image_url content.", "invalid_value", "messages[7].content"),
     "no_images", 0, 0, "https://github.com/pollinations/pollinations/issues/2588"),
    (O, 400, openai_error("Failed to deserialize the JSON body into the target type: messages[11]: unknown variant "
                          "`image_url`, expected `text` at line 1 column 53929", "invalid_request_error"),
     "no_images", 0, 0, "https://github.com/BenedictKing/ccx/issues/95"),
    (O, 400, {"code": "Client specified an invalid argument", "error": "The model expects a single `text` element "
                                                                       "per message."},
     "no_images", 0, 0, "https://github.com/chatboxai/chatbox/issues/1622"),
    (O, 400, openai_error("<400> InternalError.Algo.InvalidParameter: The provided messages input is invalid. The "
                          "error info is [Unexpected item type in content.]"),
     "no_images", 0, 0, "https://github.com/openclaw/openclaw/issues/92688"),
    (O, 400, openai_error("GLM-5.2 is not a multimodal model", kind="BadRequestError"),
     "no_images", 0, 0, "https://github.com/vllm-project/vllm/issues/23402"),
    (O, 400, openai_error("At most 0 image(s) may be provided in one prompt.", kind="BadRequestError"),
     "no_images", 0, 0, "https://github.com/vllm-project/vllm/issues/9739"),
    (O, 400, {"error": "this model does not support image input"},
     "no_images", 0, 0, "https://github.com/ollama/ollama/issues/17301"),
    (O, 500, openai_error("Failed to create new sequence: failed to process inputs: this model is missing data "
                          "required for image input"),
     "no_images", 0, 0, "https://github.com/open-webui/open-webui/issues/13077"),
    (O, 404, {"error": {"message": "No endpoints found that support image input", "code": 404}},
     "no_images", 0, 0, "https://github.com/aaif-goose/goose/issues/5396"),
    (O, 400, {"error": "Model does not support images. Please use a model that does."},
     "no_images", 0, 0, "https://github.com/lmstudio-ai/lmstudio-bug-tracker/issues/908"),
    (O, 500, {"error": {"code": 500, "message": "image input is not supported by this server", "type": "server_error"}},
     "no_images", 0, 0, "https://github.com/ggml-org/llama.cpp/issues/13566"),
    (O, 400, openai_error("message[0].content must be a string"),
     "no_images", 0, 0, "https://github.com/vercel/ai/issues/2837"),
    (O, 400, openai_error("Cannot preprocess image len(combined_imgs) = 1, len(image_ranges) = 0, please provide "
                          "valid images"),
     "no_images", 0, 0, "https://github.com/pydantic/pydantic-ai/issues/2424"),
    (O, 400, {"error": {"message": "Provider returned error", "code": 400, "metadata": {
        "raw": '{"error":{"message":"Invalid content type. image_url is only supported by certain models.",'
               '"param":"messages.[0].content.[1].type"}}', "provider_name": "OpenAI"}}},
     "no_images", 0, 0, "OpenRouter's wrapper: https://github.com/danny-avila/LibreChat/issues/6333"),
]


@pytest.mark.parametrize(("adapter", "status", "body", "rule", "side", "size", "source"), CONTEXTS,
                         ids=[c[6] for c in CONTEXTS])
def test_a_known_answer_about_the_context_is_read_as_its_rule(adapter: WireFormat, status: int, body: Any, rule: str,
                                                              side: int, size: int, source: str) -> None:
    found = adapter.rejection(status, body)
    assert found is not None and (found.context, found.side, found.bytes) == (rule, side, size)
    assert found.message == _message(body)


@pytest.mark.parametrize(("table", "adapter"), [(anthropic_messages.CONTEXT, A), (openai_chat.CONTEXT, O)],
                         ids=["anthropic", "openai"])
def test_every_known_context_answer_has_a_case_and_a_source(table: Any, adapter: WireFormat) -> None:
    for pattern, _, _, source in table:
        assert source.startswith("https://")
        cases = [_message(body) for a, _, body, _, _, _, _ in CONTEXTS if a is adapter]
        assert any(re.search(pattern, text, re.IGNORECASE) for text in cases), pattern


def test_a_no_images_answer_on_another_status_is_no_refusal() -> None:
    assert openai_chat.rejection(429, openai_error("this model does not support image input")) is None
    assert openai_chat.rejection(500, openai_error("Invalid image.")) is None  # content refusals are 400s only


@pytest.mark.parametrize(("adapter", "body", "site", "source"), REFUSALS, ids=[r[3] for r in REFUSALS])
def test_a_known_refusal_is_read_with_the_site_it_names(adapter: WireFormat, body: Any, site: str | None,
                                                        source: str) -> None:
    assert adapter.rejection(400, body) == Rejection(_message(body), site)


@pytest.mark.parametrize(("table", "adapter"), [(anthropic_messages.REJECTIONS, A), (openai_chat.REJECTIONS, O),
                                                (gemini.REJECTIONS, G)], ids=["anthropic", "openai", "gemini"])
def test_every_known_shape_has_a_case_here(table: tuple[Known, ...], adapter: WireFormat) -> None:
    for pattern, source in table:
        assert source.startswith("https://")
        cases = [_message(body) for a, body, _, _ in REFUSALS if a is adapter]
        cases += [_message(body) for a, _, body, _, _, _, _ in CONTEXTS if a is adapter]
        assert any(re.search(pattern, text, re.IGNORECASE) for text in cases), pattern


def test_openai_responses_reads_refusals_as_chat_does() -> None:
    body = openai_error("Invalid 'input[3].output[1].image_url'. Expected a base64-encoded data URL with an image "
                        "MIME type (e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got unsupported MIME type "
                        "'image/tiff'.", "invalid_value", "input[3].output[1].image_url")
    assert openai_responses.rejection(400, body) == Rejection(_message(body), "/input/3/output/1")
    assert openai_responses.PROFILE is openai_chat.PROFILE


def test_a_refusal_that_was_not_json_is_read_from_its_text() -> None:
    text = "messages.2.content.0.image.source.base64: Could not process image"
    assert anthropic_messages.rejection(400, text) == Rejection(text, "/messages/2/content/0")
    assert gemini.rejection(400, "Unable to process input image.") == Rejection("Unable to process input image.")


def test_a_batch_call_never_answers_with_an_image_refusal() -> None:
    for _, body, _, _ in REFUSALS:
        assert anthropic_batches.rejection(400, body) is None


# --- sites ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "pointer"), [
    ("messages.11.content.8.image.source.base64.data", "/messages/11/content/8"),
    ("messages.3.content.0.content.1.source.base64.data", "/messages/3/content/0/content/1"),
    ("messages.168.content.0.tool_result.content.1.image.source.base64", "/messages/168/content/0/content/1"),
    ("messages.0.content.1.image", "/messages/0/content/1"),
    ("messages.5", None),                                  # a message, not a part
    ("messages.5.content", None),
    ("system.0.image.source", None),                       # not under messages
    ("messages.x.content.1.image", None),
    ("messages.1.content.0.document.pages.3", None),       # goes on into another list: no trusted part
    ("messages.1.content.0.image.source\u00a0x", None),    # not a path
    ("", None),
])
def test_anthropic_paths_become_the_pointer_of_the_image_block(path: str, pointer: str | None) -> None:
    assert part_pointer(path, frozenset({"messages"}), frozenset({"content"}), frozenset({"tool_result"})) == pointer


UNPARSABLE: list[tuple[WireFormat, Any]] = [
    (A, anthropic_error("messages.x.content.1.image.source.base64: image exceeds 5 MB maximum")),
    (A, anthropic_error("Error: image exceeds 5 MB maximum")),
    (O, openai_error("Invalid image.", param="messages[1]")),
    (O, openai_error("Invalid image.", param="tools[0].image_url")),
    (O, {"error": {"message": "Invalid image.", "param": {"not": "a path"}}}),
    (G, google_error("Invalid value at 'contents[0].parts[1].function_response.parts[0].inline_data.data' "
                     "(TYPE_BYTES), Base64 decoding failed for \"x\"")),
]


@pytest.mark.parametrize(("adapter", "body"), UNPARSABLE)
def test_an_unparsable_path_leaves_the_site_open(adapter: WireFormat, body: Any) -> None:
    assert adapter.rejection(400, body) == Rejection(_message(body), None)


# --- not image refusals -----------------------------------------------------------------------

NOT_REFUSALS: list[tuple[WireFormat, int, Any]] = [
    (A, 429, anthropic_error("Number of request tokens has exceeded your per-minute rate limit", "rate_limit_error")),
    (A, 529, anthropic_error("Overloaded", "overloaded_error")),
    (A, 401, anthropic_error("invalid x-api-key", "authentication_error")),
    (A, 400, anthropic_error("prompt is too long: 208473 tokens > 200000 maximum")),
    (A, 400, anthropic_error("messages: text content blocks must be non-empty")),
    (A, 500, anthropic_error("Internal server error", "api_error")),
    (A, 413, anthropic_error("Request exceeds the maximum allowed number of bytes.", "request_too_large")),
    (A, 400, anthropic_error("messages.4.content.0.document.source.base64: invalid base64 data")),
    (A, 429, anthropic_error("messages.0.content.1.image.source.base64: image exceeds 5 MB maximum")),  # not a 400
    (O, 429, openai_error("Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM).",
                          "rate_limit_exceeded", kind="requests")),
    (O, 401, openai_error("Incorrect API key provided: sk-abc. You can find your API key at "
                          "https://platform.openai.com/account/api-keys.", "invalid_api_key")),
    (O, 400, openai_error("This model's maximum context length is 128000 tokens. However, your messages resulted "
                          "in 130000 tokens.", "context_length_exceeded", "messages")),
    (O, 400, openai_error("Invalid 'messages[1].content': string too long.", "string_above_max_length",
                          "messages[1].content")),
    (O, 500, openai_error("The server had an error while processing your request.", None, kind="server_error")),
    (G, 429, google_error("Resource has been exhausted (e.g. check quota).", 429, "RESOURCE_EXHAUSTED")),
    (G, 403, google_error("Method doesn't allow unregistered callers.", 403, "PERMISSION_DENIED")),
    (G, 400, google_error("API key not valid. Please pass a valid API key.")),
    (G, 400, google_error("The input token count exceeds the maximum number of tokens allowed 1048576.")),
    (G, 400, google_error("Invalid value at 'contents[6].parts[0].thought_signature' (TYPE_BYTES), Base64 "
                          "decoding failed for \"Es4D\"")),
    (G, 400, google_error("Request payload size exceeds the limit: 20971520 bytes.")),
    (G, 500, google_error("An internal error has occurred.", 500, "INTERNAL")),
    (G, 503, google_error("The model is overloaded. Please try again later.", 503, "UNAVAILABLE")),
]


@pytest.mark.parametrize(("adapter", "status", "body"), NOT_REFUSALS)
def test_other_errors_are_not_image_refusals(adapter: WireFormat, status: int, body: Any) -> None:
    assert adapter.rejection(status, body) is None


ALL = [ADAPTERS[name] for name in sorted(ADAPTERS)]


@pytest.mark.parametrize("adapter", ALL, ids=sorted(ADAPTERS))
@pytest.mark.parametrize("body", [None, 7, "", [], {}, {"error": {"message": 3}}, {"error": 3},
                                  [{"error": None}], "<html>502 Bad Gateway</html>"])
def test_any_json_that_is_no_error_object_is_no_refusal(adapter: WireFormat, body: Any) -> None:
    assert adapter.rejection(400, body) is None


@pytest.mark.parametrize("adapter", ALL, ids=sorted(ADAPTERS))
def test_a_flat_error_string_is_read_by_the_openai_formats_only(adapter: WireFormat) -> None:
    """xAI answers ``{"code": ..., "error": "<message>"}``: an OpenAI-compatible shape; the other
    formats' APIs never do, so there it is no refusal."""
    found = adapter.rejection(400, {"error": "Invalid image."})
    assert (found is not None) == (adapter.FORMAT == "openai" and adapter is not anthropic_batches)


# --- profiles ---------------------------------------------------------------------------------

@pytest.mark.parametrize("adapter", ALL, ids=sorted(ADAPTERS))
def test_every_adapter_declares_a_sourced_profile(adapter: WireFormat) -> None:
    profile = adapter.PROFILE
    assert profile.name == adapter.FORMAT
    assert profile.media_types and all(t.startswith("image/") for t in profile.media_types)
    assert profile.sources and all(s.startswith("https://") for s in profile.sources)


def test_anthropic_byte_limit_is_ten_mib_of_base64() -> None:
    limit = anthropic_messages.PROFILE.max_image_bytes
    assert limit is not None
    assert len(base64.b64encode(bytes(limit))) == 10 * 1024 * 1024
    assert len(base64.b64encode(bytes(limit + 1))) > 10 * 1024 * 1024


def test_breaks_agrees_with_the_documented_limits() -> None:
    claude, gpt, google = anthropic_messages.PROFILE, openai_chat.PROFILE, gemini.PROFILE
    assert breaks(claude, "image/png", 1000, 2500, 1400) is None
    assert breaks(claude, "image/png", 1000, 2500, 1400, images=20) is None
    assert breaks(claude, "image/png", 1000, 2500, 1400, images=21) == "side"
    assert breaks(claude, "image/png", 1000, 8000, 8000) is None
    assert breaks(claude, "image/png", 1000, 8001, 10) == "side"
    # 6 MB fits now that the API takes 10 MB of base64 per image (7.5 MiB decoded); 8 MB does not.
    assert breaks(claude, "image/png", 6 * 1024 * 1024, 100, 100) is None
    assert breaks(claude, "image/png", 8 * 1024 * 1024, 100, 100) == "bytes"
    assert breaks(claude, "image/bmp", 1000, 10, 10) == "type"
    assert breaks(google, "image/gif", 1000, 10, 10) == "type"
    assert breaks(google, "image/heic", 1000, 10, 10) is None
    assert breaks(gpt, "image/gif", 1000, 10, 10) is None
    assert breaks(gpt, "image/heic", 1000, 10, 10) == "type"
    assert breaks(gpt, "image/png", 60 * 1024 * 1024, 9000, 9000, images=100) is None  # no per-image limit documented
    assert anthropic_batches.PROFILE.max_request_bytes == 256_000_000
    # a batch holds many requests: the many-image rule, which is per request, is not applied to it
    differs = {"max_request_bytes": None, "many_images": None, "many_images_max_side": None}
    assert {**_limits(anthropic_batches.PROFILE), **differs} == {**_limits(claude), **differs}
    assert anthropic_batches.PROFILE.side_limit(500) == claude.max_side


def _limits(profile: Any) -> dict[str, Any]:
    return {field: getattr(profile, field) for field in profile.__struct_fields__}
