"""The relay: one call upstream per request, its answer streamed back chunk by chunk (proxy layer).

Everything that can fail before the first response byte (connect, timeout, refused) raises an
``UpstreamError`` for the middleware to render in the client's wire format. Once the response has
started nothing is raised into it: a broken upstream stream closes the client connection (the
client sees a cut stream, never a completed one), and an ``Observer`` (recording) that fails is
logged and ignored. Redirects are never followed: a 3xx goes back to the client as it came, so a
configured key never travels to a host the upstream names.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from typing import NamedTuple, NoReturn, Protocol, TypeVar

from aiohttp import web
from multidict import CIMultiDict, MultiMapping
from yarl import URL

from ...policy.errors import Code, NotFound, UpstreamError
from ..observe.logger import get_logger
from ..inbound.answers import Whole
from ..inbound.context import Timing
from ..upstream.transport import Answer, ClientError, PoolTimeout, Transport

#: RFC 9110 §7.6.1 hop-by-hop fields, plus the ones aiohttp recomputes for each leg.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
    # the proxy answered the client's Expect itself; sent on, it would hold the body back until an
    # upstream that waits for the body says 100 Continue (aiohttp's client waits with no deadline)
    "expect",
})
OVERHEAD_HEADER = "x-projectionist-overhead-ms"
#: A response body declared this small (and not an event stream) is read whole before it goes out,
#: so its status line, headers and body leave in one write (one send instead of two).
WHOLE_BODY_MAX = 64 * 1024
REQUEST_ID_HEADER = "x-projectionist-request-id"
#: Statuses a ``Screen`` looks at (an upstream refusing the request's content; 404 and 500 too,
#: which some answer a model that takes no images with), and how much of such an answer it reads
#: before the client gets anything.
SCREENED = frozenset({400, 404, 413, 415, 422, 500})
SCREEN_MAX = 256 * 1024
#: Seconds a client may leave one chunk unread (``[server] write_timeout``).
WRITE_TIMEOUT = 60.0

Body = bytes | AsyncIterable[bytes] | None
Response = Answer
_A = TypeVar("_A")
_R = TypeVar("_R", bound=web.StreamResponse)


def _connection_tokens(headers: MultiMapping[str]) -> set[str]:
    tokens: set[str] = set()
    for value in headers.getall("Connection", ()):
        tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


@functools.lru_cache(maxsize=64)
def _hop_by_hop_and(drop: frozenset[str]) -> frozenset[str]:
    return HOP_BY_HOP | drop


def _skipped(incoming: MultiMapping[str], drop: frozenset[str]) -> frozenset[str]:
    skip = _hop_by_hop_and(drop) if drop else HOP_BY_HOP
    return skip | _connection_tokens(incoming) if "Connection" in incoming else skip


def forward_headers(
    incoming: MultiMapping[str],
    *,
    drop: frozenset[str] = frozenset(),
    replace: dict[str, str] | None = None,
) -> CIMultiDict[str]:
    """Copy end-to-end headers: hop-by-hop ones (and those named in ``Connection``) are dropped,
    as is everything in ``drop`` (lowercase names); ``replace`` is added after the drop."""
    skip = _skipped(incoming, drop)
    out: CIMultiDict[str] = CIMultiDict([(k, v) for k, v in incoming.items() if k.lower() not in skip])
    if replace:
        for key, value in replace.items():
            out[key] = value
    return out


class Observer(Protocol):
    """Watches a relayed response (recording). It can slow the stream down, never change it:
    whatever it raises is logged and ignored."""

    def begin(self, content_type: str) -> None:
        """The response started (its content type)."""

    def chunk(self, data: bytes) -> None:
        """One chunk as it was relayed."""

    def body_complete(self, status: int) -> None:
        """The whole body arrived from upstream; the client still lacks its last chunk."""

    def whole(self, content_type: str, data: bytes, status: int) -> None:
        """A body read whole before any of it went out: ``begin``, its one ``chunk`` and
        ``body_complete`` at once."""


class Verdict(enum.Enum):
    """What becomes of an answer to a call a ``Screen`` sent: it goes to the client (``KEEP``), or
    the first refusal does, as it came (``FIRST``)."""

    KEEP = "keep"
    FIRST = "first"


class Screen(Protocol):
    """Looks at a refusal (a ``SCREENED`` status, whole body) before any byte reaches the client,
    and may answer with a new body to send instead. Each answer to a body it sent is its to judge
    (``answered``, by its status, before any of it is read): the client gets it, or the first
    refusal, or it is dropped and the screen's next body goes. ``observer`` watches the call in
    flight: a screen that re-sends has dealt with the refused call's own and set the next one's."""

    @property
    def observer(self) -> Observer | None: ...

    async def __call__(self, status: int, content_type: str, body: bytes, encoding: str = "") -> bytes | None:
        """``body`` as it came (``encoding``: its Content-Encoding)."""

    async def answered(self, status: int) -> Verdict | bytes:
        """The verdict on the answer to the body it sent last, or the next body to send."""


async def relay(
    request: web.Request,
    session: Transport,
    url: URL,
    body: Body,
    headers: CIMultiDict[str],
    timing: Timing,
    *,
    request_id: str = "",
    observer: Observer | None = None,
    screen: Screen | None = None,
    write_timeout: float = WRITE_TIMEOUT,
    on_404: Callable[[], str | None] | None = None,
) -> web.StreamResponse:
    """Send one request upstream and stream its response back unchanged (minus hop-by-hop).

    The response carries ``x-projectionist-overhead-ms``: the proxy's own time so far, i.e. its
    time until the response starts minus the upstream's time to its headers. With a ``screen``,
    a refusal is read whole first, and if the screen says so the call is sent again, with the
    body it gives: the screen judges each such answer (``Screen.answered``) and bounds how often
    it sends; the one it keeps goes back, or the first refusal as it came. A 404 that ``on_404``
    explains (a base URL one /v1 off) is the proxy's own ``BASE_URL_MISMATCH`` saying so."""
    started = time.perf_counter()
    try:  # ``upstream_errors`` written out: every call takes this step, and a context manager costs a call
        answer = await session.send(request.method, url, headers=headers, body=body)
    except Exception as exc:
        translated = client_error(exc)
        if translated is None:
            raise
        raise translated from None
    if answer.status == 404 and on_404 is not None and (mistake := on_404()) is not None:
        await _base_url_mismatch(answer, mistake, timing)
    preread: bytes | None = None
    try:
        timing.headers_s = time.perf_counter() - started
        timing.status = answer.status
        if screen is not None and request.method != "HEAD" and answer.status in SCREENED:
            screened = await _screen(screen, session, request.method, url, headers, timing,
                                     _Going(answer, started, observer, None), request_id)
            if isinstance(screened, web.StreamResponse):
                return screened
            answer, started, observer, preread = screened
        if request.method != "HEAD" and preread is None and _small(answer):
            return await _whole(answer, observer, request_id, timing)
        response = _response_head(web.StreamResponse(status=answer.status, reason=answer.reason), answer,
                                  request_id, timing)
        try:
            await response.prepare(request)
        except ConnectionError:
            return response  # the client left before the response started: nothing to send it
        await _stream(request, response, answer, observer, request_id, preread or b"", write_timeout)
        return response
    finally:
        timing.upstream_s = time.perf_counter() - started
        answer.release()


async def _base_url_mismatch(answer: Response, mistake: str, timing: Timing) -> NoReturn:
    """The proxy's own 404 for a base URL one /v1 off (``mistake`` says how), with the start of
    what the upstream said; the upstream's answer is released."""
    timing.status = 404
    try:
        said, _ = await _read_some(answer, 1024)
    except UpstreamError:
        said = b""
    finally:
        answer.release()
    words = said.decode("utf-8", "replace")[:300].replace("\n", " ").strip()
    raise NotFound(f"{mistake}; the upstream said: {words}" if words else mistake, code=Code.BASE_URL_MISMATCH)


class _Going(NamedTuple):
    """The answer a relay goes on with, when its call started, who watches it, and what was read
    of its body already (None: nothing)."""

    answer: Response
    started: float
    observer: Observer | None
    preread: bytes | None


async def _screen(screen: Screen, session: Transport, method: str, url: URL, headers: CIMultiDict[str],
                  timing: Timing, going: _Going, request_id: str) -> web.StreamResponse | _Going:
    """A screened status: its body read (up to ``SCREEN_MAX``) and shown to ``screen``. The
    response to send when that settles it (a whole refusal the screen leaves as it is, or the first
    refusal after the re-sends); else what the relay goes on with: the answer the screen kept, or a
    refusal too big to read whole, with what was read of it."""
    answer = going.answer
    preread, whole = await _read_some(answer, SCREEN_MAX)
    again = await screen(answer.status, answer.headers.get("Content-Type", ""), preread,
                         answer.headers.get("Content-Encoding", "")) if whole else None
    if again is not None:
        answer.release()
        kept = await _screened(screen, session, method, url, again, headers, timing)
        if kept is None:  # the first refusal, as it came (its record was written)
            timing.status = answer.status
            return await _complete_whole(answer, preread, None, request_id, timing)
        return _Going(kept[0], kept[1], screen.observer, None)
    if whole:
        return await _complete_whole(answer, preread, going.observer, request_id, timing)
    return going._replace(preread=preread)


async def _screened(screen: Screen, session: Transport, method: str, url: URL, body: bytes,
                    headers: CIMultiDict[str], timing: Timing) -> tuple[Response, float] | None:
    """Send the bodies ``screen`` gives, one after another, until it keeps an answer (returned, with
    when its call started) or wants the first refusal back (None)."""
    while True:
        started = time.perf_counter()
        with upstream_errors():
            answer = await session.send(method, url, headers=headers, body=body)
        timing.headers_s = time.perf_counter() - started
        timing.status = answer.status
        try:
            verdict = await screen.answered(answer.status)
        except BaseException:
            answer.release()
            raise
        if verdict is Verdict.KEEP:
            return answer, started
        answer.release()
        if verdict is Verdict.FIRST:
            return None
        body = verdict


def client_error(exc: BaseException) -> UpstreamError | None:
    """The one translation of a transport's errors (connect, timeout, refused, bad URL, broken
    answer; every transport raises only ``transport``'s) into the proxy's; None for anything that
    is not one."""
    if isinstance(exc, PoolTimeout):  # the upstream never saw the call: this proxy's capacity, retry later
        return UpstreamError(f"no connection to the upstream was free: {exc}", code=Code.UPSTREAM_BUSY,
                             status=503, retryable=True)
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamError("upstream timed out before responding", code=Code.UPSTREAM_TIMEOUT)
    if isinstance(exc, ClientError):
        return UpstreamError(f"upstream unreachable: {type(exc).__name__}")
    return None


@contextlib.contextmanager
def upstream_errors() -> Iterator[None]:
    """A transport's error inside becomes the proxy's (``client_error``); anything else passes."""
    try:
        yield
    except Exception as exc:
        translated = client_error(exc)
        if translated is None:
            raise
        raise translated from None


def _small(answer: Response) -> bool:
    length = answer.content_length
    return length is not None and length <= WHOLE_BODY_MAX and answer.content_type != "text/event-stream"


async def _read_some(answer: Response, limit: int) -> tuple[bytes, bool]:
    """Up to about ``limit`` bytes of the body, and whether that is all of it. Nothing has been
    sent yet: a body that breaks off is an ``UpstreamError`` in the client's own shape."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in answer.iter_any():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return b"".join(chunks), False
    except (ClientError, asyncio.TimeoutError) as exc:
        raise (client_error(exc) or UpstreamError("upstream response broke off")) from None
    return b"".join(chunks), True


async def _whole(answer: Response, observer: Observer | None, request_id: str,
                 timing: Timing) -> web.StreamResponse:
    """A small sized body, read before the response starts: a body that breaks off on the way is
    still an ``UpstreamError`` the client gets in its own shape, as nothing has been sent yet."""
    try:
        data = await answer.read()
    except (ClientError, asyncio.TimeoutError) as exc:
        raise (client_error(exc) or UpstreamError("upstream response broke off")) from None
    return await _complete_whole(answer, data, observer, request_id, timing)


async def _complete_whole(answer: Response, data: bytes, observer: Observer | None, request_id: str,
                          timing: Timing) -> web.StreamResponse:
    response = _response_head(Whole(answer.status, answer.reason, data), answer, request_id, timing)
    if observer is not None:
        _whole_told(observer, answer.headers.get("Content-Type", ""), data, answer.status, request_id)
    return response


def _whole_told(observer: Observer, content_type: str, data: bytes, status: int, request_id: str) -> None:
    """``observer`` told of a body read whole: it began, it is this one chunk, it is complete."""
    try:
        observer.whole(content_type, data, status)
    except Exception as exc:  # never into the response: log, and let the answer go
        get_logger().warning("observer_failed", error=type(exc).__name__, request_id=request_id)


#: The console's cookie (``http.ui.COOKIE``) and the paths it lives under: an upstream's
#: ``Set-Cookie`` for either never reaches the browser (it could sign the operator out, or plant a
#: cookie the console would read).
CONSOLE_COOKIE = "projectionist_ui"
CONSOLE_PATH = "/admin"


def _console_cookie(value: str) -> bool:
    """Whether a ``Set-Cookie`` value names the console's cookie or a path under the console."""
    name, _, rest = value.partition("=")
    if name.strip() == CONSOLE_COOKIE:
        return True
    for attribute in rest.split(";")[1:]:
        key, _, path = attribute.partition("=")
        if key.strip().lower() == "path" and path.strip().lower().startswith(CONSOLE_PATH):
            return True
    return False


def answer_headers(out: CIMultiDict[str], headers: MultiMapping[str]) -> None:
    """The upstream's end-to-end ``headers``, added to ``out`` as every answer the proxy passes
    on gets them: never sniffed into active content (``nosniff``), sandboxed
    (``Content-Security-Policy: sandbox``: no script, no origin), and without an upstream's cookie
    for the console's name or path."""
    skip = _skipped(headers, frozenset())
    for key, value in headers.items():
        low = key.lower()
        if low not in skip and not (low == "set-cookie" and _console_cookie(value)):
            out.add(key, value)
    out["X-Content-Type-Options"] = "nosniff"
    # whatever an upstream answers is a document of no origin in a browser (a sandbox with no
    # permission at all): a page it returns never runs as this proxy's origin, where the console is
    out.add("Content-Security-Policy", "sandbox")


def _response_head(response: _R, answer: Response, request_id: str, timing: Timing) -> _R:
    """``response`` with the upstream's end-to-end headers, the request id and the overhead. A
    pass-through answer is never sniffed into active content (``nosniff``), is sandboxed
    (``Content-Security-Policy: sandbox``: no script, no origin), and an upstream's cookie for the
    console's name or path is dropped."""
    out = response.headers
    answer_headers(out, answer.headers)
    if request_id:
        out[REQUEST_ID_HEADER] = request_id
    if answer.content_length is not None:
        out["Content-Length"] = str(answer.content_length)
    overhead = time.perf_counter() - timing.request_started - timing.headers_s
    out[OVERHEAD_HEADER] = f"{overhead * 1000:.3f}"
    return response


async def _chunks(first: bytes, answer: Response) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in answer.iter_any():
        yield chunk


async def _stream(request: web.Request, response: web.StreamResponse, answer: Response,
                  observer: Observer | None, request_id: str, first: bytes = b"",
                  write_timeout: float = WRITE_TIMEOUT) -> None:
    """Relay the body (``first``: what was read of it already); tell ``observer`` each chunk, and
    that the body is complete before the client can have all of it (before the last byte of a
    sized body, else before the final chunk). A client that takes over ``write_timeout`` to take
    one chunk is cut off, and the upstream's connection is given up with it."""
    remaining = answer.content_length
    told = observer is None
    if observer is not None:
        _watch(observer.begin, answer.headers.get("Content-Type", ""), request_id)
    try:
        async for chunk in _chunks(first, answer) if first else answer.iter_any():
            if observer is not None:
                _watch(observer.chunk, chunk, request_id)
            if remaining is not None:
                remaining -= len(chunk)
                if remaining <= 0 and not told:
                    told = True
                    _complete(observer, answer.status, request_id)
            try:
                async with asyncio.timeout(write_timeout):
                    await response.write(chunk)
            except ConnectionError:
                return  # the client went away; nothing left to tell it
            except TimeoutError:
                _client_stalled(request, request_id)
                return
    except (ClientError, asyncio.TimeoutError) as exc:
        get_logger().warning("upstream_stream_broken", error=type(exc).__name__, request_id=request_id)
        abort(request)  # no terminating chunk: the client sees a cut stream
        return
    if not told:
        _complete(observer, answer.status, request_id)
    try:
        async with asyncio.timeout(write_timeout):
            await response.write_eof()
    except TimeoutError:
        _client_stalled(request, request_id)


def _client_stalled(request: web.Request, request_id: str) -> None:
    get_logger().warning("client_write_timeout", request_id=request_id)
    abort(request)  # the client sees a cut stream; the answer's connection is released by the caller


def _watch(call: Callable[[_A], None], argument: _A, request_id: str) -> None:
    try:
        call(argument)
    except Exception as exc:
        get_logger().warning("observer_failed", error=type(exc).__name__, request_id=request_id)


def _complete(observer: Observer | None, status: int, request_id: str) -> None:
    if observer is None:
        return
    try:
        observer.body_complete(status)
    except Exception as exc:  # never into the response: log, and let the stream finish
        get_logger().warning("observer_failed", error=type(exc).__name__, request_id=request_id)


def abort(request: web.Request) -> None:
    """End a started response without completing it: the connection closes, so the client sees
    a cut body (no final chunk, or fewer bytes than announced), never an error appended to it."""
    if request.transport is not None:
        request.transport.close()
