"""The built-in fake provider of ``projectionist demo`` and ``serve --fake-upstream`` (proxy layer, ops).

A keyless stand-in for every format the proxy speaks, so that the proxy can be tried without a
provider's key: OpenAI Chat Completions and Responses, Anthropic Messages and Gemini
``generateContent``, each streamed (SSE) when asked to, and their token counting. It checks no
key. Its answers are canned and say what the model would have seen of the last turn ("I see:
'What is this?', an image"), so a placeholder the proxy put in an image's place shows in the
answer.

It refuses an image as the providers do (HTTP 400, in each provider's own error shape, in words
the proxy knows), so that the proxy's handling of a refusal can be watched:

- an inlined image whose bytes contain ``MARKER`` (``projectionist-refuse``: append it to any
  PNG, ``printf projectionist-refuse >> shot.png``; image readers ignore what follows the image);
- every inlined image, with ``refuse_all`` (``serve --fake-refuse-images``);
- an image whose id (the sha256 of its bytes) is in ``refuse`` (the demo's way).

An image the provider would fetch by URL is never fetched, nor refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final

import msgspec
from aiohttp import web

from ..config import Config

#: What an image's bytes contain for the fake upstream to refuse it.
MARKER: Final = b"projectionist-refuse"
#: The model name the answers carry when the request names none.
MODEL: Final = "fake-model"
#: The words each provider refuses an image with (the proxy's adapters know them).
OPENAI_REFUSAL: Final[dict[str, dict[str, Any]]] = {"error": {
    "message": "Invalid image.", "type": "invalid_request_error", "param": None, "code": "invalid_image"}}
GEMINI_REFUSAL: Final = {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": (
    "Unable to process input image. Please retry or report in "
    "https://developers.generativeai.google/guide/troubleshooting")}}
#: Keys whose dict value is an image part in some format.
_IMAGE_KINDS: Final = frozenset({"image_url", "input_image", "image", "computer_screenshot"})
_INLINE_KEYS: Final = ("inline_data", "inlineData")
_FILE_KEYS: Final = ("file_data", "fileData")

Json = Any


def image_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _decoded(value: str) -> bytes | None:
    """The bytes of a base64 value or data URL; None when it is neither."""
    data = value.split(",", 1)[1] if value.startswith("data:") else value
    if len(data) < 8:
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def inlined(node: Json, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], bytes]]:
    """Every image inlined in a request body, in document order: (path of its value, its bytes).
    An image's data URL anywhere (OpenAI's), or the ``data`` of a member typed ``image/...``
    (Anthropic's ``source``, Gemini's ``inline_data``)."""
    if isinstance(node, dict):
        kind = node.get("media_type") or node.get("mime_type") or node.get("mimeType")
        for key, value in node.items():
            if key == "data" and isinstance(value, str) and isinstance(kind, str) and kind.startswith("image/"):
                data = _decoded(value)
                if data is not None:
                    yield (*path, key), data
            else:
                yield from inlined(value, (*path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from inlined(value, (*path, str(index)))
    elif isinstance(node, str) and node.startswith("data:image/"):
        data = _decoded(node)
        if data is not None:
            yield path, data


def seen(node: Json) -> list[str]:
    """What a model would 'see' of a turn's content, part by part: quoted text, "an image", "a file"."""
    if isinstance(node, str):
        return [repr(node)]
    if isinstance(node, list):
        return [item for part in node for item in seen(part)]
    if not isinstance(node, dict):
        return []
    inline = next((node[k] for k in _INLINE_KEYS if isinstance(node.get(k), dict)), None)
    if inline is not None:
        kind = str(inline.get("mime_type") or inline.get("mimeType") or "")
        return ["an image" if kind.startswith("image/") else "a file"]
    if node.get("type") in _IMAGE_KINDS:
        return ["an image"]
    if any(k in node for k in _FILE_KEYS) or node.get("type") in ("file", "input_file", "document"):
        return ["a file"]
    if isinstance(node.get("text"), str):
        return [repr(node["text"])]
    inner = node.get("content", node.get("parts"))
    return seen(inner) if inner is not None else []


def last_turn(body: Json) -> Json:
    """The content of the last turn of a request, in any of the formats."""
    if not isinstance(body, dict):
        return None
    for key in ("messages", "contents", "input"):
        turns = body.get(key)
        if isinstance(turns, str):
            return turns
        if isinstance(turns, list) and turns:
            last = turns[-1]
            return last.get("content", last.get("parts")) if isinstance(last, dict) else last
    return None


def reply(body: Json) -> str:
    """The canned answer to ``body``: what the model saw of its last turn."""
    parts = seen(last_turn(body))
    return "I see: " + ", ".join(parts) if parts else "I see nothing in the last turn."


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _words(text: str) -> list[str]:
    """``text`` in a few stream chunks, together exactly ``text``."""
    words = text.split(" ")
    size = max(1, len(words) // 4)
    return [" ".join(words[i:i + size]) + (" " if i + size < len(words) else "") for i in range(0, len(words), size)]


class FakeUpstream:
    """The fake provider: ``app()`` to serve; ``bodies`` holds every body it received, in order;
    it refuses the images in ``refuse`` (by id), those carrying ``MARKER``, and with ``refuse_all``
    every inlined image."""

    def __init__(self, *, refuse_all: bool = False) -> None:
        self.bodies: list[bytes] = []
        self.refuse: set[str] = set()
        self.refuse_all = refuse_all
        #: How many calls it refused.
        self.refusals = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        router = app.router
        for prefix in ("/v1", ""):  # an upstream configured with or without the /v1 of its base URL
            router.add_post(f"{prefix}/chat/completions", self.chat)
            router.add_post(f"{prefix}/responses", self.responses)
            router.add_post(f"{prefix}/responses/input_tokens", self.count)
            router.add_post(f"{prefix}/messages", self.messages)
            router.add_post(f"{prefix}/messages/count_tokens", self.count)
            router.add_get(f"{prefix}/models", self.models)
        for version in ("v1beta", "v1alpha", "v1"):
            router.add_post(f"/{version}/models/{{target}}", self.gemini)
        router.add_route("*", "/{tail:.*}", self.unknown)
        return app

    # -- what every route does first ---------------------------------------------------------------

    async def _read(self, request: web.Request, refusal: Callable[[tuple[str, ...]], web.Response]
                    ) -> tuple[Json, web.Response | None]:
        """The request's JSON body, kept, and the refusal it earns (None: answer it)."""
        raw = await request.read()
        self.bodies.append(raw)
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return None, web.json_response({"error": {
                "message": "the body is not JSON", "type": "invalid_request_error", "param": None, "code": None}},
                status=400)
        for path, data in inlined(body):
            if self.refuse_all or MARKER in data or image_id(data) in self.refuse:
                self.refusals += 1
                return body, refusal(path)
        return body, None

    @staticmethod
    def _openai_refusal(path: tuple[str, ...]) -> web.Response:
        """OpenAI's words, its ``param`` naming the refused part (``messages[0].content[2].image_url``)."""
        part = path[:path.index("content") + 2] if "content" in path else path
        param = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in part).lstrip(".")
        return web.json_response({"error": {**OPENAI_REFUSAL["error"], "param": f"{param}.image_url"}}, status=400)

    @staticmethod
    def _anthropic_refusal(path: tuple[str, ...]) -> web.Response:
        """Anthropic's words, naming the refused block's place as the API does."""
        block = path[:path.index("source")] if "source" in path else path
        message = ".".join(block) + ".image.source.base64: Could not process image"
        return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message": message},
                                  "request_id": "req_fake"}, status=400)

    @staticmethod
    def _gemini_refusal(path: tuple[str, ...]) -> web.Response:
        return web.json_response(GEMINI_REFUSAL, status=400)

    # -- OpenAI ------------------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body, refused = await self._read(request, self._openai_refusal)
        if refused is not None:
            return refused
        text, model = reply(body), _model(body)
        usage = {"prompt_tokens": _tokens(str(body)), "completion_tokens": _tokens(text)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if not body.get("stream"):
            return web.json_response({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": usage})

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        events = [chunk({"role": "assistant", "content": ""}), *(chunk({"content": w}) for w in _words(text)),
                  chunk({}, "stop")]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**chunk({}), "choices": [], "usage": usage})
        return await _sse(request, [(None, e) for e in events], done=True)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body, refused = await self._read(request, self._openai_refusal)
        if refused is not None:
            return refused
        text, model = reply(body), _model(body)
        if not body.get("stream"):
            return web.json_response(_response(model, text))
        part = {"item_id": "msg_fake", "output_index": 0, "content_index": 0}
        empty = {"type": "output_text", "text": "", "annotations": []}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": _response(model, None)},
            {"type": "response.in_progress", "response": _response(model, None)},
            {"type": "response.output_item.added", "output_index": 0, "item": _output(text, done=False)},
            {"type": "response.content_part.added", **part, "part": empty},
            *({"type": "response.output_text.delta", **part, "delta": w} for w in _words(text)),
            {"type": "response.output_text.done", **part, "text": text},
            {"type": "response.content_part.done", **part, "part": {**empty, "text": text}},
            {"type": "response.output_item.done", "output_index": 0, "item": _output(text)},
            {"type": "response.completed", "response": _response(model, text)},
        ]
        for number, event in enumerate(events):
            event["sequence_number"] = number
        return await _sse(request, [(str(e["type"]), e) for e in events])

    async def models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [
            {"id": MODEL, "object": "model", "created": 0, "owned_by": "projectionist-fake-upstream"}]})

    # -- Anthropic ---------------------------------------------------------------------------------

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body, refused = await self._read(request, self._anthropic_refusal)
        if refused is not None:
            return refused
        text, model = reply(body), _model(body)
        usage = {"input_tokens": _tokens(str(body)), "output_tokens": _tokens(text)}
        message = {"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                   "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": usage}
        if not body.get("stream"):
            return web.json_response(message)
        events: list[dict[str, Any]] = [
            {"type": "message_start", "message": {**message, "content": [], "stop_reason": None,
                                                  "usage": {**usage, "output_tokens": 0}}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
              for w in _words(text)),
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
             "usage": {"output_tokens": usage["output_tokens"]}},
            {"type": "message_stop"},
        ]
        return await _sse(request, [(str(e["type"]), e) for e in events])

    async def count(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's ``count_tokens`` and OpenAI's ``responses/input_tokens``."""
        openai = "/responses/" in request.path
        body, refused = await self._read(request, self._openai_refusal if openai else self._anthropic_refusal)
        if refused is not None:
            return refused
        tokens = _tokens(str(body))
        return web.json_response({"object": "response.input_tokens", "input_tokens": tokens} if openai
                                 else {"input_tokens": tokens})

    # -- Gemini ------------------------------------------------------------------------------------

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        model, _, method = request.match_info["target"].partition(":")
        if method not in ("generateContent", "streamGenerateContent", "countTokens"):
            return await self.unknown(request)
        body, refused = await self._read(request, self._gemini_refusal)
        if refused is not None:
            return refused
        if method == "countTokens":
            return web.json_response({"totalTokens": _tokens(str(body))})
        text = reply(body)
        if method == "generateContent":
            return web.json_response(_candidate(model, text, body, last=True))
        words = _words(text)
        chunks = [_candidate(model, w, body, last=i == len(words) - 1) for i, w in enumerate(words)]
        if request.query.get("alt") != "sse":
            return web.json_response(chunks)  # without alt=sse Google streams one JSON array
        return await _sse(request, [(None, c) for c in chunks], crlf=True)

    # -- anything else -----------------------------------------------------------------------------

    async def unknown(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {
            "message": f"the fake upstream does not answer {request.method} {request.path}", "type": "not_found",
            "param": None, "code": None}}, status=404)


def _model(body: Json) -> str:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else MODEL


def _output(text: str, *, done: bool = True) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if done else []
    return {"id": "msg_fake", "type": "message", "role": "assistant", "status": "completed" if done else "in_progress",
            "content": content}


def _response(model: str, text: str | None) -> dict[str, Any]:
    """A Responses ``response`` object; ``text=None``: the one in progress, before any output."""
    done = text is not None
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": _tokens(text or ""),
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10 + _tokens(text or "")}
    return {"id": "resp_fake", "object": "response", "created_at": int(time.time()),
            "status": "completed" if done else "in_progress", "error": None, "incomplete_details": None,
            "model": model, "output": [_output(text)] if text is not None else [], "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "usage": usage if done else None}


def _candidate(model: str, text: str, body: Json, *, last: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
    answer: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": "fake-gemini"}
    if last:
        candidate["finishReason"] = "STOP"
        prompt, output = _tokens(str(body)), _tokens(text)
        answer["usageMetadata"] = {"promptTokenCount": prompt, "candidatesTokenCount": output,
                                   "totalTokenCount": prompt + output}
    return answer


async def _sse(request: web.Request, events: list[tuple[str | None, Json]], *, done: bool = False,
               crlf: bool = False) -> web.StreamResponse:
    """Server-sent events: each ``(name, data)`` one event (``event:`` when named); OpenAI's chat
    ends with ``[DONE]``, Google ends each event with CRLFs."""
    end = b"\r\n\r\n" if crlf else b"\n\n"
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for name, data in events:
        head = f"event: {name}\n".encode() if name else b""
        await response.write(head + b"data: " + msgspec.json.encode(data) + end)
    if done:
        await response.write(b"data: [DONE]" + end)
    await response.write_eof()
    return response


# -- running it beside the proxy ---------------------------------------------------------------------

def loopback_socket() -> socket.socket:
    """A socket bound to a free loopback port (its URL is known before anything listens on it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def url_of(sock: socket.socket) -> str:
    return "http://127.0.0.1:%d" % sock.getsockname()[1]


def pointed_at(config: Config, url: str) -> Config:
    """``config`` with every upstream sent to ``url``, and no key held for any: the fake takes none,
    and an ``api_key_env`` naming an unset variable would stop ``serve``."""
    upstreams = {name: msgspec.structs.replace(up, url=url, api_key="", api_key_env="")
                 for name, up in config.upstreams.items()}
    return msgspec.structs.replace(config, upstreams=upstreams)


def serving(fake: FakeUpstream, sock: socket.socket) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` serving ``fake`` on ``sock`` for the proxy's life, in its process and loop."""

    async def context(_: web.Application) -> AsyncIterator[None]:
        runner = web.AppRunner(fake.app(), handle_signals=False, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        try:
            yield
        finally:
            await runner.cleanup()

    return context
