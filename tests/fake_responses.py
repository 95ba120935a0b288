"""Fake upstream routes for the OpenAI Responses API and the OpenAI Files API upload.

``POST /v1/responses`` records the request like ``FakeUpstream._record`` and answers a Response
object, or, with ``"stream": true``, the Responses SSE sequence the official SDK expects
(``response.created`` ... ``response.completed``) with ``fake.chunks`` text deltas ``tok0 `` ...

``POST /v1/files`` records the multipart upload and answers an OpenAI file object
(id ``file-fake123``), so a forwarded upload gives the ``openai`` SDK a real ``FileObject``.
A request carrying ``anthropic-version`` or ``x-fake-status`` is answered by the generic echo route
instead, exactly as before this route existed.
"""

from __future__ import annotations

import asyncio
import copy
import re
from typing import TYPE_CHECKING, Any, Final

import msgspec
from aiohttp import web

if TYPE_CHECKING:
    from tests.fakes import FakeUpstream

RESPONSE_ID: Final = "resp_fake"
MESSAGE_ID: Final = "msg_fake"
TEXT: Final = "Hello from the fake upstream."
FILE_ID: Final = "file-fake123"

USAGE: Final[dict[str, Any]] = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 17,
}


def output_message(text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    return {"id": MESSAGE_ID, "type": "message", "role": "assistant", "status": status, "content": content}


def response_object(text: str | None = TEXT, *, status: str = "completed", model: str = "fake-model") -> dict[str, Any]:
    """A complete Response object; ``text=None`` gives the empty in-progress snapshot."""
    done = status == "completed"
    return {
        "id": RESPONSE_ID,
        "object": "response",
        "created_at": 1700000000,
        "completed_at": 1700000001 if done else None,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "metadata": {},
        "model": model,
        "output": [output_message(text)] if text is not None else [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": copy.deepcopy(USAGE) if done else None,
        "user": None,
    }


def stream_events(chunks: int) -> list[dict[str, Any]]:
    """The whole SSE event sequence of one streamed response (``sequence_number`` filled in)."""
    deltas = [f"tok{i} " for i in range(chunks)]
    text = "".join(deltas)
    part_ref = {"item_id": MESSAGE_ID, "output_index": 0, "content_index": 0}
    empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_object(None, status="in_progress")},
        {"type": "response.in_progress", "response": response_object(None, status="in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": output_message("", status="in_progress")},
        {"type": "response.content_part.added", **part_ref, "part": empty_part},
        *({"type": "response.output_text.delta", **part_ref, "delta": d, "logprobs": []} for d in deltas),
        {"type": "response.output_text.done", **part_ref, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **part_ref, "part": dict(empty_part, text=text)},
        {"type": "response.output_item.done", "output_index": 0, "item": output_message(text)},
        {"type": "response.completed", "response": response_object(text)},
    ]
    for seq, event in enumerate(events):
        event["sequence_number"] = seq
    return events


def file_object(filename: str, size: int, purpose: str) -> dict[str, Any]:
    return {"id": FILE_ID, "object": "file", "bytes": size, "created_at": 1700000000, "filename": filename,
            "purpose": purpose, "status": "processed", "expires_at": None, "status_details": None}


_FIELD: Final = re.compile(rb'name="(?P<name>[^"]*)"(?:; filename="(?P<filename>[^"]*)")?\r\n(?:[^\r\n]+\r\n)*\r\n')


def multipart_fields(body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """Rough multipart reader for the fake: field name -> (file name or None, value bytes)."""
    boundary = body.split(b"\r\n", 1)[0]
    fields: dict[str, tuple[str | None, bytes]] = {}
    for chunk in body.split(boundary)[1:]:
        match = _FIELD.search(chunk)
        if match is None:
            continue
        value = chunk[match.end():].removesuffix(b"\r\n")
        filename = match["filename"]
        fields[match["name"].decode()] = (filename.decode() if filename is not None else None, value)
    return fields


def install_responses(app: web.Application, fake: FakeUpstream) -> None:
    """Register ``POST /v1/responses`` and ``POST /v1/files`` on the fake upstream."""

    async def responses(request: web.Request) -> web.StreamResponse:
        req = await fake._record(request)
        model = req.get("model") if isinstance(req.get("model"), str) else "fake-model"
        if not req.get("stream"):
            return web.json_response(response_object(model=model))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        first_delta = True
        for event in stream_events(fake.chunks):
            if "response" in event:
                event["response"]["model"] = model
            await resp.write(f"event: {event['type']}\ndata: ".encode() + msgspec.json.encode(event) + b"\n\n")
            if event["type"] == "response.output_text.delta":
                if first_delta and fake.gate is not None:
                    await fake.gate.wait()
                first_delta = False
                if fake.chunk_delay:
                    await asyncio.sleep(fake.chunk_delay)
        await resp.write_eof()
        return resp

    async def files(request: web.Request) -> web.StreamResponse:
        if "anthropic-version" in request.headers or "x-fake-status" in request.headers:
            return await fake.echo(request)
        from tests.fakes import Received

        body = await request.read()
        fake.received.append(Received(request.method, request.path_qs, dict(request.headers), body))
        fields = multipart_fields(body) if request.content_type.startswith("multipart/") else {}
        filename, data = fields.get("file", ("upload", body))
        purpose = fields.get("purpose", (None, b"user-data"))[1].decode()
        return web.json_response(file_object(filename or "upload", len(data), purpose))

    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/files", files)
