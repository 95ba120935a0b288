"""The upstream leg's own HTTP/1.1 client (proxy layer, upstream sublayer): one ``asyncio.Protocol``
per connection, llhttp (``httptools``) parsing the answers, and a pool of keep-alive connections per
origin. It does on the hot path what aiohttp's ``ClientSession`` did, for a quarter of its CPU per
call; ``relay.client_error`` remains the one place its errors become ``UpstreamError``s.

It is the default ``transport.Transport``. Errors are the transport's: ``ClientError``
(``ConnectError``, ``ServerDisconnected``, ``ResponseError`` for malformed framing,
``PayloadError`` for a cut body, ``RequestBodyError``) and ``TimeoutError`` (``ConnectTimeout``,
``PoolTimeout``, ``ReadTimeout``, ``WriteTimeout`` for a streamed body the server stopped reading).

At most ``max_connections`` connections are open to one origin (in use or idle); a call that
finds them all in use waits in line, first come first served: a connection that goes idle, or the
place of one that closes, is handed to the first waiter, within ``connect_timeout``.

A connection is reused only when its answer ended where its framing said and nothing followed:
bytes after that end (in the same read, or later while it sits in the pool), a body on an answer
to HEAD or on a 204/304, or an answer whose head came while bytes of the request were still on
this side (in the transport's buffer, or on Linux unacknowledged in the kernel's: the server
answered before reading all of it, and what it makes of the rest is unknown) each close it, so
none of them can become the next request's answer. What HTTP/1.1 cannot tell stays: a body the
server's kernel received and the server never read, or a stray answer sent after the next request
went out. (Empty lines after an answer's end are skipped by llhttp and leave nothing behind.)

A request written to a reused idle connection that the server closes before any byte of an answer
is sent once more on a fresh connection when its method is idempotent (as aiohttp did; a POST the
server may have read is never sent twice: the client gets a 502 and its own retry policy decides),
and never a streamed body already begun; the same close on a fresh connection is an error.
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import sys
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Final

from aiohappyeyeballs import start_connection
from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from .transport import (
    MAX_CONNECTIONS, Body, ClientError, ConnectError, ConnectTimeout, PayloadError, PoolTimeout, ReadTimeout, RequestBodyError,
    ResponseError, ServerDisconnected, UpstreamSocket, WriteTimeout,
)
from .websocket import Sockets

__all__ = ["Client", "Response", "READ_BUFFER", "MAX_HEAD", "IDLE_TIMEOUT", "IDEMPOTENT"]

Origin = tuple[str, str, int]

#: Buffered answer bytes past which the connection stops reading until the consumer catches up.
READ_BUFFER: Final = 256 * 1024
#: Bytes an answer's head may take (status lines and headers, interim answers included) before it
#: is refused: aiohttp refused lines over 8 KiB; without a bound llhttp buffers an endless head.
MAX_HEAD: Final = 64 * 1024
#: An idle keep-alive connection is closed after this long: shorter than common servers' own
#: keep-alive (60 s and more), so the server rarely closes one under a request.
IDLE_TIMEOUT: Final = 30.0
#: Methods aiohttp sends ``Content-Length: 0`` for when there is no body; the others send none.
_NO_LENGTH: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_DEFAULT_PORT: Final = {"http": 80, "https": 443}
#: Seconds before the next address of a host is tried beside the first (RFC 8305's "Happy
#: Eyeballs", asyncio's own): a host whose IPv6 route is black-holed still connects over IPv4.
HAPPY_EYEBALLS_DELAY: Final = 0.25
#: Methods sent once more after a reused connection closed before answering (RFC 9110 §9.2.2).
IDEMPOTENT: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


if sys.platform == "linux":
    import fcntl
    import termios

    _NONE_QUEUED: Final = bytes(4)

    def _queued(fd: int) -> bool:
        """Whether the socket's send queue holds bytes its peer has not acknowledged (``TIOCOUTQ``)."""
        try:
            return fcntl.ioctl(fd, termios.TIOCOUTQ, _NONE_QUEUED) != _NONE_QUEUED
        except OSError:
            return False
else:
    def _queued(fd: int) -> bool:
        """Elsewhere the kernel's queue is not asked: only the transport's own buffer is."""
        return False


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; hands what it reads to the answer in flight, if any."""

    __slots__ = ("client", "origin", "transport", "fd", "answer", "idle_since", "lost", "_write_paused", "_drain")

    def __init__(self, client: Client, origin: Origin) -> None:
        self.client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.fd = -1
        self.answer: Response | None = None
        self.idle_since = 0.0
        self.lost = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else -1

    def data_received(self, data: bytes) -> None:
        if self.answer is None:  # bytes nobody asked for: this connection is not clean any more
            self.close()
            return
        self.answer._feed(data)

    def eof_received(self) -> bool:
        return False  # half-closed is closed: the transport closes, connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.client._forget(self)
        if self.answer is not None:
            self.answer._lost()
        self._wake_writer()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    def _wake_writer(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def unsent(self) -> bool:
        """Whether bytes of the request are still on this side: in the transport's buffer, or in
        the kernel's send queue unacknowledged (the server's kernel had not received them when it
        sent what we read: its own read of the request had not reached them)."""
        transport = self.transport
        if transport is None:
            return False
        return bool(transport.get_write_buffer_size()) or (self.fd >= 0 and _queued(self.fd))

    @property
    def answered(self) -> bool:
        """The answer's head arrived (early, maybe: before the request body was all sent)."""
        return self.answer is not None and self.answer._head.done()

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark, at most
        ``read_timeout`` at a time: a server that reads nothing is as silent as one that says
        nothing, unless it answered already (an early answer ends the wait)."""
        while self._write_paused and not self.lost and not self.answered:
            self._drain = self.client.loop.create_future()
            try:
                async with asyncio.timeout(self.client.read_timeout):
                    await self._drain
            except TimeoutError:
                raise WriteTimeout(f"the upstream read none of the request for {self.client.read_timeout:g} s") from None
            finally:
                self._drain = None
        if self.lost:
            raise ServerDisconnected("the server closed the connection while the request was sent")

    def close(self) -> None:
        self.lost = True
        self.client._forget(self)
        if self.transport is not None:
            self.transport.close()


class Response:
    """One answer: ``status``, ``reason``, ``headers`` (as sent: names keep their case, repeated
    fields stay), ``content_length``, ``content_type``, and its body through ``iter_any()`` /
    ``read()``. ``release()`` (idempotent) gives the connection back only after a whole body."""

    __slots__ = ("status", "reason", "headers", "content_length", "content_type", "_conn", "_loop", "_parser",
                 "_head_only", "_raw", "_reason", "_head", "_head_ready", "_interim", "_switching", "_buffer", "_size",
                 "_waiter", "_done", "_error", "_keep_alive", "_until_eof", "_paused", "_any_byte", "_released", "_body",
                 "_read_timeout", "_timer", "_last", "_head_bytes", "_has_body")

    def __init__(self, conn: _Connection, method: str, read_timeout: float, has_body: bool = False) -> None:
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDictProxy[str] = _EMPTY
        self.content_length: int | None = None
        self.content_type = "application/octet-stream"
        self._conn = conn
        self._loop = conn.client.loop
        self._parser = HttpResponseParser(self)
        self._head_only = method == "HEAD"
        self._raw: list[tuple[str, str]] = []
        self._reason = b""
        self._head: asyncio.Future[None] = self._loop.create_future()
        self._head_ready = False
        self._interim = False
        self._switching = False
        self._buffer: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: BaseException | None = None
        self._keep_alive = False
        self._until_eof = False
        self._paused = False
        self._any_byte = False
        self._released = False
        self._body: bytes | None = None
        self._read_timeout = read_timeout
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0
        self._head_bytes = 0
        self._has_body = has_body

    @property
    def content(self) -> Response:
        """The body stream (aiohttp's name for it): ``answer.content.iter_any()``."""
        return self

    # llhttp's callbacks (the parser calls them from ``feed_data``)

    def on_message_begin(self) -> None:
        if self._done:  # a second answer on the same connection, unasked for: parse none of it
            raise _Trailing

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            # 100 Continue, 103 Early Hints: skipped, the real answer follows. 101 (an upgrade
            # nobody asked for) makes llhttp stop with an error, after a "complete" message that
            # must not end the answer: a malformed answer (a 502), never a silent wait.
            self._interim = status != 101
            self._switching = status == 101
            return
        headers = CIMultiDict(self._raw)
        self.status, self.reason = status, self._reason.decode("utf-8", "surrogateescape")
        self.headers = CIMultiDictProxy(headers)
        length = headers.get("Content-Length")
        self.content_length = int(length) if length is not None else None  # llhttp checked it is digits
        kind = headers.get("Content-Type")
        if kind:
            self.content_type = kind.partition(";")[0].strip().lower()
        self._keep_alive = self._parser.should_keep_alive()
        if self._head_only:
            self._done = True  # llhttp does not know the request was HEAD: its framing is ignored
            self._keep_alive = _keeps_alive(self._parser.get_http_version(), headers)
        elif length is None and status not in (204, 304):
            encoding = headers.get("Transfer-Encoding", "")
            self._until_eof = not encoding.rstrip().lower().endswith("chunked")
        self._head_ready = True

    def on_body(self, data: bytes) -> None:
        if self._done:  # a body on an answer to HEAD: the connection is not clean
            self._keep_alive = False
            return
        self._buffer.append(data)
        self._size += len(data)
        if self._size > READ_BUFFER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._switching:
            return
        if self._interim:
            self._interim = False
            self._raw, self._reason = [], b""
            return
        self._done = True

    # the connection's side

    def _feed(self, data: bytes) -> None:
        if self._released:  # nothing more to read into
            return
        self._any_byte = True
        self._last = self._loop.time()
        if self._done:  # bytes after the answer's end: the connection is not clean
            self._keep_alive = False
            return
        try:
            self._parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade) as exc:
            if not self._done:
                if self._head.done():
                    self._fail(PayloadError(f"malformed response body: {exc}"))
                else:
                    self._fail(ResponseError(f"malformed response: {exc}"))
                return
            self._keep_alive = False  # the answer was whole; what followed it in the same read is none
        if not self._head_ready:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                self._fail(ResponseError(f"the response head is over {MAX_HEAD} bytes"))
                return
        if self._head_ready and not self._head.done():
            # the bound is on the head's bytes: when every byte fed so far (this read's included) is
            # within it, so is the head, and its fields are not summed. (The sum counts 4 bytes a
            # field, so a head of compact ``a:b`` fields within 64 KiB, refused by it before
            # 5cb2b2e, is accepted now: test_transport_answers.)
            if not 100 <= self.status <= 599 or (self._head_bytes + len(data) > MAX_HEAD
                                                 and self._head_size() > MAX_HEAD):
                self._fail(ResponseError(f"a response status {self.status}, or a head over {MAX_HEAD} bytes"))
                return
            if self._has_body and self._conn.unsent():
                # answered before the request was all out (an early 413, a 401 from the head): the
                # server did not read the rest, and what it makes of it on this connection is unknown
                self._keep_alive = False
            self._head.set_result(None)
            self._conn._wake_writer()  # a request body still being written stops: it was answered
        if self._done:
            self._stop_timer()
        if self._waiter is not None and (self._buffer or self._done) and not self._waiter.done():
            self._waiter.set_result(None)

    def _head_size(self) -> int:
        """The answer's head as received, near enough: its reason and every field."""
        return len(self._reason) + sum(len(name) + len(value) + 4 for name, value in self._raw)

    def _lost(self) -> None:
        if self._done or self._error is not None:
            return
        if self._until_eof and self._head_ready:  # a body delimited by the close: this is its end
            self._done = True
            self._stop_timer()
            if not self._head.done():
                self._head.set_result(None)
            self._wake()
            return
        if self._head_ready:
            self._fail(PayloadError("the server closed the connection before the body's end"))
        else:
            self._fail(ServerDisconnected("the server closed the connection before answering"))

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._keep_alive = False
        self._stop_timer()
        if not self._head.done():
            self._head.set_exception(error)
        self._wake()
        self._conn.close()

    def _abandon(self) -> None:
        """The request failed or was cancelled before its answer was handed out: nobody will
        wait for this answer any more."""
        if self._error is None:
            self._error = ClientError("the request was abandoned")
        self._stop_timer()
        self._head.cancel()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _arm(self) -> None:
        """Start the read timeout: the request is out, the server's silence counts from now."""
        self._last = self._loop.time()
        if not self._done and self._error is None:
            self._timer = self._loop.call_later(self._read_timeout, self._check_silence)

    def _check_silence(self) -> None:
        # One timer per answer, pushed back lazily: a chunk costs a clock read, not a reschedule.
        self._timer = None
        if self._done or self._error is not None:
            return
        now = self._loop.time()
        if self._paused:  # the consumer lags, not the server
            self._last = now
        left = self._last + self._read_timeout - now
        if left > 0:
            self._timer = self._loop.call_later(left, self._check_silence)
        else:
            self._fail(ReadTimeout(f"no data from upstream for {self._read_timeout:g} s"))

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # the consumer's side

    async def readany(self) -> bytes:
        """What has arrived of the body (waiting for some); ``b""`` at its end."""
        while not self._buffer:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        buffer = self._buffer
        data = buffer[0] if len(buffer) == 1 else b"".join(buffer)
        self._buffer, self._size = [], 0
        if self._paused:
            self._paused = False
            self._last = self._loop.time()
            if self._conn.transport is not None and not self._conn.lost:
                self._conn.transport.resume_reading()
        return data

    def iter_any(self) -> AsyncIterator[bytes]:
        """The body in chunks as they arrive; at its end the connection goes back to the pool."""
        return _Chunks(self)

    async def read(self) -> bytes:
        """The whole body; the connection then goes back to the pool."""
        if self._body is None:
            chunks = []
            while chunk := await self.readany():
                chunks.append(chunk)
            self._body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            self.release()
        return self._body

    def release(self) -> None:
        """Done with this answer: its connection is reused if the body was read to its end and
        the server keeps it alive, and closed otherwise. Idempotent."""
        if self._released:
            return
        self._released = True
        self._stop_timer()
        conn = self._conn
        if self._done and self._keep_alive and not self._buffer and self._error is None and not conn.lost:
            conn.client._recycle(conn)
        else:
            conn.close()
        # The parser holds this answer's callbacks (bound methods): a cycle that only the cyclic
        # GC would free, with the head, headers and futures hanging off it, on every call.
        # Nothing is fed to an answer once released.
        del self._parser

    close = release  # aiohttp's name; a body not read whole closes the connection either way

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.release()


class _Trailing(Exception):
    """Raised from llhttp's callback when a second answer begins after this one's end."""


class _Chunks:
    """``iter_any()``: an iterator object, not an async generator, so one left unfinished (the
    client went away) needs no finalizer task."""

    __slots__ = ("_answer",)

    def __init__(self, answer: Response) -> None:
        self._answer = answer

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._answer.readany()
        if not chunk:
            self._answer.release()
            raise StopAsyncIteration
        return chunk


_EMPTY: Final[CIMultiDictProxy[str]] = CIMultiDictProxy(CIMultiDict())


def _keeps_alive(version: str, headers: CIMultiDict[str]) -> bool:
    tokens = {t.strip().lower() for value in headers.getall("Connection", ()) for t in value.split(",")}
    return "close" not in tokens if version == "1.1" else "keep-alive" in tokens


class Client:
    """HTTP/1.1 to any origin, with explicit timeouts: ``connect_timeout`` for the connection (and
    its TLS handshake), ``read_timeout`` for the longest silence while an answer is awaited.
    At most ``max_connections`` to one origin; idle ones are reused last-in first-out and closed
    after ``idle_timeout``. ``ssl_context`` defaults to the system's trust (tests pass their own).
    WebSockets go on its ``websocket.Sockets``, with the same connect timeout and TLS context."""

    def __init__(self, connect_timeout: float, read_timeout: float, *, idle_timeout: float = IDLE_TIMEOUT,
                 ssl_context: ssl.SSLContext | None = None, max_connections: int = MAX_CONNECTIONS) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self._open: dict[Origin, int] = {}
        self._waiters: dict[Origin, deque[asyncio.Future[_Connection | None]]] = {}
        self.loop = asyncio.get_running_loop()
        self._ssl = ssl_context
        self._idle: dict[Origin, list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._hosts: dict[Origin, str] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._poller = select.poll() if hasattr(select, "poll") else None
        self._sockets = Sockets(connect_timeout, ssl_context)
        self.closed = False

    async def request(self, method: str, url: URL, *, data: Body = None,
                      headers: CIMultiDict[str] | None = None) -> Response:
        """``send`` by aiohttp's names."""
        return await self.send(method, url, headers=headers, body=data)

    async def send(self, method: str, url: URL, *, headers: CIMultiDict[str] | None = None,
                   body: Body = None) -> Response:
        """``Transport.send``: one request, and its answer once its head has arrived (redirects
        are answers like any other). The caller must ``release()`` it (``read()`` and a finished
        ``iter_any()`` do)."""
        data = body
        if self.closed:
            raise RuntimeError("the client is closed")
        origin = (url.scheme, url.raw_host or "", url.port or _DEFAULT_PORT.get(url.scheme, 80))
        streamed = data is not None and not isinstance(data, (bytes, bytearray))
        head, length = self._head(method, url, origin, headers, data, streamed)
        for attempt in (1, 2):
            conn = None if self._waiters.get(origin) else self._take(origin)
            if conn is None:
                conn = await self._acquire(origin)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(origin)
            answer = Response(conn, method, self.read_timeout, data is not None)
            conn.answer = answer
            began = [False]
            try:
                if streamed:
                    await self._send_stream(conn, answer, head, data, length, began)  # type: ignore[arg-type]
                else:
                    conn.transport.write(head + data if data else head)  # type: ignore[union-attr, operator]
                answer._arm()
                await answer._head
            except ServerDisconnected:
                answer._abandon()
                conn.close()
                if reused and attempt == 1 and not answer._any_byte and not began[0] and method in IDEMPOTENT:
                    continue  # the server closed it while idle: once more on a fresh connection
                raise
            except BaseException:
                answer._abandon()
                conn.close()  # cancelled or failed: this connection's state is unknown
                raise
            return answer
        raise AssertionError("unreachable")

    def _head(self, method: str, url: URL, origin: Origin, headers: CIMultiDict[str] | None, data: Body,
              streamed: bool) -> tuple[bytes, int | None]:
        """The request line and headers as aiohttp sent them: Host first (host, and the port when
        it is not the scheme's), the caller's headers, ``Accept: */*`` unless given, the framing."""
        host = self._hosts.get(origin)
        if host is None:
            host = self._hosts[origin] = url.host_port_subcomponent or ""
        lines = [f"{method} {url.raw_path_qs} HTTP/1.1\r\n"]
        length: int | None = None
        if headers:
            host = headers.get("Host", host)
            lines.append(f"Host: {host}\r\n")
            for name, value in headers.items():
                if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                    raise ValueError(f"a line break in the request header {name!r}")
                low = name.lower()
                if low == "host" or (low in ("content-length", "transfer-encoding") and not streamed):
                    continue
                if low == "content-length":
                    length = int(value)
                lines.append(f"{name}: {value}\r\n")
            if "Accept" not in headers:
                lines.append("Accept: */*\r\n")
        else:
            lines.append(f"Host: {host}\r\nAccept: */*\r\n")
        if streamed:
            if length is None:
                lines.append("Transfer-Encoding: chunked\r\n")
        elif data is not None:
            lines.append(f"Content-Length: {len(data)}\r\n")  # type: ignore[arg-type]
        elif method not in _NO_LENGTH:
            lines.append("Content-Length: 0\r\n")
        lines.append("\r\n")
        # a header value aiohttp read as bytes that are not UTF-8 (RFC 9110 obs-text) goes as it came
        return "".join(lines).encode("utf-8", "surrogateescape"), length

    async def _send_stream(self, conn: _Connection, answer: Response, head: bytes, body: AsyncIterable[bytes],
                           length: int | None, began: list[bool]) -> None:
        """Write ``head`` and ``body`` (as is with a declared length, else chunked), pausing while
        the transport's buffer is full. An answer that arrives early ends the writing quietly."""
        transport = conn.transport
        assert transport is not None
        transport.write(head)
        sent = 0
        try:
            async for chunk in body:
                began[0] = True
                if answer._error is not None:
                    raise answer._error
                if not chunk:
                    continue
                sent += len(chunk)
                if length is not None:
                    if sent > length:
                        raise RequestBodyError(f"the request body is longer than its Content-Length {length}")
                    transport.write(chunk)
                else:
                    transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
                await conn.drain()
                if conn.answered:  # answered early (a 413 from the head alone): that is the answer
                    answer._keep_alive = False
                    return
        except ClientError:
            if answer._head.done() and answer._error is None:
                answer._keep_alive = False  # answered before the body was all sent: keep the answer
                return
            raise
        except WriteTimeout:
            raise
        except Exception as exc:
            raise RequestBodyError(f"the request body failed: {type(exc).__name__}") from exc
        if length is not None and sent != length:
            raise RequestBodyError(f"the request body has {sent} bytes, its Content-Length says {length}")
        if length is None:
            transport.write(b"0\r\n\r\n")

    async def _acquire(self, origin: Origin) -> _Connection | None:
        """An idle connection to ``origin``, or None with a place reserved for a new one (which
        ``_connect`` then fills). While all ``max_connections`` are in use, or others already wait,
        wait in line: a connection that goes idle, or the place of one that closes, is handed to
        the first waiter (``_give``), so nobody who comes later takes it first; within
        ``connect_timeout``, else ``PoolTimeout``."""
        while True:
            if not self._waiters.get(origin):
                conn = self._take(origin)
                if conn is not None:
                    return conn
                opened = self._open.get(origin, 0)
                if opened < self.max_connections:
                    self._open[origin] = opened + 1
                    return None
            waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
            queue = self._waiters.setdefault(origin, deque())
            queue.append(waiter)
            try:
                async with asyncio.timeout(self.connect_timeout):
                    handed = await waiter
            except BaseException as exc:
                if waiter in queue:
                    queue.remove(waiter)
                elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._pass_on(origin, waiter.result())  # handed over just as it gave up
                if isinstance(exc, TimeoutError):
                    raise PoolTimeout(f"all {self.max_connections} connections to {origin[1]}:{origin[2]} "
                                      f"stayed busy for {self.connect_timeout:g} s") from None
                raise
            if handed is None or not (handed.lost or handed.transport is None or handed.transport.is_closing()):
                return handed
            handed.close()  # it closed on the way: its place went on to the next in line; wait again

    def _give(self, origin: Origin, handed: _Connection | None) -> bool:
        """Hand an idle connection (or, None, the place of one that closed) to the first call
        waiting for one; False when nobody waits."""
        queue = self._waiters.get(origin)
        while queue:
            waiter = queue.popleft()
            if not waiter.done():
                waiter.set_result(handed)
                return True
        return False

    def _pass_on(self, origin: Origin, handed: _Connection | None) -> None:
        """What a waiter was handed as it gave up goes to the next in line, or back."""
        if handed is None:
            self._release_place(origin)
        else:
            self._recycle(handed)

    async def _connect(self, origin: Origin) -> _Connection:
        """A new connection, in the place ``_acquire`` reserved for it."""
        scheme, host, port = origin
        conn = _Connection(self, origin)
        tls = scheme == "https"
        if tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout):
                # resolved here and raced by aiohappyeyeballs (aiohttp's own), on any loop: uvloop's
                # create_connection has no happy_eyeballs_delay
                infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                sock = await start_connection(infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY, loop=self.loop)
                try:
                    await self.loop.create_connection(lambda: conn, sock=sock, ssl=self._ssl if tls else None,
                                                      server_hostname=host if tls else None)
                except BaseException:
                    sock.close()
                    raise
        except BaseException as exc:
            self._release_place(origin)
            if isinstance(exc, TimeoutError):
                raise ConnectTimeout(f"no connection to {host}:{port} within {self.connect_timeout:g} s") from None
            if isinstance(exc, OSError):
                raise ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
            raise
        self._all.add(conn)
        if self.closed:
            conn.close()
            raise RuntimeError("the client is closed")
        return conn

    def _release_place(self, origin: Origin) -> None:
        """A connection's place is free: the first waiter takes it over, else it is given up."""
        if self._give(origin, None):
            return
        opened = self._open.get(origin, 0) - 1
        if opened > 0:
            self._open[origin] = opened
        else:
            self._open.pop(origin, None)

    # the pool

    def _take(self, origin: Origin) -> _Connection | None:
        stack = self._idle.get(origin)
        if not stack:
            return None
        now = self.loop.time()
        while stack:
            conn = stack.pop()
            if conn.lost or conn.transport is None or conn.transport.is_closing():
                conn.close()
                continue
            if now - conn.idle_since >= self.idle_timeout or self._unread(conn):
                conn.close()
                continue
            return conn
        return None

    def _unread(self, conn: _Connection) -> bool:
        """Bytes (or the close) arrived on an idle connection while the loop was busy and nobody
        read them yet: sent now, the request would take those stray bytes for its answer."""
        if self._poller is None or conn.fd < 0:
            return False
        self._poller.register(conn.fd, select.POLLIN)
        try:
            return bool(self._poller.poll(0))
        finally:
            self._poller.unregister(conn.fd)

    def _recycle(self, conn: _Connection) -> None:
        conn.answer = None
        if self.closed:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        if self._give(conn.origin, conn):
            return  # straight to the first call waiting for one
        self._idle.setdefault(conn.origin, []).append(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self.idle_timeout, self._sweep)

    def _forget(self, conn: _Connection) -> None:
        if conn in self._all:
            self._all.discard(conn)
            self._release_place(conn.origin)
        stack = self._idle.get(conn.origin)
        if stack and conn in stack:
            stack.remove(conn)

    def _sweep(self) -> None:
        """Close the connections idle for ``idle_timeout`` (the oldest lie at each stack's bottom)."""
        self._sweeper = None
        now = self.loop.time()
        earliest: float | None = None
        for stack in self._idle.values():
            while stack and now - stack[0].idle_since >= self.idle_timeout:
                stack.pop(0).close()
            if stack and (earliest is None or stack[0].idle_since < earliest):
                earliest = stack[0].idle_since
        if earliest is not None:
            self._sweeper = self.loop.call_later(max(earliest + self.idle_timeout - now, 0.01), self._sweep)

    def idle_connections(self, url: URL | None = None) -> int:
        """How many idle connections the pool holds (to ``url``'s origin, or in all)."""
        if url is None:
            return sum(len(stack) for stack in self._idle.values())
        origin = (url.scheme, url.raw_host or "", url.port or _DEFAULT_PORT.get(url.scheme, 80))
        return len(self._idle.get(origin, ()))

    def open_connections(self, url: URL) -> int:
        """How many connections to ``url``'s origin are open or being opened (in use or idle)."""
        return self._open.get((url.scheme, url.raw_host or "", url.port or _DEFAULT_PORT.get(url.scheme, 80)), 0)

    def websocket(self, url: URL, headers: CIMultiDict[str], protocols: Sequence[str], *, handshake_timeout: float,
                  max_message: int, heartbeat: float | None = None) -> AbstractAsyncContextManager[UpstreamSocket]:
        """``Transport.websocket``: a socket on the client's ``Sockets``."""
        return self._sockets.connect(url, headers, protocols, handshake_timeout=handshake_timeout,
                                     max_message=max_message, heartbeat=heartbeat)

    async def aclose(self) -> None:
        """``Transport.aclose``: ``close``."""
        await self.close()

    async def close(self) -> None:
        """Close every connection, idle or in use; requests in flight fail."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
        for queue in self._waiters.values():
            for waiter in queue:
                if not waiter.done():
                    waiter.set_exception(RuntimeError("the client is closed"))
        self._waiters.clear()
        await self._sockets.aclose()
        await asyncio.sleep(0)  # let the transports run their connection_lost
