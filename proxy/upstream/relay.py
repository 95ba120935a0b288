"""Upstream relay: header hygiene, one call per request, SSE streamed chunk by chunk (proxy layer).

Everything that can fail before the first response byte (connect, timeout, upstream refused) is
raised as an ``UpstreamError`` for the caller to render in the client's wire format. Once the
response has started, a broken upstream stream closes the client connection rather than
pretending the response completed.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterable, Awaitable, Callable

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, MultiMapping
from yarl import URL

from projectionist.policy.errors import UpstreamError
from projectionist.proxy.observe.logger import get_logger

#: RFC 9110 §7.6.1 hop-by-hop fields, plus the ones aiohttp recomputes for each leg.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})


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


def new_session(connect_timeout: float, read_timeout: float) -> aiohttp.ClientSession:
    """The one ``ClientSession`` an upstream keeps for the app's life, with explicit timeouts."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    )


OVERHEAD_HEADER = "x-projectionist-overhead-ms"


class Capture:
    """A bounded copy of a relayed response body (for recording); chunks past ``limit`` are
    not kept and the copy is marked truncated."""

    __slots__ = ("limit", "chunks", "size", "truncated", "content_type", "before_eof")

    def __init__(self, limit: int, before_eof: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False
        self.content_type = ""
        #: Called with the status once the whole body has arrived from upstream, before the client
        #: can have all of it: before the last byte of a sized body, else before the final chunk.
        self.before_eof = before_eof

    def add(self, chunk: bytes) -> None:
        if self.size + len(chunk) > self.limit:
            self.truncated = True
            return
        self.chunks.append(chunk)
        self.size += len(chunk)

    def body(self) -> bytes:
        return b"".join(self.chunks)


class Timing:
    """Times of one request: ``headers_s`` from sending upstream to its response headers,
    ``upstream_s`` to the end of its body; ``request_started`` is when the proxy got the request."""

    __slots__ = ("request_started", "headers_s", "upstream_s", "status")

    def __init__(self, request_started: float) -> None:
        self.request_started = request_started
        self.headers_s = 0.0
        self.upstream_s = 0.0
        self.status: int | None = None


async def relay(
    request: web.Request,
    session: aiohttp.ClientSession,
    url: URL,
    body: bytes | AsyncIterable[bytes] | None,
    headers: CIMultiDict[str],
    timing: Timing,
    extra_headers: dict[str, str] | None = None,
    capture: Capture | None = None,
) -> web.StreamResponse:
    """Send one request upstream and stream its response back unchanged (minus hop-by-hop).

    The response carries ``x-projectionist-overhead-ms``: the proxy's own time so far, i.e. its
    time until the response starts minus the upstream's time to its headers."""
    started = time.perf_counter()
    try:
        upstream = await session.request(request.method, url, data=body, headers=headers)
    except asyncio.TimeoutError:
        raise UpstreamError("upstream timed out before responding", code="UPSTREAM_TIMEOUT", status=504) from None
    except aiohttp.ClientError as exc:
        raise UpstreamError(f"upstream unreachable: {type(exc).__name__}") from None
    try:
        timing.headers_s = time.perf_counter() - started
        timing.status = upstream.status
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        skip = _skipped(upstream.headers, frozenset())
        headers = response.headers
        for key, value in upstream.headers.items():
            if key.lower() not in skip:
                headers.add(key, value)
        for key, value in (extra_headers or {}).items():
            response.headers[key] = value
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        overhead = time.perf_counter() - timing.request_started - timing.headers_s
        response.headers[OVERHEAD_HEADER] = f"{overhead * 1000:.3f}"
        try:
            await response.prepare(request)
        except ConnectionError:
            return response  # the client left before the response started: nothing to send it
        finish = capture.before_eof if capture is not None else None
        if capture is not None:
            capture.content_type = upstream.headers.get("Content-Type", "")
        remaining = upstream.content_length
        try:
            async for chunk in upstream.content.iter_any():
                if capture is not None and not capture.truncated:
                    capture.add(chunk)
                if remaining is not None:
                    remaining -= len(chunk)
                    if remaining <= 0 and finish is not None:  # a sized body ends with its last byte:
                        await finish(upstream.status)  # record before the client can have it all
                        finish = None
                try:
                    await response.write(chunk)
                except ConnectionError:
                    return response  # the client went away; nothing left to tell it
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            get_logger().warning("upstream_stream_broken", error=type(exc).__name__,
                                 request_id=(extra_headers or {}).get("x-projectionist-request-id"))
            if request.transport is not None:
                request.transport.close()  # no terminating chunk: the client sees a cut stream
            return response
        if finish is not None:
            await finish(upstream.status)
        await response.write_eof()
        return response
    finally:
        timing.upstream_s = time.perf_counter() - started
        upstream.release()
