"""Test double: the fake upstream refuses chosen images, in each provider's real error shape.

``FakeUpstream.script`` lets a test answer any call itself first. ``FakeUpstream.refused`` maps an attachment id (the sha256 of the image bytes) to whether the
refusal names the image's place (Anthropic's ``messages.N.content.M.image.source...`` prefix).
A request that inlines any refused image is answered with its provider's image-rejection error
(and recorded like every other request); the shapes are the ones users report:

- Anthropic: ``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``
  ("Could not process image"; with a path: "messages.1.content.2.image.source.base64: ...",
  anthropics/claude-code#1747, #4083);
- OpenAI: ``{"error": {"message": "You uploaded an unsupported image...", "type":
  "invalid_request_error", "param": null, "code": "invalid_image_format"}}``;
- Gemini: ``{"error": {"code": 400, "message": "Unable to process input image...", "status":
  "INVALID_ARGUMENT"}}``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

if TYPE_CHECKING:
    from tests.fakes import FakeUpstream

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: A test's own answers: (request, its decoded JSON body or None) -> a response, or None to go on.
Script = Callable[[web.Request, Any], Awaitable[web.StreamResponse | None]]

OPENAI_MESSAGE = ("You uploaded an unsupported image. Please make sure your image is below 20 MB in size and is of "
                  "one the following formats: ['png', 'jpeg', 'gif', 'webp'].")
GEMINI_MESSAGE = ("Unable to process input image. Please retry or report in "
                  "https://developers.generativeai.google/guide/troubleshooting")


def _b64_id(value: str) -> str | None:
    data = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
    if len(data) < 8:
        return None
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def inlined(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every inlined image of a request body: (path of the value, attachment id of its bytes)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from inlined(value, (*path, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from inlined(value, (*path, str(i)))
    elif isinstance(node, str) and (node.startswith("data:image/") or path and path[-1] == "data"):
        found = _b64_id(node)
        if found is not None:
            yield path, found


def refusal(route: str, path: tuple[str, ...], named: bool) -> web.Response:
    if route.startswith("/v1/messages"):
        block = path[:path.index("source")] if "source" in path else path
        where = ".".join(block) + ".image.source.base64: " if named else ""
        return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                             "message": where + "Could not process image"},
                                  "request_id": "req_fake"}, status=400)
    if "/models/" in route:
        return web.json_response({"error": {"code": 400, "message": GEMINI_MESSAGE, "status": "INVALID_ARGUMENT"}},
                                 status=400)
    return web.json_response({"error": {"message": OPENAI_MESSAGE, "type": "invalid_request_error", "param": None,
                                        "code": "invalid_image_format"}}, status=400)


def refusing(fake: FakeUpstream) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The fake upstream's middleware: a test's ``fake.script`` answers first (or passes with
    None), then a request inlining any of ``fake.refused`` is refused; what either answers is
    recorded like every other request."""
    from tests.fakes import Received

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST" or not (fake.refused or fake.script):
            return await handler(request)
        body = await request.read()
        try:
            doc = msgspec.json.decode(body)
        except msgspec.DecodeError:
            doc = None
        answer: web.StreamResponse | None = None
        if fake.script is not None:
            fake.calls += 1
            answer = await fake.script(request, doc)
        if answer is None and fake.refused and doc is not None:
            hit = next(((path, found) for path, found in inlined(doc) if found in fake.refused), None)
            if hit is not None:
                fake.refusals += 1
                answer = refusal(request.path, hit[0], fake.refused[hit[1]])
        if answer is None:
            return await handler(request)
        fake.received.append(Received(request.method, request.path_qs, dict(request.headers), body))
        return answer

    return middleware
