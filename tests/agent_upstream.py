"""A scripted upstream for the real clients (``tests.agents``: Claude Code, the Codex CLI;
``tests.aider``): enough of OpenAI Chat Completions, Anthropic Messages and the OpenAI Responses
API for each to finish a turn non-interactively, and a dead-end proxy (``Trap``) for everything a
client would reach beyond loopback.

Every answer is the text ``answer``, as one JSON document or, when the request sets ``stream``, as
SSE with a delta per word:

- ``POST /v1/chat/completions``: a ``chat.completion`` (``chat.completion.chunk`` events, a usage
  chunk when ``stream_options.include_usage`` asks for one, then ``[DONE]``).
- ``POST /v1/messages`` (``?beta=true`` too). A request that offers the ``Read`` tool while
  ``read_file`` is set and carries no ``tool_result`` yet is answered with one ``tool_use`` of
  ``Read`` on that file; every other one (the follow-up turn, Claude Code's side calls: quota
  probe, topic/title detection) with the text. With ``read_files``, one ``Read`` per agent turn,
  of each file in turn, then the text. With ``enforce``, a call the providers' documented image
  limits refuse (``tests.limits``: the many-image rule, 8000 px, ...) is answered with the refusal.
- ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``.
- ``POST /v1/responses``: a Response with one assistant message (the SSE sequence
  ``response.created`` ... ``response.completed``).
- ``GET /v1/models``: a models list (OpenAI's ``data`` and Codex's own ``models`` key).
- Gemini (Gemini CLI): ``POST /v1beta/models/MODEL:generateContent`` and
  ``:streamGenerateContent`` (SSE with ``alt=sse``) answer the text; ``:countTokens`` a count;
  ``GET /v1beta/models`` a list.
- Anything else: 404.

Every request is recorded (``received``: a ``Seen`` with method, path with query, headers, the
body as sent and decoded, the status answered, a Messages call's scripted ``stop_reason``; aiohttp
undoes any ``Content-Encoding``, the header itself is kept). ``refused`` maps an attachment id
(``sha256:`` of the decoded image bytes) to whether the refusal names the image's place; a model
call inlining one is answered with its provider's error, in the shapes of ``tests/refusing.py``:

- Anthropic: 400 ``{"type":"error","error":{"type":"invalid_request_error","message":"Could not
  process image"}}``; named: ``messages.N.content.M.image.source.base64: Could not process image``,
  for an image inside a ``tool_result``
  ``messages.N.content.M.tool_result.content.K.image.source.base64: ...`` (the block's type follows
  its index; the shape of real errors, e.g. "messages.30.content.0.tool_result.content.0.image.
  source.base64: image exceeds 5 MB maximum", "messages.106.content.0.tool_result.content.0.image.
  source.base64.media_type: Input should be ..."), or down to another field of the source
  (``anthropic_field="base64.data"``: ``messages.8.content.1.image.source.base64.data: ...``).
- OpenAI (Chat Completions, Responses): 400 ``{"error":{"message":"You uploaded an unsupported
  image. ...","type":"invalid_request_error","param":null,"code":"invalid_image_format"}}``;
  named: ``param`` is the part's place, ``messages[3].content[1].image_url``,
  ``input[1].content[0].image_url``.
- Gemini: 400 ``{"error":{"code":400,"message":"Unable to process input image. ...","status":
  "INVALID_ARGUMENT"}}``; named: the message opens with Google's ``Invalid value at
  'contents[0].parts[1].inline_data': ``.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from tests.fake_gemini import gemini_response
from tests.fake_responses import USAGE, response_object
from tests.limits import anthropic_refusal
from tests.refusing import inlined, refusal

ANSWER: Final = "The scripted upstream says: the screenshot shows a blue square."
#: The model calls, the routes that refuse an image.
MODEL_ROUTES: Final = frozenset({"/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"})


@dataclass
class Seen:
    """One request the scripted upstream received, and the status it answered."""

    method: str
    path_qs: str
    headers: CIMultiDict[str]
    body: Any  # decoded JSON, or None
    raw: bytes
    status: int = 0
    #: A Messages call's ``stop_reason`` as scripted: ``tool_use`` (the ``Read``) or ``end_turn`` (the text).
    stop_reason: str | None = None

    @property
    def path(self) -> str:
        return self.path_qs.split("?", 1)[0]

    @property
    def images(self) -> list[tuple[tuple[str, ...], str]]:
        """Every inlined image: (path of the value in the body, ``sha256:`` of its decoded bytes)."""
        return list(inlined(self.body)) if self.body is not None else []


SEEN: Final = web.RequestKey("scripted_seen", Seen)


def anthropic_place(path: tuple[str, ...], source_field: str = "base64") -> str:
    """``messages.N.content.M[.tool_result.content.K].image.source.<source_field>`` for the image
    at ``path`` (``messages/2/content/0/content/1/source/data``) in a Messages body: each content
    block's type follows its index, as the API spells it."""
    block = path[:path.index("source")] if "source" in path else path
    out: list[str] = []
    for i, step in enumerate(block):
        out.append(step)
        if step.isdigit() and i > 0 and block[i - 1] == "content" and i + 1 < len(block):
            out.append("tool_result")  # a block that holds content of its own: a tool_result
    return ".".join(out) + ".image.source." + source_field


def openai_place(path: tuple[str, ...]) -> str:
    """``input[1].content[0].image_url`` for the image at ``input/1/content/0/image_url`` (and
    ``messages[3].content[1].image_url`` for ``messages/3/content/1/image_url/url``)."""
    block = path[:path.index("image_url") + 1] if "image_url" in path else path
    out = ""
    for step in block:
        out += f"[{step}]" if step.isdigit() else (f".{step}" if out else step)
    return out


def gemini_place(path: tuple[str, ...]) -> str:
    """``contents[0].parts[1].inline_data`` for the image at ``contents/0/parts/1/inline_data/data``."""
    block = path[:-1] if path and path[-1] == "data" else path
    out = ""
    for step in block:
        out += f"[{step}]" if step.isdigit() else (f".{step}" if out else step)
    return out


def is_model_call(path: str) -> bool:
    """A route that carries images: the model calls of every format."""
    return path in MODEL_ROUTES or path.startswith("/v1beta/models/") and path.endswith(("generateContent",
                                                                                         "GenerateContent"))


def filled(schema: dict[str, Any]) -> Any:
    """A value that a JSON schema (Gemini's spelling, ``STRING``, ``OBJECT``, ...) accepts: each
    property filled, the first of an enum, a number in the middle of a 1-100 score."""
    kind = str(schema.get("type", "OBJECT")).upper()
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "OBJECT":
        return {name: filled(sub) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "ARRAY":
        return [filled(schema.get("items") or {"type": "STRING"})]
    return {"STRING": "scripted", "INTEGER": 50, "NUMBER": 50, "BOOLEAN": False}.get(kind)


def words(text: str) -> list[str]:
    """``text`` as streamed: a piece per word, each but the last with its space."""
    pieces = text.split(" ")
    return [piece + " " for piece in pieces[:-1]] + pieces[-1:]


async def sse(request: web.Request, events: Iterable[dict[str, Any]], *, named: bool) -> web.StreamResponse:
    """Stream ``events``: ``event: <type>`` lines (Messages, Responses) when ``named``, else bare
    ``data:`` lines closed by ``[DONE]`` (Chat Completions)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for event in events:
        head = f"event: {event['type']}\n".encode() if named else b""
        await resp.write(head + b"data: " + msgspec.json.encode(event) + b"\n\n")
    if not named:
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@dataclass
class ScriptedUpstream:
    answer: str = ANSWER
    #: The prompt tokens a Chat Completions answer reports (a long conversation's count makes
    #: Qwen Code's compaction find that its summary saves tokens, so it keeps it).
    prompt_tokens: int = 10
    #: The file Claude Code is told to Read on its first agent turn (absolute path), if any.
    read_file: str | None = None
    #: Files Claude Code is told to Read one after another, one per agent turn (then it answers).
    read_files: list[str] = field(default_factory=list)
    #: A tool Claude Code is told to call (with no input) this many agent turns, one per turn
    #: (then it answers): an MCP server's ``screenshot``, say (``tests/mcp_screenshots.py``).
    tool_turns: tuple[str, int] | None = None
    #: Whether a model call the providers' documented image limits refuse is refused, in their
    #: words (``tests.limits``); ``limit_refusals`` holds each message sent.
    enforce: bool = False
    limit_refusals: list[str] = field(default_factory=list)
    refused: dict[str, bool] = field(default_factory=dict)
    #: Refuse every inlined image, whatever its bytes (None: only ``refused``); the value says
    #: whether the refusal names the place. For agents that re-encode an image before sending it.
    refuse_any: bool | None = None
    #: The field of the image source a named Anthropic refusal points at.
    anthropic_field: str = "base64"
    refusals: int = 0
    received: list[Seen] = field(default_factory=list)
    url: str = ""
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self._record])
        app.on_response_prepare.append(self._answered)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1beta/models/{call}", self.gemini)
        app.router.add_get("/v1beta/models", self.gemini_models)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    def requests(self, path: str) -> list[Seen]:
        return [s for s in self.received if s.path == path]

    # -- recording and refusing ------------------------------------------------------------------

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        raw = await request.read()  # aiohttp decompresses gzip/deflate/br request bodies
        try:
            body = msgspec.json.decode(raw) if raw else None
        except msgspec.DecodeError:
            body = None
        seen = Seen(request.method, request.path_qs, CIMultiDict(request.headers), body, raw)
        self.received.append(seen)
        request[SEEN] = seen
        if self.enforce and request.method == "POST" and request.path == "/v1/messages" and isinstance(body, dict):
            found = anthropic_refusal(body)
            if found is not None:
                self.limit_refusals.append(found[1]["error"]["message"])
                return web.json_response(found[1], status=found[0])
        if (self.refused or self.refuse_any is not None) and request.method == "POST" and is_model_call(request.path):
            hit = next(((path, found) for path, found in seen.images
                        if found in self.refused or self.refuse_any is not None), None)
            if hit is not None:
                self.refusals += 1
                return self.refusal(request.path, hit[0], self.refused.get(hit[1], bool(self.refuse_any)))
        return await handler(request)

    async def _answered(self, request: web.Request, response: web.StreamResponse) -> None:
        seen = request.get(SEEN)
        if seen is not None:
            seen.status = response.status  # as sent, before a streamed body

    def refusal(self, route: str, path: tuple[str, ...], named: bool) -> web.Response:
        """``tests/refusing.py``'s refusal of the image at ``path``, its place named as the provider
        names it when ``named``."""
        unnamed = refusal(route, path, False)
        if not named:
            return unnamed
        doc = msgspec.json.decode(unnamed.text or "{}")
        if route.startswith("/v1/messages"):
            doc["error"]["message"] = f"{anthropic_place(path, self.anthropic_field)}: {doc['error']['message']}"
        elif route.startswith("/v1beta/"):
            doc["error"]["message"] = f"Invalid value at '{gemini_place(path)}': {doc['error']['message']}"
        else:
            doc["error"]["param"] = openai_place(path)
        return web.json_response(doc, status=unnamed.status)

    @staticmethod
    def _body(request: web.Request) -> dict[str, Any]:
        body = request[SEEN].body
        return body if isinstance(body, dict) else {}

    # -- OpenAI Chat Completions -----------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = self._body(request)
        head = {"id": f"chatcmpl-scripted{next(self._ids)}", "created": 1700000000,
                "model": body["model"] if isinstance(body.get("model"), str) else "gpt-4o"}
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": 7, "total_tokens": self.prompt_tokens + 7}
        if not body.get("stream"):
            message = {"role": "assistant", "content": self.answer}
            return web.json_response(dict(head, object="chat.completion", usage=usage,
                                          choices=[{"index": 0, "message": message, "finish_reason": "stop"}]))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return dict(head, object="chat.completion.chunk",
                        choices=[{"index": 0, "delta": delta, "finish_reason": finish}])

        events = [chunk({"role": "assistant", "content": ""}), *(chunk({"content": w}) for w in words(self.answer)),
                  chunk({}, "stop")]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(dict(chunk({}), choices=[], usage=usage))
        return await sse(request, events, named=False)

    # -- Anthropic Messages ----------------------------------------------------------------------

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"input_tokens": 42})

    def _next_tool(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """The tool call this call is answered with: a ``Read`` of the next one of ``read_files``
        (or of ``read_file`` on the first agent turn), or the next of ``tool_turns``, when the
        call offers that tool."""
        files = self.read_files or ([self.read_file] if self.read_file is not None else [])
        name, turns = self.tool_turns or ("Read", len(files))
        if not turns or not any(t.get("name") == name for t in body.get("tools") or []):
            return None
        done = sum(1 for message in body.get("messages") or [] if isinstance(content := message.get("content"), list)
                   for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
        if done >= turns:
            return None
        return (name, {}) if self.tool_turns else (name, {"file_path": files[done]})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = self._body(request)
        n = next(self._ids)
        tool = self._next_tool(body)
        if tool is not None:
            block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_scripted{n}", "name": tool[0], "input": tool[1]}
            opened = dict(block, input={})
            deltas = [{"type": "input_json_delta", "partial_json": msgspec.json.encode(block["input"]).decode()}]
            stop = "tool_use"
        else:
            block = {"type": "text", "text": self.answer}
            opened = dict(block, text="")
            deltas = [{"type": "text_delta", "text": w} for w in words(self.answer)]
            stop = "end_turn"
        request[SEEN].stop_reason = stop
        usage = {"input_tokens": 10, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        message = {"id": f"msg_scripted{n}", "type": "message", "role": "assistant",
                   "model": body.get("model", "claude-sonnet-4-5"), "content": [block], "stop_reason": stop,
                   "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return web.json_response(message)
        started = dict(message, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
        return await sse(request, [
            {"type": "message_start", "message": started},
            {"type": "content_block_start", "index": 0, "content_block": opened},
            {"type": "ping"},
            *({"type": "content_block_delta", "index": 0, "delta": delta} for delta in deltas),
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
             "usage": {"output_tokens": 7}},
            {"type": "message_stop"},
        ], named=True)

    # -- OpenAI Responses ------------------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = self._body(request)
        n = next(self._ids)
        done = response_object(self.answer, model=body["model"] if isinstance(body.get("model"), str) else "gpt-5")
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
            *({"type": "response.output_text.delta", **ref, "delta": w, "logprobs": []} for w in words(self.answer)),
            {"type": "response.output_text.done", **ref, "text": self.answer, "logprobs": []},
            {"type": "response.content_part.done", **ref, "part": dict(part, text=self.answer)},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": dict(done, usage=copy.deepcopy(USAGE))},
        ]
        return await sse(request, (dict(ev, sequence_number=seq) for seq, ev in enumerate(events)), named=True)

    # -- Gemini ----------------------------------------------------------------------------------

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        model, _, method = request.match_info["call"].partition(":")
        if method == "countTokens":
            return web.json_response({"totalTokens": 42})
        if method not in ("generateContent", "streamGenerateContent"):
            return await self.other(request)
        if method == "generateContent":
            config = self._body(request).get("generationConfig") or {}
            schema = config.get("responseJsonSchema") or config.get("responseSchema")
            if config.get("responseMimeType") == "application/json" and isinstance(schema, dict):
                # Gemini CLI's side calls (its model router, its next-speaker check) ask for JSON
                text = msgspec.json.encode(filled(schema)).decode()
                return web.json_response(gemini_response(model, text))
            return web.json_response(gemini_response(model, self.answer))
        pieces = words(self.answer)
        chunks = [gemini_response(model, piece, finish=None, usage=False) for piece in pieces[:-1]]
        chunks.append(gemini_response(model, pieces[-1]))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(b"data: " + msgspec.json.encode(chunk) + b"\r\n\r\n")
        await resp.write_eof()
        return resp

    async def gemini_models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"models": [{"name": f"models/{m}", "displayName": m,
                                              "supportedGenerationMethods": ["generateContent", "countTokens"]}
                                             for m in ("gemini-2.5-pro", "gemini-2.5-flash")]})

    # -- the rest --------------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.StreamResponse:
        ids = ["gpt-5", "gpt-5-codex", "claude-sonnet-4-5"]
        return web.json_response({"object": "list",
                                  "data": [{"id": m, "object": "model", "created": 1700000000, "owned_by": "scripted"}
                                           for m in ids],
                                  "models": []})

    async def other(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": f"scripted upstream: no route {request.method} {request.path}",
                                            "type": "not_found"}}, status=404)


class Trap:
    """A dead-end HTTP proxy on loopback: the runs' ``HTTP(S)_PROXY``, so that anything a client
    tries to reach beyond loopback (release checks, price maps, analytics) is recorded here and
    refused (403), never sent out. Loopback itself is in ``NO_PROXY``."""

    def __init__(self) -> None:
        self.requests: list[str] = []  # each attempt's request line, e.g. ``CONNECT pypi.org:443 HTTP/1.1``
        self.url = ""
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> Trap:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            self.requests.append(line.decode(errors="replace").strip())
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def env(self) -> dict[str, str]:
        loopback = "127.0.0.1,localhost,::1"
        return {"HTTP_PROXY": self.url, "HTTPS_PROXY": self.url, "http_proxy": self.url, "https_proxy": self.url,
                "ALL_PROXY": self.url, "NO_PROXY": loopback, "no_proxy": loopback}
