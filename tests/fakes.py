"""Test doubles: a recording fake upstream and store wrappers that count or script reads."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from projectionist.policy.errors import AttachmentError
from projectionist.policy.model import StoredImage
from projectionist.proxy.stores.base import AttachmentMeta, Store, UploadParts

if TYPE_CHECKING:
    from tests.refusing import Script

COMPLETION = {
    "id": "chatcmpl-fake", "object": "chat.completion", "created": 1700000000, "model": "fake-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the fake upstream."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17},
}
MESSAGE = {
    "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-model",
    "content": [{"type": "text", "text": "Hello from the fake upstream."}],
    "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 7},
}


@dataclass
class Received:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


@dataclass
class FakeUpstream:
    """Records every request; answers like OpenAI/Anthropic, streaming when asked to."""

    received: list[Received] = field(default_factory=list)
    chunks: int = 5
    chunk_delay: float = 0.0
    url: str = ""
    #: When set, streams pause after their first chunk until the gate opens.
    gate: asyncio.Event | None = None
    #: Images this upstream refuses (``tests.refusing``): id -> whether the error names its place.
    refused: dict[str, bool] = field(default_factory=dict)
    refusals: int = 0
    #: A test's own answers, tried first (``tests.refusing``); ``calls`` counts the POSTs it saw.
    script: Script | None = None
    calls: int = 0

    @property
    def last(self) -> Received:
        return self.received[-1]

    def app(self) -> web.Application:
        from tests.fake_gemini import install_gemini
        from tests.fake_responses import install_responses
        from tests.refusing import refusing

        # it keeps what it received as it came (a compressed body stays compressed)
        app = web.Application(client_max_size=256 * 1024 * 1024, handler_args={"auto_decompress": False},
                              middlewares=[refusing(self)])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/messages", self.messages)
        install_responses(app, self)
        install_gemini(app, self)
        app.router.add_route("*", "/{tail:.*}", self.echo)
        return app

    async def echo(self, request: web.Request) -> web.StreamResponse:
        """Any other route: record it, answer what was received (status from ``x-fake-status``)."""
        body = await request.read()
        self.received.append(Received(request.method, request.path_qs, dict(request.headers), body))
        status = int(request.headers.get("x-fake-status", "200"))
        return web.json_response({"method": request.method, "path_qs": request.path_qs, "body_len": len(body)},
                                 status=status, headers={"x-fake-upstream": "echo"})

    async def _record(self, request: web.Request) -> Any:
        body = await request.read()
        self.received.append(Received(request.method, request.path_qs, dict(request.headers), body))
        return msgspec.json.decode(body)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await self._record(request)
        if not req.get("stream"):
            return web.json_response(COMPLETION)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(self.chunks):
            delta = {"role": "assistant", "content": ""} if i == 0 else {"content": f"tok{i} "}
            chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000,
                     "model": "fake-model", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await resp.write(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
            if i == 0 and self.gate is not None:
                await self.gate.wait()
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def messages(self, request: web.Request) -> web.StreamResponse:
        req = await self._record(request)
        if not req.get("stream"):
            return web.json_response(MESSAGE)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def event(name: str, data: dict[str, Any]) -> None:
            await resp.write(f"event: {name}\ndata: ".encode() + msgspec.json.encode(data) + b"\n\n")

        start = dict(MESSAGE, content=[], stop_reason=None)
        await event("message_start", {"type": "message_start", "message": start})
        await event("content_block_start", {"type": "content_block_start", "index": 0,
                                            "content_block": {"type": "text", "text": ""}})
        for i in range(self.chunks):
            await event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "text_delta", "text": f"tok{i} "}})
        await event("content_block_stop", {"type": "content_block_stop", "index": 0})
        await event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                      "stop_sequence": None}, "usage": {"output_tokens": self.chunks}})
        await event("message_stop", {"type": "message_stop"})
        await resp.write_eof()
        return resp


class CountingStore:
    """Wraps a real store; counts reads per id and can inject faults or delays per read."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads: Counter[str] = Counter()
        self.stamp_checks: Counter[str] = Counter()
        self.stamp_batches = 0
        #: Called before each read with (id, read number); may raise, return a delay in seconds,
        #: or return an awaitable (an async script) to await.
        self.script: Callable[[str, int], Any] | None = None

    @property
    def total(self) -> int:
        return sum(self.reads.values())

    @property
    def ops(self) -> Any:
        """The wrapped store's own operation counter."""
        return getattr(self.inner, "ops", None)

    async def _before_read(self, attachment_id: str) -> None:
        self.reads[attachment_id] += 1
        if self.script is not None:
            step = self.script(attachment_id, self.reads[attachment_id])
            if inspect.isawaitable(step):
                await step
            elif step:
                await asyncio.sleep(step)

    async def read_image(self, attachment_id: str) -> StoredImage:
        await self._before_read(attachment_id)
        return await self.inner.read_image(attachment_id)

    async def read_stamped(self, attachment_id: str) -> tuple[StoredImage, str | None]:
        await self._before_read(attachment_id)
        return await self.inner.read_stamped(attachment_id)  # type: ignore[attr-defined,no-any-return]

    async def stamps(self, attachment_ids: list[str]) -> list[str | None]:
        self.stamp_batches += 1
        for attachment_id in attachment_ids:
            self.stamp_checks[attachment_id] += 1
        return await self.inner.stamps(attachment_ids)  # type: ignore[attr-defined,no-any-return]

    async def admit(self, data: bytes, declared_type: str | None = None, *, name: str | None = None,
                    publish: bool = False) -> StoredImage:
        return await self.inner.admit(data, declared_type, name=name, publish=publish)

    async def stat(self, attachment_id: str) -> AttachmentMeta | None:
        return await self.inner.stat(attachment_id)

    async def list_admitted(self, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]:
        return await self.inner.list_admitted(after, limit)

    async def delete(self, attachment_id: str) -> bool:
        return await self.inner.delete(attachment_id)

    async def grant(self, tenant: str, attachment_id: str, name: str | None = None) -> None:
        await self.inner.grant(tenant, attachment_id, name)

    async def granted(self, tenant: str, attachment_id: str) -> AttachmentMeta | None:
        return await self.inner.granted(tenant, attachment_id)

    async def list_granted(self, tenant: str, after: str | None = None, limit: int = 100) -> list[AttachmentMeta]:
        return await self.inner.list_granted(tenant, after, limit)

    async def has_grant(self, tenant: str, attachment_id: str) -> bool:
        return await self.inner.has_grant(tenant, attachment_id)

    async def put_blob(self, data: bytes) -> str:
        return await self.inner.put_blob(data)

    async def get_blob(self, blob_id: str) -> bytes | None:
        return await self.inner.get_blob(blob_id)

    async def variant_of(self, attachment_id: str, target: str) -> str | None:
        return await self.inner.variant_of(attachment_id, target)

    async def put_variant(self, attachment_id: str, target: str, variant_id: str, *,
                          replacing: str | None = None) -> str:
        return await self.inner.put_variant(attachment_id, target, variant_id, replacing=replacing)

    async def variants(self, attachment_id: str) -> dict[str, str]:
        return await self.inner.variants(attachment_id)

    async def put_part(self, upload: str, offset: int, data: bytes) -> bool:
        return await self.inner.put_part(upload, offset, data)

    async def upload_parts(self, upload: str) -> UploadParts:
        return await self.inner.upload_parts(upload)

    async def read_parts(self, upload: str, parts: Sequence[tuple[int, int]]) -> bytes | None:
        return await self.inner.read_parts(upload, parts)

    async def close_upload(self, upload: str) -> bool:
        return await self.inner.close_upload(upload)

    async def drop_parts(self, upload: str) -> None:
        await self.inner.drop_parts(upload)

    async def sweep_uploads(self, opened_before: int) -> int:
        return await self.inner.sweep_uploads(opened_before)

    async def start(self) -> None:  # the app's start-up warms the real store as it would in production
        start = getattr(self.inner, "start", None)
        if start is not None:
            await start()

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()


def fail_with(code: str, times: int = 1_000_000) -> Callable[[str, int], float | None]:
    """A script: the first ``times`` reads of every id raise ``AttachmentError(code)``."""

    def script(attachment_id: str, n: int) -> float | None:
        if n <= times:
            raise AttachmentError(code, attachment_id=attachment_id)
        return None

    return script
