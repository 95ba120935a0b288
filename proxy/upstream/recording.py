"""Traffic recording: what each proxied call sent and got, in the session log (proxy layer).

For a request with a session and ``record.mode`` other than ``off``:

- before the upstream call, a ``request/recorded`` event: route, adapter, upstream, the digest of
  the inbound body, the digest of the projected body, every reference with its path and outcome,
  and the *shape* (short digests per top-level member and list item) that lets a replay name the
  first differing path; in ``full`` mode the inbound body is stored as a blob;
- after the response, a ``response/recorded`` event: status, latency, usage; in ``full`` mode the
  response body (for SSE the concatenated stream) as a blob.

The projected digest is a Merkle form of the upstream bytes: the body with every inlined image
value replaced by the sha256 of that value's exact JSON bytes, then hashed. It changes whenever
any upstream byte would, without hashing megabytes of base64 per request. Records are appended
non-durably (ordered in the log, flushed with the next durable append) and never hold headers,
keys, tokens or attachment base64.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable
from typing import Any, Final

import msgspec
from aiohttp import web

from projectionist.adapters.base import Json, WireFormat
from projectionist.policy.errors import ProjectionistError
from projectionist.policy.events import RefRecord, RequestRecorded, ResponseRecorded
from projectionist.policy.fold import fold
from projectionist.policy.model import Outcome, Resolved, StoredImage
from projectionist.policy.projection import Projection
from projectionist.proxy.stores.cache import Encoded, inline
from projectionist.proxy.upstream.outgoing import recorded_path
from projectionist.proxy.observe.logger import get_logger
from projectionist.proxy.upstream.relay import Capture
from projectionist.proxy.http.services import APP, AppState, Upstream
from projectionist.proxy.http.middleware import REQUEST_ID, STARTED, info

_decoder: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()
#: Metadata mode keeps this much of a response, to find its usage.
USAGE_SCAN_BYTES: Final = 1024 * 1024


def sha256_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Digested:
    """An ``Inline`` that renders each image as the digest of the value it would splice."""

    __slots__ = ("media_type", "_encoded")

    def __init__(self, encoded: Encoded) -> None:
        self.media_type = encoded.media_type
        self._encoded = encoded

    def data_url(self) -> str:
        return "<" + self._encoded.digest("data_url") + ">"

    def base64(self) -> str:
        return "<" + self._encoded.digest("base64") + ">"


def _digested(image: StoredImage) -> _Digested:
    return _Digested(inline(image))


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def container_paths(root: Json) -> dict[int, str]:
    """JSON pointer of every list and dict in ``root``, by object id."""
    paths: dict[int, str] = {}
    stack: list[tuple[Json, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            paths[id(node)] = path
            stack += [(v, f"{path}/{_escape(str(k))}") for k, v in node.items() if isinstance(v, (dict, list))]
        elif isinstance(node, list):
            paths[id(node)] = path
            stack += [(v, f"{path}/{i}") for i, v in enumerate(node) if isinstance(v, (dict, list))]
    return paths


def shape(body: Json) -> tuple[tuple[str, str], ...]:
    """Short digests of each top-level member, and of each item of a top-level list."""
    if not isinstance(body, dict):
        return (("", hashlib.sha256(_encoder.encode(body)).hexdigest()[:16]),)
    out: list[tuple[str, str]] = []
    for key, value in body.items():
        path = "/" + _escape(str(key))
        items = enumerate(value) if isinstance(value, list) else ()
        out.append((path, hashlib.sha256(_encoder.encode(value)).hexdigest()[:16]))
        out += [(f"{path}/{i}", hashlib.sha256(_encoder.encode(item)).hexdigest()[:16]) for i, item in items]
    return tuple(out)


class Described(msgspec.Struct, frozen=True):
    projected_digest: str
    refs: tuple[RefRecord, ...]
    shape: tuple[tuple[str, str], ...]


def describe(fmt: WireFormat, raw: bytes, body: bytes, outcomes: tuple[Outcome, ...] | None) -> Described:
    """Digest, reference outcomes and shape of one projected call, from its inbound bytes, its
    upstream bytes and the outcomes the policy gave (None when nothing was decoded)."""
    try:
        skeleton = _decoder.decode(raw)
    except msgspec.DecodeError:
        return Described(sha256_id(body), (), (("", hashlib.sha256(raw).hexdigest()[:16]),))
    refs: tuple[RefRecord, ...] = ()
    digest = None
    if outcomes:
        paths = container_paths(skeleton)
        sites = fmt.find_refs(skeleton)
        refs = tuple(
            RefRecord(f"{paths.get(id(site.parent), '?')}/{_escape(str(site.index))}", site.ref.id,
                      "inlined" if isinstance(outcome, Resolved) else "placeholder",
                      None if isinstance(outcome, Resolved) else outcome.failure)
            for site, outcome in zip(sites, outcomes)
        )
        fmt.render(sites, outcomes, _digested)
        if any(isinstance(o, Resolved) for o in outcomes):  # never hash the megabytes of base64
            digest = sha256_id(_encoder.encode(skeleton))
    return Described(digest or sha256_id(body), refs, shape(skeleton))


async def append_record(app: AppState, session_id: str, data: RequestRecorded | ResponseRecorded) -> int:
    """Append one record (non-durably) after whatever the log holds now; returns its seq."""
    [event] = await app.log.append(session_id, None, [data], durable=False)
    cached = app.states.get(session_id)
    if cached is not None and cached.last_seq == event.seq - 1:
        app.states.put(session_id, fold([event], cached))
    return event.seq


def response_documents(body: bytes, content_type: str) -> Any:
    """A response body as JSON: the list of SSE ``data:`` documents, or the one document (text
    where it is not JSON)."""
    if "event-stream" in content_type:
        docs: list[Any] = []
        for line in body.splitlines():
            if line.startswith(b"data:"):
                try:
                    docs.append(_decoder.decode(line[5:].strip()))
                except msgspec.DecodeError:
                    docs.append(line[5:].strip().decode("utf-8", "replace"))
        return docs
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError:
        return body.decode("utf-8", "replace")


def usage_of(body: bytes, content_type: str) -> dict[str, Any] | None:
    """The token usage a response reports (OpenAI, Anthropic, Gemini; JSON or SSE), if any."""
    documents = response_documents(body, content_type)
    found: dict[str, Any] | None = None
    for doc in documents if "event-stream" in content_type else [documents]:
        if not isinstance(doc, dict):
            continue
        for holder in (doc, doc.get("message"), doc.get("response")):
            if isinstance(holder, dict):
                usage = holder.get("usage") or holder.get("usageMetadata")
                if isinstance(usage, dict):
                    found = {**(found or {}), **usage}
    return found


class Recorder:
    """The recording of one call in progress: its request seq and the response capture."""

    def __init__(self, app: AppState, request: web.Request, session_id: str, request_seq: int) -> None:
        self.app = app
        self.request = request
        self.session_id = session_id
        self.request_seq = request_seq
        full = app.config.record.mode == "full"
        self.capture = Capture(app.config.record.max_response_bytes if full else USAGE_SCAN_BYTES, self._done)
        self.full = full
        self.recorded = False

    async def forward(self, call: Awaitable[web.StreamResponse]) -> web.StreamResponse:
        """Run the relay; the response is recorded before its last byte reaches the client (so
        a client that has the whole answer finds it in the log), or here if it never completed."""
        try:
            response = await call
        except ProjectionistError as error:
            await self._record(None, error.code)
            raise
        except asyncio.CancelledError:
            if not self.recorded:  # the client left: record that in the background, then go
                self.recorded = True
                self.app.background(self._record(None, "CLIENT_DISCONNECTED"))
            raise
        if not self.recorded:
            await self._record(response.status, "INCOMPLETE")
        return response

    async def _done(self, status: int) -> None:
        self.recorded = True
        # shielded: a client that already has the whole answer may hang up while this runs
        await asyncio.shield(self.app.background(self._record(status, None)))

    async def _record(self, status: int | None, error_code: str | None) -> None:
        body = self.capture.body()
        latency = round((time.perf_counter() - self.request[STARTED]) * 1000, 3)
        blob = await self.app.store.put_blob(body) if self.full and status is not None else None
        data = ResponseRecorded(self.request[REQUEST_ID], self.request_seq, status, latency,
                                usage_of(body, self.capture.content_type) if status is not None else None,
                                error_code, blob, self.capture.truncated)
        try:
            await append_record(self.app, self.session_id, data)
        except ProjectionistError as error:  # the call itself succeeded: say so, do not fail it
            get_logger().warning("response_not_recorded", code=error.code, request_id=data.request_id)


async def record_request(
    request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str, raw: bytes, body: bytes,
    projection: Projection | None, session_id: str,
) -> Recorder:
    """Append the ``request/recorded`` event of this call (before the upstream call)."""
    app = request.app[APP]
    described = describe(fmt, raw, body, projection.outcomes if projection is not None else None)
    blob = await app.store.put_blob(raw) if app.config.record.mode == "full" else None
    data = RequestRecorded(
        request_id=request[REQUEST_ID],
        route=info(request)["route"],
        adapter=fmt.NAME,
        upstream=upstream.name,
        method=request.method,
        path=recorded_path(request, raw_path),
        log_seq=projection.state.last_seq if projection is not None else 0,
        inbound_digest=sha256_id(raw),
        projected_digest=described.projected_digest,
        refs=described.refs,
        shape=described.shape,
        inbound_blob=blob,
    )
    seq = await append_record(app, session_id, data)
    info(request)["recorded_seq"] = seq
    return Recorder(app, request, session_id, seq)
