"""Everything a handler needs, typed, behind one AppKey: config, store, log, upstreams, guard (proxy layer).

No module globals: handlers reach these through ``request.app[SERVICES]``. The edge builds it,
with what is the call's own: its record writer (``call.record.Recording``, seen here as the
``RecordWriter`` protocol) and what calls know of each other (``call.inflight``); the edge, the file APIs, the console and the call read it; the layers below get what
they need as arguments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from ...policy.model import HttpRefs
from ...policy.ports import SessionLog
from ...policy.probe import Prober
from ..config import Config
from .auth import Guard
from .budget import Budget
from .context import Timing
from ..observe.metrics import Metrics
from ..sessionlog.cached import CachedLog
from ..stores.admission import image_facts
from ..stores.base import Store
from ..stores.cache import CachedStore
from .resumable import Uploads
from ..stores.tenancy import Visible
from ..stores.variants import Variants
from ..upstream.identity import Identities
from ..upstream.target import Upstream

if TYPE_CHECKING:  # imported only when tracing is configured
    from ..observe.tracing import Tracing


class RecordWriter(Protocol):
    """What the app's services need of the record writer of proxied calls (``call.record.Recording``,
    which the edge makes: it is the call's): whether it records, starting a call's record (and
    the headers it sends, as its record holds them), and waiting for what is queued. Named here
    as a protocol, so nothing below the call knows it."""

    #: Seconds at most a record of a call with images waits for its batch.
    image_wait: float

    @property
    def on(self) -> bool: ...

    def start(self, call: Any, raw: bytes, described: Any, projection: Any) -> Any: ...

    def sent_headers(self, headers: Any) -> tuple[tuple[str, str], ...]: ...

    async def drain(self) -> None: ...

    async def settle(self, session_id: str, timeout: float) -> bool: ...

    async def close(self) -> None: ...


class CallsAccepted(Protocol):
    """What each upstream format accepted in each session (``call.inflight.Acceptances``)."""

    async def of(self, log: SessionLog, session_id: str, upstream_format: str) -> set[str]: ...


class Carried(Protocol):
    """One call in flight, while entered: the images it carries (``call.inflight.Carrying``)."""

    ids: frozenset[str]

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


class CallsInFlight(Protocol):
    """The images of this process's calls in flight (``call.inflight.InFlight``)."""

    def carrying(self, session_id: str, upstream_format: str, ids: Iterable[str], timing: Timing) -> Carried: ...

    def accepting(self, session_id: str, upstream_format: str) -> set[str]: ...


#: The console's own application (``app.admin_site`` serves it), kept on the proxy's.
ADMIN_APP = web.AppKey("projectionist.admin_app", web.Application)


@dataclass
class Services:
    """``store`` is the store itself (admission, recovery's fresh verified reads); ``reader`` is
    what projection reads through (the verified-object cache in front of ``store``); ``log`` owns
    the per-session fold cache and locks; ``variants`` makes and finds the variants that fit a
    provider's profile (admitted into ``store``, read back through ``reader``)."""

    config: Config
    store: Store
    reader: CachedStore
    log: CachedLog
    upstreams: dict[str, Upstream]
    guard: Guard
    metrics: Metrics
    #: The record writer of proxied calls (the edge makes it: it is the call's).
    recording: RecordWriter
    #: What each upstream format accepted in each session, and the images of the calls in flight
    #: by session and format (for attributing a refusal; the edge makes them: they are the call's).
    acceptances: CallsAccepted
    inflight: CallsInFlight
    #: Traces of proxied calls, when ``[telemetry] otlp_endpoint`` is set.
    tracing: Tracing | None = None
    variants: Variants = field(init=False)
    #: Gemini resumable uploads opened on this process (their bytes are in the store: any process finishes them).
    uploads: Uploads = field(init=False)
    #: The bytes the requests under way may hold at once (``budget``).
    budget: Budget = field(init=False)

    def __post_init__(self) -> None:
        self.prober = Prober(self.config.policy.retryable_probe_after)
        #: The http(s) URLs that are references: the ones under this proxy's public URL.
        self.http_refs = HttpRefs.of(self.config.public_url)
        server = self.config.server
        self.session_headers: tuple[str, ...] = (server.session_header, *server.session_header_aliases)
        #: Where the console's pages are, for the answer to ``/admin`` on the proxy's own port (the
        #: edge's ``admin_site`` puts the port it bound here).
        self.console_url = self.config.console_url
        policy = self.config.policy
        # a render waits for a thread as long as one may take: a request that crosses the many-image
        # rule needs every one of its images rendered, and a store lane's short wait would fail it
        self.variants = Variants(self.store, self.reader, threads=policy.variant_threads,
                                 timeout=policy.variant_timeout, queue_timeout=policy.variant_timeout,
                                 max_pixels=self.config.store.limits.max_pixels)
        #: The identity of the images clients inline themselves, kept for the bytes that come back.
        self.identities = Identities(policy.inline_cache_bytes, sniff=image_facts)
        self.uploads = Uploads()
        self.budget = self.metrics.budget = Budget(server.memory_budget, server.body_timeout)
        #: What each tenant admitted, and so may list, read and reference.
        self.visible = Visible(self.store, self.reader)
        self._tasks: set[asyncio.Task[Any]] = set()

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` off the request, kept referenced until it ends (cancelled at shutdown)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close_background(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


SERVICES = web.AppKey("projectionist", Services)
