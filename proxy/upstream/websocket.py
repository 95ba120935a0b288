"""The WebSockets a transport opens, one aiohttp client WebSocket per relayed socket (proxy layer,
upstream sublayer).

A WebSocket is never pooled nor reused, and neither HTTP transport (``client``,
``aiohttp_transport``) speaks it, so each transport holds a ``Sockets`` beside its pool: one
aiohttp connector of the transport's own (its TLS context, DNS answers cached for 10 s, no bound of
its own: an open socket never takes an HTTP call's place), closed with the transport, and for each
socket a session on that connector, closed with the socket, whose timeouts are that socket's. The
session adds no User-Agent, keeps no cookies and follows no redirect; the connection (with TLS)
must be made within the transport's ``connect_timeout`` and the 101 must come within
``handshake_timeout``. After the handshake, silence is the relay's to bound. aiohttp's errors
become the transport's (``transport``) at this boundary; a handshake answered with anything but
101 is ``Refused``, with the upstream's status (a redirect too: aiohttp's ``ws_connect`` has no
``allow_redirects``, and following one would hand another host the client's headers and open a
socket to a base nobody configured).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from .aiohttp_errors import mapped
from .transport import Refused, ResponseError, UpstreamSocket

#: Seconds a closing handshake may take before the connection is dropped.
CLOSE_TIMEOUT: Final = 5.0
#: The statuses aiohttp would follow.
REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})

__all__ = ["CLOSE_TIMEOUT", "REDIRECTS", "Refused", "Sockets", "UpstreamSocket"]


async def _no_redirect(request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
    """A session middleware: a redirect is the answer, refused, never a request to its Location."""
    response = await handler(request)
    if response.status in REDIRECTS:
        response.close()
        raise Refused(response.status)
    return response


class Sockets:
    """The WebSockets of one transport (``Transport.websocket``), on its connector (see the
    module's docstring). ``ssl_context``: the transport's (None: the system's trust)."""

    __slots__ = ("connect_timeout", "_ssl", "_connector")

    def __init__(self, connect_timeout: float, ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout = connect_timeout
        self._ssl = ssl_context
        self._connector: aiohttp.TCPConnector | None = None

    def _shared(self) -> aiohttp.TCPConnector:
        """The connector, made with the first socket (aiohttp's wants the running loop)."""
        if self._connector is None:
            self._connector = aiohttp.TCPConnector(limit=0, ssl=self._ssl if self._ssl is not None else True,
                                                   enable_cleanup_closed=False)
        return self._connector

    @asynccontextmanager
    async def connect(self, url: URL, headers: CIMultiDict[str], protocols: Sequence[str], *,
                      handshake_timeout: float, max_message: int,
                      heartbeat: float | None = None) -> AsyncIterator[UpstreamSocket]:
        """An open WebSocket to ``url`` (http(s): the configured base's scheme), sent ``headers`` as
        given (aiohttp adds the handshake's own) and offering ``protocols``; frames over
        ``max_message`` bytes close it (1009). Closed, with its session, when the block ends."""
        session = aiohttp.ClientSession(
            connector=self._shared(), connector_owner=False, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",), middlewares=(_no_redirect,),
            timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_timeout, sock_connect=self.connect_timeout,
                                          sock_read=handshake_timeout))
        try:
            with mapped():
                try:
                    socket = await session.ws_connect(
                        url, headers=headers, protocols=tuple(protocols), autoping=True, heartbeat=heartbeat,
                        max_msg_size=max_message, compress=0, decode_text=False,
                        timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT))
                except aiohttp.WSServerHandshakeError as exc:
                    if exc.status == 101:  # a 101 whose handshake does not check out
                        raise ResponseError(f"not a valid WebSocket handshake answer: {exc.message}") from None
                    raise Refused(exc.status) from None
            try:
                yield socket
            finally:
                await socket.close()
        finally:
            await session.close()

    async def aclose(self) -> None:
        """Close the connector, and with it every socket still open on it."""
        if self._connector is not None:
            await self._connector.close()
