"""Replay: rebuild the exact upstream request of a recorded call, check it, resend it (proxy layer).

The session log plus the content-addressed store define every upstream request byte for byte.
``rebuild`` folds the log up to the state the original call saw, runs the same projection and
rendering code on the recorded inbound body (its blob in ``full`` mode, or one the user supplies,
checked against the recorded digest), and compares the projected digest. A mismatch names the
first differing path: a reference whose outcome changed (a changed store), else the first member
of the body whose shape changed (a code change), else the first inlined image (its encoding).
Replay never appends to the log and never quarantines.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec
from multidict import CIMultiDict
from yarl import URL

from ...adapters.registry import ADAPTERS
from ...adapters.responses import documents
from ...policy.errors import AttachmentError, ProjectionistError, Code, Conflict, InvalidRequest, NotFound
from ...policy.events import (
    PRUNED,
    Event,
    RequestEvent,
    RequestRecorded,
    ResponseEvent,
    ResponseRecorded,
    answer,
    answers,
    type_of,
)
from ...policy.fold import fold
from ...policy.model import HttpRefs
from ...policy.ports import SessionLog
from ...policy.projection import Projection, ProjectionContext, project
from ..config import Config, UpstreamConfig
from ..inbound.bodies import inflate
from .body import Asked, build, inbound_digest
from .prepare import RequestImages, requested_model
from .describe import Described, of_raw, sha256_id
from ..upstream.identity import Identities
from ...adapters.redact import shorten
from ..stores.admission import image_facts
from ..stores.base import Store
from .relay import HOP_BY_HOP, upstream_errors
from .websocket_calls import ROUTE as WEBSOCKET, exchange
from ..upstream.target import open_transport
from ..upstream.transport import Transport
from ..upstream.urls import Base

_decoder: Final = msgspec.json.Decoder()


class Rebuilt(msgspec.Struct, omit_defaults=True):
    """The outcome of ``rebuild`` (``body`` is the rebuilt upstream body, when it could be built)."""

    session: str
    seq: int
    request: RequestRecorded
    inbound: str
    matches: bool
    projected_digest: str | None = None
    first_difference: str | None = None
    reason: str | None = None
    response: ResponseRecorded | None = None
    body: bytes | None = None

    def summary(self, show: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session": self.session, "seq": self.seq, "request_id": self.request.request_id,
            "adapter": self.request.adapter, "upstream": self.request.upstream,
            "method": self.request.method, "path": self.request.path, "inbound": self.inbound,
            "recorded_digest": self.request.projected_digest, "rebuilt_digest": self.projected_digest,
            "matches": self.matches, "first_difference": self.first_difference, "reason": self.reason,
            "refs": [msgspec.to_builtins(r) for r in self.request.refs],
            "recorded_response": msgspec.to_builtins(self.response) if self.response else None,
        }
        if show and self.body is not None:
            out["body"] = shorten(_decoder.decode(self.body))
        return out


def _pick(events: list[Event], seq: int | None, request_id: str | None = None
          ) -> tuple[RequestEvent, ResponseRecorded | None]:
    """The recorded request asked for (at ``seq``, with ``request_id``; the last one of those) and
    the answer recorded to it."""
    requests = _requests(events, seq, request_id)
    if not requests:
        raise _none_recorded(events, seq)
    event = requests[-1]
    return event, answer(event, answers(e for e in events if isinstance(e, ResponseEvent)))


def _requests(events: list[Event], seq: int | None, request_id: str | None) -> list[RequestEvent]:
    """The recorded requests at ``seq`` and with ``request_id`` (each when given), in log order;
    one with ``request_id`` that none has was never recorded (``NOT_RECORDED``)."""
    requests = [e for e in events if isinstance(e, RequestEvent)]
    if seq is not None:
        requests = [e for e in requests if e.seq == seq]
    if request_id is not None:
        requests = [e for e in requests if e.data.request_id == request_id]
        if not requests:  # records are evidence: one the log could not take is dropped, and said so
            raise NotFound(f"request {request_id[:40]!r} was not recorded in this session (recording off, or "
                           "the log could not take its record: see projectionist_records_dropped_total)",
                           code=Code.NOT_RECORDED)
    return requests


def _none_recorded(events: list[Event], seq: int | None) -> NotFound:
    """Why no recorded request is at ``seq`` (or in the session): retention pruned it, or there is none."""
    if seq is not None and any(e.seq == seq and type_of(e) == PRUNED for e in events):
        return NotFound(f"the call at seq {seq} was pruned by retention ([record] keep_days): only its seq, time "
                        "and type are kept", code=Code.NOT_RECORDED)
    where = f"at seq {seq}" if seq is not None else "in this session"
    return NotFound(f"no recorded request {where}", code=Code.NOT_RECORDED)


def locate(recorded: RequestRecorded, rebuilt: Described) -> str:
    """The first differing path between a recorded call and its reconstruction."""
    for old, new in zip(recorded.refs, rebuilt.refs):
        if old != new:
            return old.path
    if len(recorded.refs) != len(rebuilt.refs):
        longer = recorded.refs if len(recorded.refs) > len(rebuilt.refs) else rebuilt.refs
        return longer[min(len(recorded.refs), len(rebuilt.refs))].path
    old_shape, new_shape = dict(recorded.shape), dict(rebuilt.shape)
    for path, digest in recorded.shape:
        if new_shape.get(path) != digest:
            return path
    for path in new_shape:
        if path not in old_shape:
            return path
    inlined = [r.path for r in recorded.refs if r.outcome == "inlined"]
    return inlined[0] if inlined else ""


async def rebuild(log: SessionLog, store: Store, session: str, seq: int | None = None,
                  inbound: bytes | None = None, *, request_id: str | None = None, fit: bool = True) -> Rebuilt:
    """Rebuild the upstream body of the recorded call at ``seq``, or of the call with
    ``request_id`` (the ``x-projectionist-request-id`` its client saw); default: the last one.
    ``fit``: whether the proxy fitted the images clients inline (``[policy] fit_images``)."""
    events = await log.read(session)
    event, response = _pick(events, seq, request_id)
    record = event.data
    inbound, source = await _inbound(store, record, inbound)
    fmt = ADAPTERS.get(record.adapter)
    if fmt is None:
        raise InvalidRequest(f"unknown adapter {record.adapter!r}", code=Code.UNKNOWN_ADAPTER)
    identities = Identities(sniff=image_facts)
    # a body with images the client inlined is recorded by its spliced digest (their identities)
    if sha256_id(inbound) != record.inbound_digest and inbound_digest(fmt, inbound, identities) != record.inbound_digest:
        raise InvalidRequest("this is not the inbound body of the recorded call (digest differs)",
                             code=Code.INBOUND_MISMATCH)
    state = fold(e for e in events if e.seq <= record.log_seq)

    async def run(asked: Asked) -> Projection:
        # the log's pins decide which variants are sent: replay makes none (no image library involved)
        source = RequestImages(store, asked.inline, asked.load, asked.refs) if asked.inline else store
        return await project(asked.refs, ProjectionContext(
            store=source, log=None, session_id=None, sessionless="fail", state=state, upstream_format=fmt.FORMAT,
            profile=fmt.PROFILE, images=asked.images, inline=asked.inline, fit=fit, upstream=record.upstream,
            model=requested_model(fmt, record.path, asked.tree), request_bytes=asked.size, links=asked.links))

    base = Rebuilt(session, event.seq, record, source, matches=False, response=response)
    try:
        # the HTTP references the call had are the ones under the public URLs it recorded
        built = await build(fmt, inbound, run, describe=True, http=HttpRefs(record.public_urls),
                            identities=identities, url_images=True)
    except AttachmentError as error:
        path = next((r.path for r in record.refs if r.attachment_id == error.attachment_id), "")
        return msgspec.structs.replace(base, first_difference=path,
                                       reason=f"{error.code}: the store no longer holds a recorded image")
    return _compared(base, inbound, built.described, built.body)


async def _inbound(store: Store, record: RequestRecorded, given: bytes | None) -> tuple[bytes, str]:
    """The call's inbound body and where it came from: ``given`` (``"given"``), else the blob its
    record names (its id), which a call recorded in metadata mode has none of."""
    if given is not None:
        return given, "given"
    if record.inbound_blob is None:
        raise Conflict('this call was recorded in metadata mode, which keeps no bodies: pass its inbound body '
                       '(projectionist replay --body FILE), or set record.mode = "full" to replay the calls '
                       'recorded from then on', code=Code.REPLAY_NEEDS_BODY)
    inbound = await store.get_blob(record.inbound_blob)
    if inbound is None:
        raise NotFound(f"the recorded inbound body {record.inbound_blob[:15]} is gone", code=Code.BLOB_NOT_FOUND)
    return inbound, record.inbound_blob


def _compared(base: Rebuilt, inbound: bytes, described: Described | None, body: bytes) -> Rebuilt:
    """``base`` with the rebuilt ``body``, its digest and whether it is the recorded one; when not,
    the first path that differs (``locate``)."""
    assert described is not None
    record = base.request
    matches = described.projected_digest == record.projected_digest
    if not record.shape and all(r.outcome == "client" for r in record.refs) \
            and record.projected_digest == record.inbound_digest:
        # sent unchanged, recorded without a shape: its upstream body was this very inbound body
        record = msgspec.structs.replace(record, shape=of_raw(inbound).shape)
    return msgspec.structs.replace(
        base, matches=matches, projected_digest=described.projected_digest, body=body,
        first_difference=None if matches else locate(record, described),
        reason=None if matches else "the reconstruction differs from the recorded call")


async def send(rebuilt: Rebuilt, config: Config, *, upstream_url: str | None = None,
               headers: dict[str, str] | None = None, transport: Transport | None = None) -> tuple[int, str, bytes]:
    """Send the rebuilt body to its upstream (or ``upstream_url``); returns status, content
    type and the whole body (an SSE stream concatenated). The upstream's configured key is sent
    only to that upstream's own URL, never to an override; ``headers`` can carry a key there.

    It goes through ``transport`` (the running app's: the very one live calls use), or one
    opened as the upstream's configuration says and closed after; with the headers the live call
    went with (its record's, credentials left out), then the key, then ``headers``. So the
    method, path, headers and body on the wire are the live call's, credentials aside. A call
    made on a WebSocket (route ``websocket``) goes on a WebSocket of its own, which the same
    transport opens, its handshake with those headers: its events come back as its record keeps
    them (``data:`` lines)."""
    if rebuilt.body is None:
        raise Conflict(f"nothing to send: {rebuilt.reason}", code=Code.REPLAY_NOT_REBUILT)
    record = rebuilt.request
    upstream = config.upstreams.get(record.upstream)
    configured = upstream.url if upstream else ""
    url = _target(record, upstream_url or configured)
    # The configured key goes only to the configured upstream: an override URL gets no key.
    own = upstream is not None and (not upstream_url or upstream_url.rstrip("/") == configured.rstrip("/"))
    outgoing = _outgoing(record, config, own, headers or {}, url, rebuilt.body)
    settings = upstream or UpstreamConfig(format=ADAPTERS[record.adapter].FORMAT, url=upstream_url or configured)
    opened = None
    if transport is None:
        transport = opened = open_transport(settings.transport, settings.connect_timeout, settings.read_timeout, 1)
    try:
        if record.route == WEBSOCKET:  # its message went on a WebSocket: it goes on one again
            return await exchange(transport, url, outgoing, rebuilt.body, read_timeout=settings.read_timeout,
                                  max_message=config.server.websocket_max_message)
        return await _answered(transport, record.method, url, outgoing, rebuilt.body, config)
    finally:
        if opened is not None:
            await opened.aclose()


def _target(record: RequestRecorded, base: str) -> URL:
    """The URL the recorded call goes to under ``base`` (its upstream's, or the one asked for)."""
    if not base:
        raise InvalidRequest(f"no upstream named {record.upstream!r}: pass --upstream URL", code=Code.UNKNOWN_UPSTREAM)
    try:
        parsed = Base(base)
    except InvalidRequest as error:
        raise InvalidRequest(f"upstream URL: {error.message}", code=Code.INVALID_REQUEST) from None
    path, _, query = record.path.partition("?")
    return parsed.join(path, query)


def _outgoing(record: RequestRecorded, config: Config, own: bool, headers: dict[str, str], url: URL,
              body: bytes) -> CIMultiDict[str]:
    """The headers the call goes with: its record's, then the configured key when it goes to its
    ``own`` upstream (as its format signs ``body`` for ``url``), then the ``headers`` a user asked
    for (``check_headers``)."""
    fmt = ADAPTERS[record.adapter]
    outgoing: CIMultiDict[str] = CIMultiDict(record.headers or {"Content-Type": "application/json"})
    key = config.upstream_key(record.upstream) if own else ""
    if key:
        for name, value in fmt.sign(record.method, str(url), outgoing, body, key).items():
            outgoing[name] = value
    for name, value in check_headers(headers).items():
        outgoing[name] = value
    return outgoing


async def _answered(transport: Transport, method: str, url: URL, outgoing: CIMultiDict[str], body: bytes,
                    config: Config) -> tuple[int, str, bytes]:
    """One HTTP call through ``transport``: the answer's status, content type and whole body (as
    its client read it: ``_decoded``)."""
    with upstream_errors():
        answer = await transport.send(method, url, headers=outgoing, body=body)
        try:
            data = await answer.read()
            encoding = answer.headers.get("Content-Encoding", "").strip().lower()
            return answer.status, answer.headers.get("Content-Type", ""), _decoded(data, encoding, config)
        finally:
            answer.release()


def _decoded(data: bytes, encoding: str, config: Config) -> bytes:
    """An answer's body as its client read it: a gzip or deflate coding the live call asked for
    (its recorded Accept-Encoding) is undone, so the report and the diff read the document; a
    coding the proxy cannot read, or a body that does not decode, stays as it came."""
    if not encoding or encoding == "identity":
        return data
    try:
        return inflate(data, encoding, config.record.max_response_bytes)
    except ProjectionistError:
        return data


_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_UNSAFE_VALUE: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def check_headers(headers: dict[str, str]) -> dict[str, str]:
    """Headers a user asked replay to send: names are HTTP tokens, values hold no line breaks or
    control characters, and the ones the client computes (length, framing) are not theirs to set."""
    for name, value in headers.items():
        if _TOKEN.fullmatch(name) is None or _UNSAFE_VALUE.search(value):
            raise InvalidRequest(f"header {name[:40]!r} is not a valid HTTP header", code=Code.INVALID_REQUEST)
        if name.lower() in HOP_BY_HOP:
            raise InvalidRequest(f"header {name!r} is set by the connection, not by replay", code=Code.INVALID_REQUEST)
    return headers


def first_difference(old: Any, new: Any, volatile: frozenset[str], path: str = "") -> str | None:
    """The first JSON path where ``old`` and ``new`` differ, ignoring ``volatile`` members."""
    if isinstance(old, dict) and isinstance(new, dict):
        return _first_in_members(old, new, volatile, path)
    if isinstance(old, list) and isinstance(new, list):
        return _first_in_items(old, new, volatile, path)
    return None if old == new else (path or "/")


def _first_in_members(old: dict[str, Any], new: dict[str, Any], volatile: frozenset[str], path: str) -> str | None:
    """``first_difference`` of two objects: their members in ``old``'s order, then ``new``'s own;
    one that only one of them has is the difference."""
    for key in [*old, *(k for k in new if k not in old)]:
        if key in volatile:
            continue
        if key not in old or key not in new:
            return f"{path}/{key}"
        found = first_difference(old[key], new[key], volatile, f"{path}/{key}")
        if found is not None:
            return found
    return None


def _first_in_items(old: list[Any], new: list[Any], volatile: frozenset[str], path: str) -> str | None:
    """``first_difference`` of two arrays: item by item, then the first item only the longer has."""
    for i, (a, b) in enumerate(zip(old, new)):
        found = first_difference(a, b, volatile, f"{path}/{i}")
        if found is not None:
            return found
    return None if len(old) == len(new) else f"{path}/{min(len(old), len(new))}"


def diff(recorded: bytes | None, new: bytes, content_type: str, volatile: frozenset[str]) -> dict[str, Any]:
    """Compare a recorded response body with a new one (JSON paths; the format's ids and clocks
    ignored)."""
    if recorded is None:
        return {"compared": False, "reason": "no recorded response body (record.mode = 'full' keeps it)"}
    where = first_difference(documents(recorded, content_type), documents(new, content_type), volatile)
    return {"compared": True, "identical": where is None, "first_difference": where,
            "recorded_digest": sha256_id(recorded), "new_digest": sha256_id(new)}


async def recorded_response(store: Store, rebuilt: Rebuilt) -> bytes | None:
    """The recorded response body of the call (``full`` mode), if kept."""
    blob = rebuilt.response.response_blob if rebuilt.response else None
    return await store.get_blob(blob) if blob else None


def _as_read(data: bytes | None, config: Config) -> bytes | None:
    """A recorded answer as its client read it: the relay records bytes as they came, so a gzip
    body (its magic bytes say so) is undone, as the new answer's coding is (``_decoded``)."""
    return _decoded(data, "gzip", config) if data is not None and data[:2] == b"\x1f\x8b" else data


async def send_and_compare(rebuilt: Rebuilt, config: Config, store: Store, *, upstream_url: str | None,
                           headers: dict[str, str], compare: bool,
                           transport: Transport | None = None) -> dict[str, Any]:
    """Resend a rebuilt call: the ``sent`` entry of a replay report, and with ``compare`` the
    ``diff`` against the recorded answer."""
    status, content_type, answer = await send(rebuilt, config, upstream_url=upstream_url, headers=headers,
                                              transport=transport)
    out: dict[str, Any] = {"sent": {"status": status, "content_type": content_type, "bytes": len(answer),
                                    "body": answer.decode("utf-8", "replace")[:4000]}}
    if compare:
        out["diff"] = diff(_as_read(await recorded_response(store, rebuilt), config), answer, content_type,
                           ADAPTERS[rebuilt.request.adapter].VOLATILE)
    return out
