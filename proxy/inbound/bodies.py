"""Request bodies as the proxy reads them: in any declared encoding, and multipart without blocking (proxy layer).

The server never decompresses on its own (``auto_decompress`` is off), so a pass-through
forwards the client's bytes exactly, encoding and length included. A body the proxy itself must
read (a projected call, an upload, an admin request) is decoded here: ``gzip`` and ``deflate``,
bounded by ``client_max_size`` (a decompression bomb is a 413), always off the event loop,
its bytes held of the memory budget as they come (``budget``);
a body that is not in its declared encoding is 400 ``INVALID_BODY``; an encoding the proxy does
not read is 415 ``UNSUPPORTED_ENCODING``. Multipart bodies are parsed by aiohttp's
``MultipartReader`` with a yield between chunks, so a 20 MB upload never stalls other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Callable
from typing import Final

import aiohttp
from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import BadHttpMessage
from multidict import CIMultiDict

from ...policy.errors import Code, InvalidRequest, PayloadTooLarge, ProjectionistError
from .budget import Budget, hold
from .context import CONTEXT, Context

_WBITS: Final = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}

Upload = tuple[bytes, str | None, str | None]


def encoding_of(request: web.Request) -> str:
    """The request's ``Content-Encoding`` (lowercase), '' for none or identity."""
    value = request.headers.get("Content-Encoding", "").strip().lower()
    return "" if value == "identity" else value


#: Gzip members a body may hold: a client sends one; a few concatenated are still read. Each
#: member costs an inflater of its own, so a body of thousands of tiny ones is refused, not read.
MAX_MEMBERS: Final = 64
#: How much compressed input each step of the inflater is given: what it leaves over at a
#: member's end is copied (``unused_data``), so the step bounds that copy, not the body's size.
_STEP: Final = 64 * 1024


def inflate(raw: bytes, encoding: str, limit: int, grow: Callable[[int], None] | None = None) -> bytes:
    """``raw`` decoded from ``encoding`` (blocking); at most ``limit`` bytes come out. A gzip body
    may hold up to ``MAX_MEMBERS`` members (all are decoded); anything after the last member is
    an error. Linear in the body's size whatever its members: each member's inflater reads the
    body in bounded steps from where the last one ended, never a copy of the rest. ``grow`` is
    told the size of each piece of output before the next is made (it may raise to stop it)."""
    if encoding not in _WBITS:
        raise ProjectionistError(f"Content-Encoding {encoding[:40]!r} is not read here: send gzip, deflate or none",
                                 code=Code.UNSUPPORTED_ENCODING, status=415)
    view = memoryview(raw)
    if encoding == "deflate":  # zlib-wrapped, or raw deflate as some clients send
        for wbits in (zlib.MAX_WBITS, -zlib.MAX_WBITS):
            with contextlib.suppress(zlib.error):
                out, end = _one_member(view, 0, wbits, limit, grow)
                if end == len(raw):
                    return out
        raise InvalidRequest("request body is not valid deflate", code=Code.INVALID_BODY)
    parts: list[bytes] = []
    size = at = 0
    while at < len(raw):
        if len(parts) == MAX_MEMBERS:
            raise InvalidRequest(f"request body holds more than {MAX_MEMBERS} {encoding} members",
                                 code=Code.INVALID_BODY)
        try:
            out, at = _one_member(view, at, _WBITS[encoding], limit - size, grow)
        except zlib.error:
            raise InvalidRequest(f"request body is not valid {encoding}", code=Code.INVALID_BODY) from None
        parts.append(out)
        size += len(out)
    return b"".join(parts)


def _one_member(data: memoryview, at: int, wbits: int, limit: int,
                grow: Callable[[int], None] | None) -> tuple[bytes, int]:
    """The compressed stream of ``data`` that starts at ``at``: what it decodes to (at most
    ``limit`` bytes, else 413) and where it ends."""
    inflater = zlib.decompressobj(wbits)
    parts: list[bytes] = []
    size = 0
    while not inflater.eof:
        if at >= len(data):
            raise zlib.error("truncated")
        step = data[at:at + _STEP]
        at += len(step)
        out = inflater.decompress(step, limit - size + 1)  # stops one byte past the limit at most
        size += len(out)
        if size > limit:
            raise PayloadTooLarge("the decoded request body exceeds client_max_size")
        if grow is not None:
            grow(len(out))
        parts.append(out)
    return b"".join(parts), at - len(inflater.unused_data)


async def read_raw(request: web.Request, budget: Budget, ctx: Context | None = None) -> bytes:
    """The request's body as it came, its bytes held of ``budget`` (by the request of ``ctx``,
    its context unless given) before it is read: its ``Content-Length``, or, without one,
    ``client_max_size`` until it is read, then its size."""
    if not request.body_exists:
        return b""
    limit = request._client_max_size  # noqa: SLF001 (aiohttp keeps it private; it is the app's)
    length = request.content_length
    if length is not None and length > limit:  # aiohttp's own answer, before any byte is held
        raise PayloadTooLarge("request body exceeds the configured client_max_size")
    held = hold(ctx or request[CONTEXT], budget, limit if length is None else length, "body")
    content = request.content
    if content.is_eof():  # most bodies came with their headers: what is buffered is all of it
        raw = _buffered(request, content, limit)
    else:  # one still on its way must keep coming
        raw = await _read_coming(request, limit, budget.idle)
    if length is None:
        held.less(limit - len(raw))
    return raw


def _buffered(request: web.Request, content: aiohttp.StreamReader, limit: int) -> bytes:
    """A body all of which the parser has buffered, taken at once (``request.read()`` reads it
    chunk by chunk, awaiting each, into a bytearray it then copies), and kept where
    ``request.read()`` gives it back."""
    raw = request._read_bytes  # noqa: SLF001 (read already: what request.read() gives back)
    if raw is None:
        raw = content.read_nowait()
        if len(raw) > limit:  # a chunked body has no Content-Length to refuse it by
            raise PayloadTooLarge("request body exceeds the configured client_max_size")
        request._read_bytes = raw  # noqa: SLF001
    return raw


async def _read_coming(request: web.Request, limit: int, idle: float) -> bytes:
    """The rest of a body still on its way, as ``request.read()`` reads it, except that ``idle``
    seconds without a byte end it: 408 ``BODY_TIMEOUT``."""
    chunks: list[bytes] = []
    size = 0
    async with Coming(idle) as coming:
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge("request body exceeds the configured client_max_size")
            chunks.append(chunk)
            coming.came()
    raw = b"".join(chunks)
    request._read_bytes = raw  # noqa: SLF001 (what request.read() and post() give back after their own read)
    return raw


async def decoded(request: web.Request, raw: bytes, budget: Budget) -> bytes:
    """``raw`` decoded from the request's ``Content-Encoding`` on a worker thread (a small body can
    decode to megabytes: the loop never pays for it), each step's output held of ``budget``."""
    encoding = encoding_of(request)
    if not encoding:
        return raw
    limit = request.app._client_max_size  # noqa: SLF001
    held = hold(request[CONTEXT], budget, 0, "decoded")
    return await asyncio.to_thread(inflate, raw, encoding, limit, lambda size: held.grow(size, "decoded"))


async def read_body(request: web.Request, budget: Budget, ctx: Context | None = None) -> bytes:
    """The whole request body, decoded (``read_raw``, then ``decoded``)."""
    raw = await read_raw(request, budget, ctx)
    if "Content-Encoding" not in request.headers:  # most bodies: nothing to decode
        return raw
    return await decoded(request, raw, budget)


def _memory_stream(data: bytes) -> aiohttp.StreamReader:
    stream = aiohttp.StreamReader(BaseProtocol(asyncio.get_running_loop()), len(data) + 1,
                                  loop=asyncio.get_running_loop())
    stream.feed_data(data)
    stream.feed_eof()
    return stream


async def read_part(part: BodyPartReader, limit: int, coming: Coming | None = None) -> bytes:
    """One multipart part, refusing more than ``limit`` bytes; the loop runs between chunks, and
    each chunk puts ``coming``'s deadline off by its idle seconds."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the file exceeds {limit} bytes", code=Code.IMAGE_TOO_LARGE)
        chunks.append(chunk)
        if coming is not None:
            coming.came()
        await asyncio.sleep(0)
    return b"".join(chunks)


class Coming:
    """A body that is read as it comes, ``idle`` seconds at most without a byte (``BODY_TIMEOUT``)."""

    def __init__(self, idle: float) -> None:
        self.idle = idle
        self._deadline: asyncio.Timeout | None = None
        self._loop = asyncio.get_running_loop()

    async def __aenter__(self) -> Coming:
        self._deadline = asyncio.timeout(self.idle)
        await self._deadline.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._deadline is not None
        try:
            await self._deadline.__aexit__(*exc)  # type: ignore[arg-type]
        except TimeoutError:
            raise ProjectionistError(f"the client sent no byte of its body for {self.idle:g} s",
                                     code=Code.BODY_TIMEOUT, status=408, retryable=False) from None

    def came(self) -> None:
        assert self._deadline is not None
        self._deadline.reschedule(self._loop.time() + self.idle)


async def parse_form(content_type: str, raw: bytes, limit: int,
                     field: str = "file") -> tuple[dict[str, str], Upload | None]:
    """Form fields and the first file part (bytes, declared type, file name) of a multipart body
    already read into memory."""
    try:
        content_type.encode("ascii")
    except UnicodeEncodeError:
        raise InvalidRequest("Content-Type must be ASCII", code=Code.INVALID_CONTENT_TYPE) from None
    try:
        reader = MultipartReader(CIMultiDict({"Content-Type": content_type}), _memory_stream(raw))
    except (ValueError, KeyError):  # no boundary, or one aiohttp cannot read
        raise InvalidRequest("malformed multipart body: no boundary", code=Code.INVALID_MULTIPART) from None
    return await form_parts(reader, limit, field)


async def form_parts(reader: MultipartReader, limit: int, field: str = "file",
                     coming: Coming | None = None) -> tuple[dict[str, str], Upload | None]:
    fields: dict[str, str] = {}
    upload: Upload | None = None
    try:
        async for part in reader:
            if not isinstance(part, BodyPartReader):
                continue
            if upload is None and (part.filename is not None or part.name == field):
                upload = (await read_part(part, limit, coming), part.headers.get("Content-Type"), part.filename)
            elif part.name is not None and part.filename is None:
                fields[part.name] = (await read_part(part, 64 * 1024, coming)).decode("utf-8", "replace")
            else:
                await part.release()
    except (BadHttpMessage, ValueError, AssertionError):  # aiohttp's words for a malformed body
        raise InvalidRequest("malformed multipart body", code=Code.INVALID_MULTIPART) from None
    return fields, upload
