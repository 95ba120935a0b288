"""The upstream leg of a relayed WebSocket, one aiohttp client WebSocket per client socket (proxy layer,
upstream sublayer).

A WebSocket is never pooled nor reused, so each client socket's upstream connection comes from an
aiohttp ``ClientSession`` of its own, opened and closed with it: the HTTP transports' pools
(``client``, ``aiohttp_transport``) hold nothing it could share, and neither speaks WebSocket. The
session adds no User-Agent, keeps no cookies and follows no redirect; the connection (with TLS)
must be made within ``connect_timeout`` and the 101 must come within ``handshake_timeout``. After
the handshake, silence is the relay's to bound. aiohttp's errors become
the transport's (``transport``) at this boundary; a handshake answered with anything but 101 is
``Refused``, with the upstream's status (a redirect too: aiohttp's ``ws_connect`` has no
``allow_redirects``, and following one would hand another host the client's headers and open a
socket to a base nobody configured).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final, Literal

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from .aiohttp_transport import mapped
from .transport import ClientError, ResponseError

#: Seconds a closing handshake may take before the connection is dropped.
CLOSE_TIMEOUT: Final = 5.0
#: The upstream leg's socket: text frames arrive as bytes (relayed, never decoded to str).
UpstreamSocket = aiohttp.ClientWebSocketResponse[Literal[False]]
#: The statuses aiohttp would follow.
REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})


class Refused(ClientError):
    """The upstream answered the WebSocket handshake with ``status``, not 101."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the upstream answered the WebSocket upgrade with HTTP {status}")
        self.status = status


async def _no_redirect(request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
    """A session middleware: a redirect is the answer, refused, never a request to its Location."""
    response = await handler(request)
    if response.status in REDIRECTS:
        response.close()
        raise Refused(response.status)
    return response


@asynccontextmanager
async def connect(url: URL, headers: CIMultiDict[str], protocols: Sequence[str], *, connect_timeout: float,
                  handshake_timeout: float, max_message: int,
                  heartbeat: float | None = None) -> AsyncIterator[UpstreamSocket]:
    """An open WebSocket to ``url`` (http(s): the configured base's scheme), sent ``headers`` as
    given (aiohttp adds the handshake's own) and offering ``protocols``; frames over
    ``max_message`` bytes close it (1009). Closed, with its session, when the block ends."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1, enable_cleanup_closed=False), cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",), middlewares=(_no_redirect,),
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_connect=connect_timeout,
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
