"""A scripted upstream for the real agent CLIs (``tests.agents``): enough of Anthropic Messages and
of the OpenAI Responses API for Claude Code and the Codex CLI to finish a turn non-interactively.

- ``POST /v1/messages`` (``?beta=true`` too), JSON or SSE. A request that offers the ``Read`` tool
  while ``read_file`` is set and carries no ``tool_result`` yet is answered with one ``tool_use``
  of ``Read`` on that file; every other one (the follow-up turn, Claude Code's side calls: quota
  probe, topic/title detection) with the text ``answer``.
- ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``.
- ``POST /v1/responses``: the Responses SSE sequence (``response.created`` ... ``response.completed``)
  with one assistant message ``answer`` (JSON when ``stream`` is not set).
- ``GET /v1/models``: a models list (OpenAI's ``data`` and Codex's own ``models`` key).
- Anything else: recorded, answered 404.

Every request is recorded (``received``: method, path with query, headers, decoded JSON body).
``refused`` maps an attachment id (``sha256:`` of the decoded image bytes) to whether the refusal
names the image's place, as the providers do:

- Anthropic: 400 ``{"type":"error","error":{"type":"invalid_request_error","message":"Could not
  process image"}}``; named: ``messages.N.content.M.image.source.base64: Could not process image``,
  and for an image inside a ``tool_result``
  ``messages.N.content.M.tool_result.content.K.image.source.base64: ...`` (the block's type follows
  its index; the shape of real errors, e.g. "messages.30.content.0.tool_result.content.0.image.
  source.base64: image exceeds 5 MB maximum", "messages.106.content.0.tool_result.content.0.image.
  source.base64.media_type: Input should be ...").
- OpenAI: 400 ``{"error":{"message":"You uploaded an unsupported image. ...","type":
  "invalid_request_error","param":null,"code":"invalid_image_format"}}``; named: ``param`` is the
  part's place, e.g. ``input[1].content[0].image_url``.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from aiohttp import web

from tests.fake_responses import USAGE, response_object
from tests.refusing import OPENAI_MESSAGE, inlined

ANSWER: Final = "The scripted upstream says: the screenshot shows a blue square."
ANTHROPIC_REFUSAL: Final = "Could not process image"


@dataclass
class Seen:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: Any  # decoded JSON, or None
    raw: bytes
    status: int = 0

    @property
    def path(self) -> str:
        return self.path_qs.split("?", 1)[0]


def anthropic_place(path: tuple[str, ...]) -> str:
    """``messages.N.content.M[.tool_result.content.K].image.source.base64`` for the image at
    ``path`` (``messages/2/content/0/content/1/source/data``) in a Messages body: each content
    block's type follows its index, as the API spells it."""
    block = path[:path.index("source")] if "source" in path else path
    out: list[str] = []
    for i, step in enumerate(block):
        out.append(step)
        if step.isdigit() and i > 0 and block[i - 1] == "content" and i + 1 < len(block):
            out.append("tool_result")  # a block that holds content of its own: a tool_result
    return ".".join(out) + ".image.source.base64"


def openai_place(path: tuple[str, ...]) -> str:
    """``input[1].content[0].image_url`` for the image at ``input/1/content/0/image_url``."""
    block = path[:path.index("image_url") + 1] if "image_url" in path else path
    out = ""
    for step in block:
        out += f"[{step}]" if step.isdigit() else (f".{step}" if out else step)
    return out


@dataclass
class ScriptedUpstream:
    answer: str = ANSWER
    #: The file Claude Code is told to Read on its first agent turn (absolute path), if any.
    read_file: str | None = None
    refused: dict[str, bool] = field(default_factory=dict)
    refusals: int = 0
    received: list[Seen] = field(default_factory=list)
    url: str = ""
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/models", self.models)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    # -- recording and refusing ------------------------------------------------------------------

    async def _seen(self, request: web.Request) -> Seen:
        raw = await request.read()  # aiohttp decompresses gzip/deflate/br request bodies
        try:
            body = msgspec.json.decode(raw) if raw else None
        except msgspec.DecodeError:
            body = None
        seen = Seen(request.method, request.path_qs, dict(request.headers), body, raw)
        self.received.append(seen)
        return seen

    def _refusal(self, seen: Seen, anthropic: bool) -> web.Response | None:
        if not self.refused or seen.body is None:
            return None
        hit = next(((p, found) for p, found in inlined(seen.body) if found in self.refused), None)
        if hit is None:
            return None
        self.refusals += 1
        seen.status = 400
        path, named = hit[0], self.refused[hit[1]]
        if anthropic:
            message = f"{anthropic_place(path)}: {ANTHROPIC_REFUSAL}" if named else ANTHROPIC_REFUSAL
            return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message": message},
                                      "request_id": f"req_scripted{next(self._ids)}"}, status=400)
        return web.json_response({"error": {"message": OPENAI_MESSAGE, "type": "invalid_request_error",
                                            "param": openai_place(path) if named else None,
                                            "code": "invalid_image_format"}}, status=400)

    def requests(self, path: str) -> list[Seen]:
        return [s for s in self.received if s.path == path]

    # -- Anthropic Messages ----------------------------------------------------------------------

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        seen = await self._seen(request)
        refused = self._refusal(seen, anthropic=True)
        seen.status = seen.status or 200
        return refused or web.json_response({"input_tokens": 42})

    def _wants_read(self, body: dict[str, Any]) -> bool:
        if self.read_file is None or not any(t.get("name") == "Read" for t in body.get("tools") or []):
            return False
        for message in body.get("messages") or []:
            content = message.get("content")
            if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result"
                                                 for b in content):
                return False
        return True

    async def messages(self, request: web.Request) -> web.StreamResponse:
        seen = await self._seen(request)
        refused = self._refusal(seen, anthropic=True)
        if refused is not None:
            return refused
        seen.status = 200
        body = seen.body if isinstance(seen.body, dict) else {}
        n = next(self._ids)
        if self._wants_read(body):
            block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_scripted{n}", "name": "Read",
                                     "input": {"file_path": self.read_file}}
            stop = "tool_use"
        else:
            block, stop = {"type": "text", "text": self.answer}, "end_turn"
        model = body.get("model", "claude-sonnet-4-5")
        usage = {"input_tokens": 10, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        message = {"id": f"msg_scripted{n}", "type": "message", "role": "assistant", "model": model,
                   "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return web.json_response(message)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def event(name: str, data: dict[str, Any]) -> None:
            await resp.write(f"event: {name}\ndata: ".encode() + msgspec.json.encode(data) + b"\n\n")

        await event("message_start", {"type": "message_start",
                                      "message": dict(message, content=[], stop_reason=None,
                                                      usage=dict(usage, output_tokens=1))})
        if block["type"] == "text":
            await event("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}})
            await event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "text_delta", "text": self.answer}})
        else:
            await event("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": dict(block, input={})})
            await event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "input_json_delta",
                                                          "partial_json": msgspec.json.encode(block["input"]).decode()}})
        await event("content_block_stop", {"type": "content_block_stop", "index": 0})
        await event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": 7}})
        await event("message_stop", {"type": "message_stop"})
        await resp.write_eof()
        return resp

    # -- OpenAI Responses ------------------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        seen = await self._seen(request)
        refused = self._refusal(seen, anthropic=False)
        if refused is not None:
            return refused
        seen.status = 200
        body = seen.body if isinstance(seen.body, dict) else {}
        n = next(self._ids)
        model = body["model"] if isinstance(body.get("model"), str) else "gpt-5"
        done = response_object(self.answer, model=model)
        done["id"] = f"resp_scripted{n}"
        item = done["output"][0]
        item["id"] = f"msg_scripted{n}"
        if not body.get("stream"):
            return web.json_response(done)
        started = dict(copy.deepcopy(done), status="in_progress", output=[], usage=None, completed_at=None)
        ref = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": started},
            {"type": "response.in_progress", "response": started},
            {"type": "response.output_item.added", "output_index": 0,
             "item": dict(item, status="in_progress", content=[])},
            {"type": "response.content_part.added", **ref, "part": part},
            {"type": "response.output_text.delta", **ref, "delta": self.answer, "logprobs": []},
            {"type": "response.output_text.done", **ref, "text": self.answer, "logprobs": []},
            {"type": "response.content_part.done", **ref, "part": dict(part, text=self.answer)},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": dict(done, usage=copy.deepcopy(USAGE))},
        ]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for seq, ev in enumerate(events):
            ev["sequence_number"] = seq
            await resp.write(f"event: {ev['type']}\ndata: ".encode() + msgspec.json.encode(ev) + b"\n\n")
        await resp.write_eof()
        return resp

    async def models(self, request: web.Request) -> web.StreamResponse:
        seen = await self._seen(request)
        seen.status = 200
        ids = ["gpt-5", "gpt-5-codex", "claude-sonnet-4-5"]
        return web.json_response({"object": "list",
                                  "data": [{"id": m, "object": "model", "created": 1700000000, "owned_by": "scripted"}
                                           for m in ids],
                                  "models": []})

    async def other(self, request: web.Request) -> web.StreamResponse:
        seen = await self._seen(request)
        seen.status = 404
        return web.json_response({"error": {"message": f"scripted upstream: no route {request.path}",
                                            "type": "not_found"}}, status=404)
