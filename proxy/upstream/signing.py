"""Requests signed as they go: a ``Transport`` that has a format's ``sign`` authenticate each
request to its upstream (proxy layer, upstream sublayer).

A format whose upstream signs requests (``FormatFacts.signs_request``: a signature over the
method, URL, headers and body, as AWS's SigV4) cannot have its auth set with the other headers,
before the body is built: its upstream's transport is wrapped in ``Signing``, which asks the
adapter's ``sign`` right before each send, with the bytes that go (a live call, a re-send with
another body, a replay through the running app's transport). A body streamed through unread (a
pass-through) is signed as None. Only a request to the upstream's own base is signed: a replay
to another URL through this transport goes as it is, as it gets no configured key either.
Formats whose ``sign`` reads the key alone never come here (``Upstream.open_transport``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

from multidict import CIMultiDict
from yarl import URL

from ...adapters.base import WireFormat
from .transport import Answer, Body, Transport, UpstreamSocket
from .urls import Base


class Signing:
    """``inner``, with ``fmt.sign`` setting its headers on every request under ``base``."""

    def __init__(self, inner: Transport, fmt: WireFormat, credential: str, base: Base) -> None:
        self.inner = inner
        self.fmt = fmt
        self._credential = credential
        self._origin = base.url.origin()
        self._path = base.path

    def _own(self, url: URL) -> bool:
        """Whether ``url`` is under the upstream's base (its origin, and its path's prefix)."""
        path = url.raw_path
        return url.origin() == self._origin and (path == self._path or path.startswith(self._path + "/"))

    def _signed(self, method: str, url: URL, headers: CIMultiDict[str], body: bytes | None) -> CIMultiDict[str]:
        """``headers`` with what ``sign`` sets for this request, when it goes to the upstream's base."""
        if not self._own(url):
            return headers
        signed = CIMultiDict(headers)
        for name, value in self.fmt.sign(method, str(url), headers, body, self._credential).items():
            signed[name] = value
        return signed

    async def send(self, method: str, url: URL, *, headers: CIMultiDict[str], body: Body = None) -> Answer:
        headers = self._signed(method, url, headers, body if isinstance(body, bytes) else None)
        return await self.inner.send(method, url, headers=headers, body=body)

    def websocket(self, url: URL, headers: CIMultiDict[str], protocols: Sequence[str], *, handshake_timeout: float,
                  max_message: int, heartbeat: float | None = None) -> AbstractAsyncContextManager[UpstreamSocket]:
        """The inner transport's socket, its handshake (a ``GET`` with no body) signed. The registry
        gives no signing format a WebSocket route today; a replay's may still open one."""
        return self.inner.websocket(url, self._signed("GET", url, headers, None), protocols,
                                    handshake_timeout=handshake_timeout, max_message=max_message, heartbeat=heartbeat)

    async def aclose(self) -> None:
        await self.inner.aclose()
