"""The reference ``Transport``: aiohttp's ``ClientSession``, set up to put on the wire what the
built-in client puts there (proxy layer, upstream sublayer).

``[upstreams.NAME] transport = "aiohttp"`` selects it. Its session adds no User-Agent,
Accept-Encoding or Content-Type (``skip_auto_headers``), keeps no cookies, follows no redirect and
decompresses nothing; its connector bounds the connections per origin (``limit_per_host``) and
caches DNS answers for 10 s. The differences are aiohttp's own: a field repeated under names that
differ in case (``X-A``, then ``x-a``) keeps only its last value; its parser is more lenient (a
bare LF, obs-fold) and its header lines shorter (8190 bytes); a 204 with a body is refused; and a
call waiting for a connection may be overtaken by one that comes later. aiohttp's exceptions become
the transport's at this module's boundary, by one table (``aiohttp_errors.AIOHTTP_ERRORS``), so
nothing above it knows aiohttp's client. Its WebSockets are its ``websocket.Sockets``, as the
built-in client's are.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from .aiohttp_errors import AIOHTTP_ERRORS, mapped
from .transport import MAX_CONNECTIONS, Body, RequestBodyError, ResponseError, UpstreamSocket
from .websocket import Sockets

class _Answer:
    """An aiohttp ``ClientResponse`` as a transport ``Answer``."""

    __slots__ = ("status", "reason", "headers", "content_length", "content_type", "_response", "_released")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.status = response.status
        self.reason = response.reason or ""
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
            for name, value in response.raw_headers))
        length = self.headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.content_type = response.content_type
        self._response = response
        self._released = False

    async def _chunks(self) -> AsyncIterator[bytes]:
        with mapped():
            async for chunk in self._response.content.iter_any():
                yield chunk
        self.release()

    def iter_any(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def read(self) -> bytes:
        with mapped():
            data = await self._response.read()
        self.release()
        return data

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._response.release()


class AiohttpTransport:
    """``Transport`` over one aiohttp ``ClientSession`` (see the module's docstring)."""

    def __init__(self, connect_timeout: float, read_timeout: float, *, ssl_context: ssl.SSLContext | None = None,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=max_connections, ttl_dns_cache=10,
                                         ssl=ssl_context if ssl_context is not None else True,
                                         enable_cleanup_closed=False)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_connect=connect_timeout,
                                          sock_read=read_timeout))
        self.max_connections = max_connections
        self._sockets = Sockets(connect_timeout, ssl_context)

    async def send(self, method: str, url: URL, *, headers: CIMultiDict[str], body: Body = None) -> _Answer:
        with mapped(pool_wait=True):
            response = await self._session.request(method, url, headers=headers, data=body, allow_redirects=False,
                                                   compress=None, chunked=None)
        if response.status == 101 or not 100 <= response.status <= 599:  # an upgrade nobody asked for
            response.close()
            raise ResponseError(f"a response status {response.status} to a plain call")
        return _Answer(response)

    def websocket(self, url: URL, headers: CIMultiDict[str], protocols: Sequence[str], *, handshake_timeout: float,
                  max_message: int, heartbeat: float | None = None) -> AbstractAsyncContextManager[UpstreamSocket]:
        return self._sockets.connect(url, headers, protocols, handshake_timeout=handshake_timeout,
                                     max_message=max_message, heartbeat=heartbeat)

    async def aclose(self) -> None:
        await self._sockets.aclose()
        await self._session.close()


__all__ = ["AIOHTTP_ERRORS", "AiohttpTransport", "RequestBodyError", "mapped"]
