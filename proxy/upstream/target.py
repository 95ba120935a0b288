"""One configured upstream: its base URL, its key, and its single ``Transport`` (proxy layer)."""

from __future__ import annotations

from dataclasses import dataclass

from ...adapters.registry import FORMATS, SPEAKS
from .client import Client
from .signing import Signing
from .transport import MAX_CONNECTIONS, Kind, Transport
from .urls import Base


def open_transport(kind: Kind, connect_timeout: float, read_timeout: float,
                   max_connections: int = MAX_CONNECTIONS) -> Transport:
    """A transport (and its connection pool) with explicit timeouts: the built-in client, or the
    aiohttp reference (imported only when chosen). Neither adds a User-Agent, Accept-Encoding or
    Content-Type, nor decompresses anything."""
    if kind == "aiohttp":
        from .aiohttp_transport import AiohttpTransport

        return AiohttpTransport(connect_timeout, read_timeout, max_connections=max_connections)
    return Client(connect_timeout, read_timeout, max_connections=max_connections)


@dataclass
class Upstream:
    """One configured upstream (``base``: its parsed URL, the only origin requests to it may
    have) and, while the app runs, its single ``Transport``, which the live calls, the re-sends
    and replay's sends all go through."""

    name: str
    format: str
    url: str
    api_key: str
    connect_timeout: float
    read_timeout: float
    transport: Kind = "builtin"
    max_connections: int = MAX_CONNECTIONS
    client: Transport | None = None

    def __post_init__(self) -> None:
        self.base = Base(self.url)

    def open_transport(self) -> Transport:
        """Its transport; for a format whose upstream signs each request (and a configured key),
        one that signs them as they go (``signing``)."""
        opened = open_transport(self.transport, self.connect_timeout, self.read_timeout, self.max_connections)
        facts = FORMATS.get(self.format)
        if self.api_key and facts is not None and facts.signs_request:
            return Signing(opened, SPEAKS[self.format], self.api_key, self.base)
        return opened

    @property
    def session(self) -> Transport:
        if self.client is None:
            raise RuntimeError(f"upstream {self.name!r} used outside the app's lifetime")
        return self.client
