"""The seam between a proxied call and the wire (proxy layer, upstream sublayer).

``Transport`` is what the relay, the re-send and replay send through, in the shape of httpx's
``AsyncBaseTransport``: one method that takes a request and returns its answer once the answer's
head has arrived, one that opens a WebSocket (a relayed socket's upstream leg, replay's), and
``aclose()``, which closes both kinds. Two implement it:

- ``client.Client``, the proxy's own HTTP/1.1 client (llhttp parsing, a keep-alive pool per
  origin): the default, ``transport = "builtin"``;
- ``aiohttp_transport.AiohttpTransport``, aiohttp's ``ClientSession`` configured to put the same
  bytes on the wire: the reference, ``transport = "aiohttp"``.

Both raise only the errors below (each transport maps its library's own at its boundary), and
both pass the caller's headers as given: they add ``Host``, ``Accept: */*`` unless given, and the
body's framing, never a User-Agent, an Accept-Encoding or a Content-Type of their own; they
follow no redirect and decompress nothing. ``max_connections`` bounds the connections to one
origin: a call that finds them all busy waits for one, within the connect timeout, and then fails
with ``PoolTimeout``. A WebSocket is never pooled: both open it by ``websocket.Sockets``, beside
their HTTP pool, with their connect timeout and TLS context.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Final, Literal, Protocol, TypeAlias

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

if TYPE_CHECKING:
    from aiohttp import ClientWebSocketResponse

Body = bytes | AsyncIterable[bytes] | None
Kind = Literal["builtin", "aiohttp"]
#: The upstream leg of a WebSocket: aiohttp's client socket, its text frames arriving as bytes
#: (relayed, never decoded to str).
UpstreamSocket: TypeAlias = "ClientWebSocketResponse[Literal[False]]"
#: Connections to one origin a transport opens at most (httpx's and aiohttp's default total).
MAX_CONNECTIONS: Final = 100


class ClientError(Exception):
    """The upstream could not be reached, or its answer could not be read."""


class ConnectError(ClientError):
    """No connection (refused, unresolvable, TLS handshake or certificate failure)."""


class ServerDisconnected(ClientError):
    """The server closed the connection before its answer began."""


class ResponseError(ClientError):
    """An answer that is no valid HTTP/1.1 (framing, both Content-Length and Transfer-Encoding)."""


class PayloadError(ClientError):
    """The answer's body broke off (closed, reset, or malformed) before its end."""


class RequestBodyError(ClientError):
    """The request body could not be sent as declared (its length, or its source failed)."""


class Refused(ClientError):
    """The upstream answered a WebSocket handshake with ``status``, not 101."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the upstream answered the WebSocket upgrade with HTTP {status}")
        self.status = status


class ConnectTimeout(TimeoutError):
    """No connection (with its TLS handshake) within ``connect_timeout``."""


class PoolTimeout(TimeoutError):
    """Every connection to the origin stayed busy for ``connect_timeout``."""


class ReadTimeout(TimeoutError):
    """The server was silent for ``read_timeout`` while an answer (head or body) was awaited."""


class WriteTimeout(TimeoutError):
    """The server read nothing of a streamed request body for ``read_timeout``."""


class Answer(Protocol):
    """One upstream answer: its head is here; its body is read once, in chunks or whole.
    ``headers`` are as sent (names keep their case, repeated fields stay). ``release()``
    (idempotent) ends it: the connection is reused only after a whole body."""

    status: int
    reason: str
    headers: CIMultiDictProxy[str]
    content_length: int | None
    content_type: str

    def iter_any(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...

    def release(self) -> None: ...


class Transport(Protocol):
    """Sends requests to any origin and hands back their answers (see the module's docstring)."""

    async def send(self, method: str, url: URL, *, headers: CIMultiDict[str], body: Body = None) -> Answer: ...

    def websocket(self, url: URL, headers: CIMultiDict[str], protocols: Sequence[str], *, handshake_timeout: float,
                  max_message: int, heartbeat: float | None = None) -> AbstractAsyncContextManager[UpstreamSocket]:
        """An open WebSocket to ``url``, sent ``headers`` as given and offering ``protocols``,
        closed when the block ends. The connection is made within the transport's connect
        timeout and the 101 must come within ``handshake_timeout``; a handshake answered with
        anything but 101 (a redirect too: never followed) is ``Refused``."""
        ...

    async def aclose(self) -> None: ...
