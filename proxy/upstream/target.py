"""One configured upstream: its base URL, its key, and its single ``ClientSession`` (proxy layer)."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from projectionist.proxy.upstream.urls import Base


def new_session(connect_timeout: float, read_timeout: float) -> aiohttp.ClientSession:
    """The one ``ClientSession`` an upstream keeps for the app's life, with explicit timeouts."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    )


@dataclass
class Upstream:
    """One configured upstream (``base``: its parsed URL, the only origin requests to it may
    have) and, while the app runs, its single ``ClientSession``."""

    name: str
    format: str
    url: str
    api_key: str
    connect_timeout: float
    read_timeout: float
    client: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        self.base = Base(self.url)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self.client is None:
            raise RuntimeError(f"upstream {self.name!r} used outside the app's lifetime")
        return self.client
