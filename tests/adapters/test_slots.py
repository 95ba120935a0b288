"""Each adapter's one finder of image slots (pure): every image part of a body is one slot of one
kind (a reference, an image the client inlined, one the provider fetches), in document order;
``refs``, ``inlined`` and ``links`` pick a kind; a part that is no image of any kind is no slot."""

from __future__ import annotations

from typing import Any

import pytest

from projectionist.adapters import anthropic_batches, anthropic_messages, gemini, openai_chat, openai_responses
from projectionist.adapters.base import Carried, Linked, Site, WireFormat, inlined, links, refs
from projectionist.adapters.registry import ADAPTERS
from projectionist.policy.errors import AttachmentError
from projectionist.policy.model import HttpRefs, ImageRef, Placeholder

ID = "sha256:" + "ab" * 32
B64 = "iVBORw0KGgo="
WEB = "https://images.example/cat.png"
PROXY = HttpRefs.of("https://proxy.example")


def chat_body() -> dict[str, Any]:
    return {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "text", "text": "four images"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}},
            {"type": "image_url", "image_url": {"url": WEB, "detail": "low"}},
            {"type": "file", "file": {"file_id": "file-provider-own"}},
            {"type": "image_url", "image_url": {"url": f"attachment:{ID}"}},
            {"type": "file", "file": {"file_id": ID}},
        ]}]}


def anthropic_body() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": WEB}},
        {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}]},
        {"type": "image", "source": {"type": "url", "url": f"attachment:{ID}"}},
        {"type": "document", "source": {"type": "url", "url": "https://docs.example/a.pdf"}},
    ]}]}


def gemini_body() -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [
        {"text": "three"},
        {"inline_data": {"mime_type": "image/png", "data": B64}},
        {"file_data": {"file_uri": f"attachment:{ID}", "mime_type": "image/png"}},
        {"file_data": {"file_uri": WEB, "mime_type": "image/png"}},
        {"file_data": {"file_uri": "https://generativelanguage.googleapis.com/v1beta/files/x", "mime_type": "image/png"}},
    ]}]}


def responses_body() -> dict[str, Any]:
    return {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": f"attachment:{ID}"},
        {"type": "input_text", "text": "and"},
        {"type": "input_image", "image_url": WEB},
        {"type": "input_image", "image_url": f"data:image/jpeg;base64,{B64}"},
    ]}]}


CASES: list[tuple[WireFormat, Any, list[str]]] = [
    (openai_chat, chat_body(), ["inlined", "linked", "referenced", "referenced"]),
    (anthropic_messages, anthropic_body(), ["linked", "inlined", "referenced"]),
    (gemini, gemini_body(), ["inlined", "referenced", "linked"]),
    (openai_responses, responses_body(), ["referenced", "linked", "inlined"]),
    (anthropic_batches, {"requests": [{"custom_id": "a", "params": anthropic_body()},
                                      {"custom_id": "b", "params": anthropic_body()}]},
     ["linked", "inlined", "referenced"] * 2),
]


@pytest.mark.parametrize(("fmt", "body", "kinds"), CASES, ids=[fmt.NAME for fmt, _, _ in CASES])
def test_one_slot_per_image_part_in_document_order(fmt: WireFormat, body: Any, kinds: list[str]) -> None:
    slots = fmt.find_slots(body)
    assert [slot.KIND for slot in slots] == kinds
    # each slot points at its own part: no part is two slots
    assert len({(id(slot.parent), slot.index) for slot in slots}) == len(slots)
    assert refs(slots) == [s for s in slots if isinstance(s, Site)] and all(s.ref.id == ID for s in refs(slots))
    assert [c.data for c in inlined(slots)] == [B64] * kinds.count("inlined")
    assert all(isinstance(c, Carried) and c.declared in ("image/png", "image/jpeg") for c in inlined(slots))
    assert [link.url for link in links(slots)] == [WEB] * kinds.count("linked")
    assert all(isinstance(link, Linked) for link in links(slots))


def test_every_adapter_has_one_finder() -> None:
    """No adapter keeps a finder per kind beside ``find_slots``: a new kind of image is one more
    member of the union, found by the same walk."""
    for fmt in ADAPTERS.values():
        assert callable(fmt.find_slots)
        assert not any(hasattr(fmt, old) for old in ("find_refs", "find_inline", "find_urls")), fmt.NAME


def test_a_proxy_url_is_a_reference_only_under_its_base() -> None:
    url = f"https://proxy.example/v1/attachments/{ID}"
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    [as_ref] = openai_chat.find_slots(body, PROXY)
    assert isinstance(as_ref, Site) and as_ref.ref == ImageRef(ID)
    [as_link] = openai_chat.find_slots(body)
    assert isinstance(as_link, Linked) and as_link.url == url


def test_a_malformed_reference_is_the_clients_error_whatever_else_the_body_holds() -> None:
    body = chat_body()
    body["messages"][1]["content"].append({"type": "image_url", "image_url": {"url": "attachment:sha256:zz"}})
    with pytest.raises(AttachmentError):
        openai_chat.find_slots(body)


def test_a_slot_renders_in_place() -> None:
    """A slot of any kind is a place ``render`` can fill: its placeholder text replaces its part."""
    body = chat_body()
    slots = openai_chat.find_slots(body)
    sites = [s if isinstance(s, Site) else s.site(ImageRef(ID)) for s in slots]
    openai_chat.render(sites, tuple(Placeholder("not_found", f"[image {i}]") for i in range(len(sites))))
    content = body["messages"][1]["content"]
    assert [part.get("text") for part in content] == [
        "four images", "[image 0]", "[image 1]", None, "[image 2]", "[image 3]"]
    assert content[3] == {"type": "file", "file": {"file_id": "file-provider-own"}}  # no slot: left alone
