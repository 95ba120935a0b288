"""The HTTP form of references and attachment file ids in file parts, per adapter (pure).

``{public_url}/v1/attachments/sha256:<hex>[?name=]`` is found exactly like
``attachment:sha256:<hex>[?name=]`` in every format's reference slot, but only under the public
URLs handed in (``HttpRefs``): another host, a lookalike, another spelling of the path is an
ordinary URL, and a malformed id under the prefix is the client's error. A ``sha256:`` id in a
Chat Completions ``file`` part, a Responses ``input_file`` or an Anthropic ``document`` block is an
image reference too, rendered as the format's image (or placeholder) part.
The proxy end to end: ``tests/proxy/call/test_http_refs.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from projectionist.adapters import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from projectionist.adapters.base import WireFormat, refs
from projectionist.policy.errors import AttachmentError
from projectionist.policy.model import NO_HTTP, HttpRefs, ImageRef, Placeholder, Resolved, StoredImage, parse_url_ref

HEX = "ab" * 32
ID = "sha256:" + HEX
BASE = "http://127.0.0.1:8787"
HTTP = HttpRefs.of(BASE)
IMAGE = StoredImage(ID, "image/png", 3, 1, 1, b"png")
DATA_URL = "data:image/png;base64,cG5n"


# -- the matcher ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "name"), [
    (f"{BASE}/v1/attachments/{ID}", None),
    (f"{BASE}/v1/attachments/{ID}?name=shot%20one.png", "shot one.png"),
    (f"{BASE}/s/agent-7/v1/attachments/{ID}", None),
    (f"{BASE}/s/agent-7/v1/attachments/{ID}?name=a.png", "a.png"),
    (f"{BASE}/v1/attachments/{ID}.png", None),                     # the extension the upload's href carries
    (f"{BASE}/v1/attachments/{ID}.jpeg?name=p.jpeg", "p.jpeg"),
    (f"{BASE}/s/agent-7/v1/attachments/{ID}.webp", None),
])
def test_urls_under_the_public_url_are_references(url: str, name: str | None) -> None:
    assert parse_url_ref(url, HTTP) == ImageRef(ID, name)
    assert parse_url_ref(url, HttpRefs.of(BASE + "/")) == ImageRef(ID, name)  # a trailing slash is no difference
    assert parse_url_ref(url) is None  # without public URLs, an http URL is never a reference


@pytest.mark.parametrize("url", [
    f"http://127.0.0.1:8787.evil/v1/attachments/{ID}",           # lookalike host
    f"http://127.0.0.1:87870/v1/attachments/{ID}",              # another port, sharing a prefix
    f"http://127.0.0.1:8787@evil.example/v1/attachments/{ID}",   # credentials spelling
    f"https://127.0.0.1:8787/v1/attachments/{ID}",              # another scheme
    f"http://127.0.0.1/v1/attachments/{ID}",                    # no port
    f"http://localhost:8787/v1/attachments/{ID}",               # another name of the same host
    f"HTTP://127.0.0.1:8787/v1/attachments/{ID}",               # spelled otherwise: compared exactly
    f"http://127.0.0.1:8787//v1/attachments/{ID}",
    f"http://127.0.0.1:8787/v1/x/../attachments/{ID}",          # a '..' before the attachments path
    f"http://127.0.0.1:8787/v1/%61ttachments/{ID}",             # percent-encoded path
    f"http://127.0.0.1:8787/v2/attachments/{ID}",
    f"http://127.0.0.1:8787/s//v1/attachments/{ID}",            # an empty session segment
    f"http://127.0.0.1:8787/s/../v1/attachments/{ID}",          # '..' as the session segment
    f"http://127.0.0.1:8787/s/a%2Fb/v1/attachments/{ID}",
    f"http://127.0.0.1:8787/s/a/b/v1/attachments/{ID}",
    f"https://example.com/v1/attachments/{ID}",
])
def test_other_urls_pass_through(url: str) -> None:
    assert parse_url_ref(url, HTTP) is None


@pytest.mark.parametrize("url", [
    f"{BASE}/v1/attachments/sha256%3A{HEX}",              # a percent-encoded id
    f"{BASE}/v1/attachments/../attachments/{ID}",         # '..' after the prefix
    f"{BASE}/v1/attachments/{ID.upper()}",
    f"{BASE}/v1/attachments/{ID}/extra",
    f"{BASE}/v1/attachments/",
    f"{BASE}/v1/attachments/{ID}?name=a&name=b",
    f"{BASE}/v1/attachments/{ID}?size=large",
    f"{BASE}/s/x/v1/attachments/sha256:{HEX[:-1]}",
    f"{BASE}/v1/attachments/{ID}.svg",                    # not an admitted image type's extension
    f"{BASE}/v1/attachments/{ID}.PNG",
    f"{BASE}/v1/attachments/{ID}.png.png",
    f"{BASE}/v1/attachments/sha256:{HEX[:-1]}.png",
])
def test_a_malformed_reference_under_the_prefix_is_the_clients_error(url: str) -> None:
    with pytest.raises(AttachmentError) as info:
        parse_url_ref(url, HTTP)
    assert info.value.code == "INVALID_ATTACHMENT_REF"
    assert parse_url_ref(url) is None


def test_the_extension_belongs_to_the_http_form_only() -> None:
    with pytest.raises(AttachmentError):
        parse_url_ref(f"attachment:{ID}.png", HTTP)  # the attachment: form is the id, exactly


def test_a_public_url_with_a_path_is_a_prefix_of_whole_segments() -> None:
    http = HttpRefs.of("https://proxy.example/llm/")
    assert parse_url_ref(f"https://proxy.example/llm/v1/attachments/{ID}", http) == ImageRef(ID)
    assert parse_url_ref(f"https://proxy.example/llmx/v1/attachments/{ID}", http) is None
    assert parse_url_ref(f"https://proxy.example/v1/attachments/{ID}", http) is None
    assert HttpRefs.of("", None, "/").bases == ()


# -- every format's reference slot ---------------------------------------------------------------

def _url_bodies(url: str) -> list[tuple[WireFormat, dict[str, Any]]]:
    chat = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    responses = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]}
    anthropic = {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}}]}]}
    google = {"contents": [{"role": "user", "parts": [{"file_data": {"file_uri": url}}]}]}
    batch = {"requests": [{"custom_id": "a", "params": anthropic}]}
    return [(openai_chat, chat), (openai_responses, responses), (anthropic_messages, anthropic), (gemini, google),
            (anthropic_batches, batch)]


@pytest.mark.parametrize("index", range(5))
def test_every_format_finds_and_renders_the_http_form(index: int) -> None:
    url = f"{BASE}/v1/attachments/{ID}?name=x.png"
    fmt, body = _url_bodies(url)[index]
    assert [s.ref for s in refs(fmt.find_slots(body, HTTP))] == [ImageRef(ID, "x.png")]
    assert refs(fmt.find_slots(body)) == [] and refs(fmt.find_slots(body, NO_HTTP)) == []
    as_attachment = _url_bodies(f"attachment:{ID}?name=x.png")[index][1]
    for tree, http in ((body, HTTP), (as_attachment, NO_HTTP)):  # rendered exactly like the attachment: form
        fmt.render(refs(fmt.find_slots(tree, http)), (Resolved(IMAGE),))
    assert body == as_attachment
    assert "cG5n" in str(body) and url not in str(body)


@pytest.mark.parametrize("index", range(5))
def test_lookalikes_stay_untouched_in_every_format(index: int) -> None:
    fmt, body = _url_bodies(f"http://127.0.0.1:8787.evil/v1/attachments/{ID}")[index]
    before = copy.deepcopy(body)
    assert refs(fmt.find_slots(body, HTTP)) == []
    assert body == before


def test_gemini_counts_an_http_reference_without_a_mime_type() -> None:
    _, body = _url_bodies(f"{BASE}/v1/attachments/{ID}")[3]
    assert gemini.count_images(body) == 0
    assert gemini.count_images(body, HTTP) == 1


# -- attachment ids in file parts ----------------------------------------------------------------

def test_chat_file_part_becomes_an_image_url_part() -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "file", "file": {"file_id": ID, "filename": "shot.png"}},
        {"type": "file", "file": {"file_id": "file-abc"}},             # the provider's own file
        {"type": "file", "file": {"file_id": ID}},
    ]}]}
    sites = refs(openai_chat.find_slots(body))
    assert [(s.index, s.ref) for s in sites] == [(0, ImageRef(ID)), (2, ImageRef(ID))]
    assert openai_chat.count_images(body) == 2
    openai_chat.render(sites, (Resolved(IMAGE), Placeholder("not_found", "[gone]")))
    assert body["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": DATA_URL}},
        {"type": "file", "file": {"file_id": "file-abc"}},
        {"type": "text", "text": "[gone]"}]


def test_responses_input_file_becomes_an_input_image() -> None:
    body = {"prompt": {"variables": {"doc": {"type": "input_file", "file_id": ID}}}, "input": [
        {"role": "user", "content": [{"type": "input_file", "file_id": ID, "filename": "shot.png"},
                                     {"type": "input_file", "file_id": "file-abc"}]},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file", "file_id": ID}]},
    ]}
    sites = refs(openai_responses.find_slots(body))
    assert len(sites) == 3 and openai_responses.count_images(body) == 3
    openai_responses.render(sites, (Resolved(IMAGE), Resolved(IMAGE), Placeholder("corrupt", "[bad]")))
    image = {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}
    assert body["prompt"]["variables"]["doc"] == image
    assert body["input"][0]["content"] == [image, {"type": "input_file", "file_id": "file-abc"}]
    assert body["input"][1]["output"] == [{"type": "input_text", "text": "[bad]"}]


def test_anthropic_document_with_an_attachment_file_becomes_an_image_block() -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "file", "file_id": ID}, "title": "t", "citations": {"enabled": True},
         "cache_control": {"type": "ephemeral"}},
        {"type": "document", "source": {"type": "file", "file_id": "file_011"}},
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document", "source": {"type": "file", "file_id": ID}}]},
    ]}]}
    sites = refs(anthropic_messages.find_slots(body))
    assert len(sites) == 2 and anthropic_messages.count_images(body) == 2
    anthropic_messages.render(sites, (Resolved(IMAGE), Placeholder("not_found", "[gone]")))
    content = body["messages"][0]["content"]
    assert content[0] == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "cG5n"},
                          "cache_control": {"type": "ephemeral"}}
    assert content[1] == {"type": "document", "source": {"type": "file", "file_id": "file_011"}}
    assert content[2]["content"] == [{"type": "text", "text": "[gone]"}]


@pytest.mark.parametrize(("fmt", "part"), [
    (openai_chat, {"type": "file", "file": {"file_id": "sha256:nothex"}}),
    (openai_responses, {"type": "input_file", "file_id": "sha256:nothex"}),
])
def test_a_malformed_attachment_file_id_is_the_clients_error(fmt: WireFormat, part: dict[str, Any]) -> None:
    key = "messages" if fmt is openai_chat else "input"
    with pytest.raises(AttachmentError) as info:
        refs(fmt.find_slots({key: [{"role": "user", "content": [part]}]}))
    assert info.value.code == "INVALID_ATTACHMENT_REF"
