"""An upstream's error path with an odd "digit" (a superscript, or an index of 5,000 digits) is no
site, never a crash: the client gets the provider's own answer or the re-sent call, never a 500,
and the refused call's response record is written."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from projectionist.adapters import anthropic_messages, gemini, openai_chat
from tests.system.refusals.hostile import anthropic_body, chat_body

RECORDING = {"record.mode": "metadata"}


@pytest.mark.parametrize("message", [
    "messages.0.content.\u00b2.image.source.base64: Could not process image",   # superscript two
    "messages." + "9" * 5000 + ".content.0.image.source.base64: Could not process image",
])
def test_anthropic_rejection_never_raises_on_an_odd_path(message: str) -> None:
    doc = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    found = anthropic_messages.rejection(400, doc)  # ValueError today
    assert found is not None and found.site is None


def test_openai_rejection_never_raises_on_an_odd_param() -> None:
    doc = {"error": {"message": "Invalid image.", "type": "invalid_request_error",
                     "param": "messages[0].content[\u00b3].image_url", "code": None}}
    found = openai_chat.rejection(400, doc)
    assert found is not None and found.site is None


def test_gemini_rejection_never_raises_on_an_odd_path() -> None:
    doc = {"error": {"code": 400, "status": "INVALID_ARGUMENT",
                     "message": "Invalid value at 'contents[0].parts[\u00b9].inline_data.data' (TYPE_BYTES), "
                                "Base64 decoding failed"}}
    found = gemini.rejection(400, doc)
    assert found is not None and found.site is None


async def test_an_odd_path_in_a_refusal_gives_the_client_the_providers_400_not_a_500(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    image = await harness.admit(color=3)
    message = "messages.0.content.\u00b2.image.source.base64: Could not process image"

    async def refuse(request: web.Request, doc: Any) -> web.StreamResponse:
        return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message": message}},
                                 status=400)

    harness.upstream.script = refuse
    resp = await harness.client.post("/v1/messages", json=anthropic_body(image), headers={"X-Session-Id": "odd"})
    text = await resp.text()
    assert resp.status != 500, text  # 500 UNCLASSIFIED_ERROR today: an upstream can cause a "bug" answer
    assert resp.status == 400 and "Could not process image" in text


async def test_an_absurd_index_in_openai_param_gives_the_providers_400(make_harness: Any) -> None:
    harness = await make_harness(**RECORDING)
    image = await harness.admit(color=4)

    async def refuse(request: web.Request, doc: Any) -> web.StreamResponse:
        return web.json_response({"error": {"message": "Invalid image.", "type": "invalid_request_error",
                                            "param": "messages[" + "7" * 4400 + "].content[1].image_url",
                                            "code": None}}, status=400)

    harness.upstream.script = refuse
    resp = await harness.client.post("/v1/chat/completions", json=chat_body(image), headers={"X-Session-Id": "odd2"})
    text = await resp.text()
    assert resp.status == 400, text
