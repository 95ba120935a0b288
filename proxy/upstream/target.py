"""One configured upstream: its base URL, its key, and its single HTTP ``Client`` (proxy layer)."""

from __future__ import annotations

from dataclasses import dataclass

from .client import Client
from .urls import Base


def new_session(connect_timeout: float, read_timeout: float) -> Client:
    """The one client (and connection pool) an upstream keeps for the app's life, with explicit
    timeouts. It adds no User-Agent, Accept-Encoding or Content-Type and decompresses nothing."""
    return Client(connect_timeout, read_timeout)


@dataclass
class Upstream:
    """One configured upstream (``base``: its parsed URL, the only origin requests to it may
    have) and, while the app runs, its single ``Client``."""

    name: str
    format: str
    url: str
    api_key: str
    connect_timeout: float
    read_timeout: float
    client: Client | None = None

    def __post_init__(self) -> None:
        self.base = Base(self.url)

    @property
    def session(self) -> Client:
        if self.client is None:
            raise RuntimeError(f"upstream {self.name!r} used outside the app's lifetime")
        return self.client
