"""Traffic recording: what each proxied call sent and got, in the session log (proxy layer).

For a request with a session and ``record.mode`` other than ``off``:

- before the upstream call, a ``request/recorded`` event: route, adapter, upstream, the digest of
  the inbound body, the digest of the projected body, every reference with its path and outcome,
  and the *shape* (short digests per top-level member and list item) that lets a replay name the
  first differing path; in ``full`` mode the inbound body is stored as a blob;
- after the response, a ``response/recorded`` event: status, latency, usage; in ``full`` mode the
  response body (for SSE the concatenated stream) as a blob.

What a request record says of the body (its projected digest, reference paths, shape) comes
from ``upstream.describe``, computed on the very tree that became the upstream body. Records are
appended non-durably (ordered in the log, flushed with the next durable append) and never hold
headers, keys, tokens or attachment base64.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final

import msgspec

from projectionist.adapters.responses import usage_of
from projectionist.policy.errors import ProjectionistError
from projectionist.policy.events import RequestRecorded, ResponseRecorded
from projectionist.policy.projection import Projection
from projectionist.policy.ports import SessionLog
from projectionist.proxy.observe.logger import get_logger
from projectionist.proxy.observe.metrics import Metrics
from projectionist.proxy.stores.base import Store
from projectionist.proxy.upstream.describe import Described, sha256_id

_decoder: Final = msgspec.json.Decoder()
#: Metadata mode keeps this much of a response, to find its usage.
USAGE_SCAN_BYTES: Final = 1024 * 1024


class Recording:
    """Where this app's records go: the session log (and, in ``full`` mode, the store's blob area).

    Records are evidence, not state: a record that cannot be written is logged and counted
    (``projectionist_records_dropped_total``), and the call goes on as if recording were off.
    ``background`` runs a write to completion even if the request that started it is cancelled.
    """

    def __init__(self, log: SessionLog, store: Store, mode: str, max_response_bytes: int, metrics: Metrics,
                 background: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        self.log = log
        self.store = store
        self.mode = mode
        self.max_response_bytes = max_response_bytes
        self.metrics = metrics
        self.background = background

    @property
    def on(self) -> bool:
        return self.mode != "off"

    async def start(self, call: CallInfo, raw: bytes, described: Described, projection: Projection | None
                    ) -> Recorder | None:
        """Append the ``request/recorded`` event of this call (before the upstream call); the
        ``Recorder`` then watches the response. None when the record could not be written."""
        try:
            blob = await self.store.put_blob(raw) if self.mode == "full" else None
            data = RequestRecorded(
                request_id=call.request_id, route=call.route, adapter=call.fmt.NAME, upstream=call.upstream,
                method=call.method, path=call.path,
                log_seq=projection.state.last_seq if projection is not None else 0,
                inbound_digest=sha256_id(raw), projected_digest=described.projected_digest,
                refs=described.refs, shape=described.shape, inbound_blob=blob,
            )
            [event] = await self.log.append(call.session_id, None, [data], durable=False)
        except Exception as exc:  # evidence only: the call goes on unrecorded
            self._dropped("request", exc, call.request_id)
            return None
        return Recorder(self, call, event.seq)

    def _dropped(self, kind: str, exc: BaseException, request_id: str) -> None:
        self.metrics.records_dropped[kind] += 1
        code = exc.code if isinstance(exc, ProjectionistError) else type(exc).__name__
        get_logger().warning("record_dropped", kind=kind, error=code, request_id=request_id)


class CallInfo(msgspec.Struct, frozen=True):
    """What a record says about the call itself (never headers, keys or tokens)."""

    session_id: str
    request_id: str
    started: float
    route: str
    fmt: Any  # WireFormat: a module, which msgspec cannot type
    upstream: str
    method: str
    path: str


class Recorder:
    """Watches one recorded call's response (a relay ``Observer``) and appends its
    ``response/recorded`` event: before the last byte reaches the client when the whole body came
    through, else once the call ended (``finished``, ``failed``, ``cancelled``)."""

    def __init__(self, recording: Recording, call: CallInfo, request_seq: int) -> None:
        self.recording = recording
        self.call = call
        self.request_seq = request_seq
        full = recording.mode == "full"
        self.capture = Capture(recording.max_response_bytes if full else USAGE_SCAN_BYTES)
        self.full = full
        self.recorded = False

    def chunk(self, data: bytes) -> None:
        self.capture.add(data)

    def begin(self, content_type: str) -> None:
        self.capture.content_type = content_type

    async def body_complete(self, status: int) -> None:
        self.recorded = True
        # shielded: a client that already has the whole answer may hang up while this runs
        await asyncio.shield(self.recording.background(self._record(status, None)))

    async def finished(self, status: int) -> None:
        """The relay returned: record it unless the complete body already was."""
        if not self.recorded:
            self.recorded = True
            await self._record(status, "INCOMPLETE")

    async def failed(self, code: str) -> None:
        """The call failed before its response started (the error went to the client)."""
        if not self.recorded:
            self.recorded = True
            await self._record(None, code)

    def cancelled(self) -> None:
        """The client left: record that in the background."""
        if not self.recorded:
            self.recorded = True
            self.recording.background(self._record(None, "CLIENT_DISCONNECTED"))

    async def _record(self, status: int | None, error_code: str | None) -> None:
        """Never raises: a response record that cannot be written is dropped and counted."""
        try:
            body = self.capture.body()
            latency = round((time.perf_counter() - self.call.started) * 1000, 3)
            blob = await self.recording.store.put_blob(body) if self.full and status is not None else None
            data = ResponseRecorded(self.call.request_id, self.request_seq, status, latency,
                                    usage_of(self.call.fmt.usage, body, self.capture.content_type)
                                    if status is not None else None,
                                    error_code, blob, self.capture.truncated)
            await self.recording.log.append(self.call.session_id, None, [data], durable=False)
        except Exception as exc:
            self.recording._dropped("response", exc, self.call.request_id)


class Capture:
    """A bounded copy of a relayed response body; chunks past ``limit`` are not kept and the copy
    is marked truncated."""

    __slots__ = ("limit", "chunks", "size", "truncated", "content_type")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False
        self.content_type = ""

    def add(self, chunk: bytes) -> None:
        if self.truncated:
            return
        if self.size + len(chunk) > self.limit:
            self.truncated = True
            return
        self.chunks.append(chunk)
        self.size += len(chunk)

    def body(self) -> bytes:
        return b"".join(self.chunks)
