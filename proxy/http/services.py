"""Typed application state: config, backends, upstreams and locks behind one AppKey (proxy layer).

No module globals: everything a handler needs hangs off ``request.app[APP]``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import msgspec
from aiohttp import web

from projectionist.policy.model import StoredImage
from projectionist.policy.ports import AttachmentStore, SessionLog
from projectionist.proxy.http.auth import TOKEN_HEADER, Guard
from projectionist.proxy.config import Config
from projectionist.proxy.observe.metrics import Metrics
from projectionist.proxy.http.sessions import SessionLocks, StateCache
from projectionist.proxy.upstream.urls import Base


class AttachmentMeta(msgspec.Struct, frozen=True):
    """What the store recorded at admission (``name`` and ``created_at`` of the first admission)."""

    id: str
    media_type: str
    bytes: int
    width: int
    height: int
    name: str | None = None
    created_at: int = 0


class Store(AttachmentStore, Protocol):
    """An attachment store the proxy can also admit into, describe and delete from."""

    async def admit(self, data: bytes, declared_type: str | None = None, *, name: str | None = None) -> StoredImage: ...
    async def stat(self, attachment_id: str) -> AttachmentMeta | None: ...
    async def delete(self, attachment_id: str) -> bool: ...
    async def put_blob(self, data: bytes) -> str: ...
    async def get_blob(self, blob_id: str) -> bytes | None: ...
    async def close(self) -> None: ...


class Log(SessionLog, Protocol):
    async def start(self) -> None: ...
    async def close(self) -> None: ...


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


@dataclass
class AppState:
    """``store`` is the store itself (admission, recovery's fresh verified reads); ``reader`` is
    what projection reads through (the verified-object cache in front of ``store``)."""

    config: Config
    store: Store
    reader: AttachmentStore
    log: Log
    upstreams: dict[str, Upstream]
    guard: Guard
    locks: SessionLocks = field(default_factory=SessionLocks)
    states: StateCache = field(default_factory=StateCache)
    metrics: Metrics = field(default_factory=Metrics)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` to completion even if the request that started it is cancelled; the app
        waits for such tasks when it shuts down."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def __post_init__(self) -> None:
        server = self.config.server
        self.session_headers: tuple[str, ...] = (server.session_header, *server.session_header_aliases)
        #: Headers never forwarded upstream: the proxy's own session and token headers (lowercase).
        self.own_headers = frozenset({*(name.lower() for name in self.session_headers), TOKEN_HEADER})


APP = web.AppKey("projectionist", AppState)
