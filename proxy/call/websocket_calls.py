"""The calls of a Responses WebSocket, each ``response.create`` a projected call (proxy layer, call
sublayer).

A ``response.create`` carries the same fields as the body of ``POST /v1/responses``, so it goes
through the same stages as that body: ``read`` (its session, from the upgrade's headers, its path
prefix or the message itself), ``prepare`` (the policy's projection, the upstream message, its
recorder and its re-send screen). The upstream's events for it are watched like an SSE answer:
recorded as ``data:`` lines (so ``documents``, usage and replay's diff read them as they read a
stream), and an ``error`` event that comes before any other event of the call goes to its screen
first: when it refuses an image, the refusal is recorded and the message built again and sent
once more on the same socket, and the client never sees that error. Each call has a context, a
request id, a log line and, with a session, a record of its own (route ``websocket``, which
``replay --send`` sends over a WebSocket again).

Calls are told apart by their ``stream_id`` (the WebSocket lane; none is one lane). A new
``response.create`` on a lane whose call is still open supersedes it (recorded as a call its client
left, ``CLIENT_DISCONNECTED``); a lane's events then count toward the new call, which is never
screened once an event it did not produce could have reached the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from aiohttp import WSMsgType, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from ...adapters import openai_responses
from ...policy.errors import Code, InternalError, InvalidRequest, ProjectionistError, UpstreamError
from ..inbound.budget import MemoryBusy, hold
from ..inbound.context import Context, Timing
from ..observe.logger import get_logger, ms, request_line, request_lines
from ..upstream.transport import Transport
from .call import Call
from .prepare import Outgoing, Prepared, outgoing, prepare
from .read import Inbound, continued, inbound_of
from .record import Meter, Recorder
from .relay import upstream_errors
from .send import in_flight, report_usage

#: The route of a relayed socket and of each call on it (a record with it was sent over a WebSocket).
ROUTE: Final = "websocket"
#: The events that end a response.
TERMINAL: Final = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
#: How an event opens as OpenAI writes them, and the types of those that are read (``Calls.passing``).
_TYPED: Final = b'{"type":"'
_NOT_PASSING: Final = frozenset(t.encode() for t in TERMINAL)
#: The content type a WebSocket call's events are recorded under, one ``data:`` line each.
EVENTS: Final = "text/event-stream"
#: The calls one socket may have open at once (one per lane: Codex and the SDK use one); a
#: ``response.create`` past them is an error event (each open call keeps its message for a re-send).
MAX_OPEN: Final = 32
#: The status of an ``error`` event that names none: a refused request, as OpenAI's are.
ERROR_STATUS: Final = 400

Send = Callable[[bytes], Awaitable[None]]


class _Head(msgspec.Struct):
    """What the relay reads of a message: its type, its lane and, for an error, its status."""

    type: Any = None
    stream_id: Any = None
    status: Any = None


_head: Final = msgspec.json.Decoder(_Head)
_encoder: Final = msgspec.json.Encoder()


def head(data: bytes) -> _Head | None:
    """``data``'s head, or None when it is no JSON object."""
    try:
        return _head.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None


#: How a ``response.create`` opens, as the SDK and Codex write it (compact JSON, ``type`` first):
#: such a message is a call without its megabytes being parsed here (``read`` and ``prepare``
#: decode what they must; one that is no JSON after all is the projection's ``INVALID_JSON``, or,
#: when nothing in it is to change, the upstream's to say, as for an HTTP body).
_CREATE: Final = b'{"type":"response.create",'


def lane_of(data: bytes, *trees: Any) -> str | None:
    """A ``response.create``'s lane: from the first of ``trees`` (what the stages decoded of it)
    that is an object, else from the message itself."""
    for tree in trees:
        if isinstance(tree, dict):
            value = tree.get("stream_id")
            return value if isinstance(value, str) else None
    found = head(data)
    return _lane(found) if found is not None else None


def _lane(found: _Head) -> str | None:
    return found.stream_id if isinstance(found.stream_id, str) else None


def error_event(code: str, message: str, status: int, stream_id: str | None = None) -> bytes:
    """An ``error`` event as the Responses WebSocket sends one (the SDK's ``ResponseWsError``)."""
    event: dict[str, Any] = {"type": "error", "status": status,
                             "error": openai_responses.error_body(code, message, status)["error"]}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return _encoder.encode(event)


def as_line(data: bytes) -> bytes:
    """One event as the ``data:`` line it is recorded as (a JSON line break is whitespace)."""
    if b"\n" in data or b"\r" in data:
        data = data.replace(b"\r", b" ").replace(b"\n", b" ")
    return b"data: " + data + b"\n\n"


class Turn:
    """One ``response.create``: its call, what was prepared for it, and how it is going."""

    def __init__(self, call: Call, inbound: Inbound, prepared: Prepared, socket_id: str) -> None:
        self.call, self.inbound, self.prepared, self.socket_id = call, inbound, prepared, socket_id
        self.recorder: Recorder | None = prepared.recorder
        self.meter = Meter() if self.recorder is None else None
        #: Whether every event is kept (``full`` recording); else only the ones that end the call
        #: are watched, which carry what the call reports (its usage).
        self.every = self.recorder is not None and self.recorder.full
        self.screen = prepared.screen
        self.events = 0
        self.sent = time.perf_counter()
        #: Its images, carried while it is open (``send.in_flight``), once started.
        self.carrying: contextlib.AbstractContextManager[Any] | None = None
        self.ended = False
        #: When its last event went to the client (its end may come a little later: ``Calls._ending``).
        self.finished: float | None = None

    @property
    def watched(self) -> Meter:
        watched = self.recorder or self.meter
        assert watched is not None
        return watched

    def start(self) -> None:
        """Its message is about to go upstream: its images count as carried while it is open."""
        self.carrying = in_flight(self.call, self.inbound, self.prepared)
        self.carrying.__enter__()
        self.watched.begin(EVENTS)

    def screened(self) -> bool:
        """Whether an ``error`` event goes to the screen: before any other event, once."""
        return self.events == 0 and self.screen is not None and not self.screen.used

    async def rescreen(self, data: bytes, status: int) -> bytes | None:
        """The screen's answer to a refusal: the message built again (and this call now the
        re-sent one's), or None to let the error through."""
        assert self.screen is not None
        again = await self.screen(status, "application/json", data)
        if again is not None:
            self.recorder = self.screen.recorder
            self.meter = Meter() if self.recorder is None else None
            self.every = self.recorder is not None and self.recorder.full
            self.sent = time.perf_counter()
            self.watched.begin(EVENTS)
        return again

    def event(self, data: bytes, found: _Head) -> bool:
        """One event of this call, before it goes to the client; True when it ends the call
        (then ``complete`` before the client has it)."""
        if self.events == 0:
            timing = self.call.timing
            timing.headers_s = time.perf_counter() - self.sent
            timing.status = status_of(found) if found.type == "error" else 200
            self.call.services.metrics.upstream_answered(self.call.upstream.name, timing.headers_s)
        self.events += 1
        ends = found.type in TERMINAL
        if ends or self.every:
            self.watched.chunk(as_line(data))
        return ends

    async def complete(self) -> None:
        """The call's last event arrived: its body is complete (the client still lacks it)."""
        with contextlib.suppress(Exception):  # an observer never fails the relay (as ``relay._complete``)
            self.watched.body_complete(self.call.timing.status or 200)

    def end(self, *, error: str | None = None, left: bool = False) -> None:
        """The call is over: complete (its terminal event relayed), broken off with ``error``, or
        because the client ``left``. Its record, usage, counters and log line."""
        if self.ended:
            return
        self.ended = True
        call, ctx, timing = self.call, self.call.ctx, self.call.timing
        if self.carrying is not None:
            self.carrying.__exit__(None, None, None)
        if ctx.held is not None:  # its message and the body built from it
            ctx.held.release()
        now = self.finished if self.finished is not None else time.perf_counter()
        timing.upstream_s = now - self.sent
        status = timing.status if error is None or self.events else None
        ctx.fields.update(upstream_status=timing.status, upstream_ms=ms(timing.upstream_s))
        if self.events:
            report_usage(call, self.watched)
        if self.recorder is not None:
            if left:
                self.recorder.cancelled()
            elif status is None:
                self.recorder.failed(error or Code.UPSTREAM_UNAVAILABLE)
            else:
                self.recorder.finished(status)  # a call broken off after its first event: INCOMPLETE
        if error is not None:
            ctx.fields["error_code"] = error
        answered(call, self.socket_id, status if not left else "cancelled", now)


def status_of(found: _Head) -> int:
    """An ``error`` event's status (its own, when it is an error status)."""
    status = found.status
    return status if isinstance(status, int) and 400 <= status <= 599 else ERROR_STATUS


def answered(call: Call, socket_id: str, status: int | str | None, at: float | None = None) -> None:
    """A call's count and log line (the socket's own line is the upgrade's, at its end), for a call
    that ended ``at`` (a ``perf_counter`` reading; now unless given)."""
    ctx = call.ctx
    call.services.metrics.answered(ROUTE, status if status is not None else "failed", call.upstream.name)
    if request_lines():
        request_line({"method": "WS", "path": call.raw_path, "route": ROUTE, "request_id": ctx.request_id,
                      "socket": socket_id, "status": status,
                      "duration_ms": ms((at or time.perf_counter()) - ctx.started), **ctx.fields})


class Calls:
    """The projected calls of one Responses WebSocket, by lane (see the module's docstring).
    ``to_upstream`` and ``to_client`` send one frame each way and return once it is sent."""

    def __init__(self, socket: Call, headers: CIMultiDictProxy[str], to_upstream: Send, to_client: Send) -> None:
        self.socket = socket
        #: The upgrade's headers without the handshake's own: what each call's request carries.
        self.headers = headers
        self.to_upstream = to_upstream
        self.to_client = to_client
        self.lanes: dict[str | None, Turn] = {}
        #: The completed calls whose end is due when the loop comes round (``_ending``).
        self._ends: dict[Turn, asyncio.Handle] = {}
        #: The upgrade's request, cloned once: each message in turn is its body (``_call``).
        self._request: web.Request | None = None
        #: What each message's call goes with and records of its headers (the same for every message).
        self._sending: Outgoing | None = None

    @property
    def open(self) -> bool:
        return bool(self.lanes)

    async def from_client(self, data: bytes) -> None:
        """A text message from the client: a ``response.create`` becomes a call; another message
        goes as it came; one that is no JSON object is answered with an error event."""
        if data.startswith(_CREATE):
            await self._create(data, None)
            return
        found = head(data)
        if found is None:
            code = Code.INVALID_JSON if _not_json(data) else Code.INVALID_MESSAGE
            await self.refuse(InvalidRequest("a message must be one JSON object in a text frame", code=code), None)
        elif found.type == "response.create":
            await self._create(data, _lane(found))
        else:
            try:
                held = self.socket.services.budget.take(len(data), "message")
            except MemoryBusy as error:
                await self.refuse(error, _lane(found))
                return
            try:
                await self.to_upstream(data)
            finally:
                held.release()

    async def _create(self, data: bytes, lane: str | None) -> None:
        """A ``response.create`` (``lane``: its lane when it was parsed already): read, prepared,
        sent. What the proxy refuses of it is an error event on its lane."""
        call = self._call()
        try:
            hold(call.ctx, call.services.budget, len(data), "message")  # kept until the call ends (a re-send)
            inbound = inbound_of(call, data)
            if inbound.links:
                inbound = await continued(call, inbound)
            if self._sending is None:
                self._sending = outgoing(call, recorded=True)
            prepared = await prepare(call, inbound, sending=self._sending, probing=False)
        except ProjectionistError as error:
            await self.refuse(error, lane or lane_of(data), call)
            return
        except Exception:  # a bug: this call fails in the protocol's own shape, the socket goes on
            get_logger().exception("unhandled_error", request_id=call.ctx.request_id, route=ROUTE)
            await self.refuse(InternalError("internal error; see the proxy log"), lane or lane_of(data), call)
            return
        except BaseException:  # cancelled (the socket ended while it was prepared): no turn holds its bytes
            if call.ctx.held is not None:
                call.ctx.held.release()
            raise
        if lane is None:
            lane = lane_of(data, prepared.built.tree, inbound.read[1] if inbound.read is not None else None)
        if lane not in self.lanes and len(self.lanes) >= MAX_OPEN:  # each open call holds its message
            await self.refuse(ProjectionistError(f"{MAX_OPEN} responses are in flight on this socket already",
                                                 code=Code.TOO_MANY_IN_FLIGHT), lane, call)
            return
        superseded = self.lanes.pop(lane, None)
        if superseded is not None:  # the client moved on: as if it had left that call
            superseded.end(left=True)
        turn = self.lanes[lane] = Turn(call, inbound, prepared, self.socket.ctx.request_id)
        turn.start()
        await self.to_upstream(prepared.built.body)

    def _end(self, turn: Turn, *, left: bool = False) -> None:
        self._ends.pop(turn, None)
        try:
            turn.end(left=left)
        except Exception:  # a bug in an observer: logged, the socket goes on (as ``Turn.complete``)
            get_logger().exception("websocket_call_end_failed", request_id=turn.call.ctx.request_id)

    async def from_upstream(self, data: bytes) -> None:
        """A text event from the upstream: to the client, after the call it belongs to saw it
        (a refusal its screen takes never reaches the client). An event in the middle of the
        one call open on the socket's only lane is one the socket passes on itself, unparsed
        (``passing``), without this coroutine; any other comes here."""
        found = head(data)
        turn = self.lanes.get(_lane(found)) if found is not None else None
        if turn is None or found is None:
            await self.to_client(data)
            return
        if found.type == "error" and turn.screened():
            again = await turn.rescreen(data, status_of(found))
            if again is not None:
                await self.to_upstream(again)
                return
        if not turn.event(data, found):
            await self.to_client(data)
            return
        self.lanes.pop(_lane(found), None)
        try:
            await turn.complete()
            await self.to_client(data)
        except BaseException:  # its client never had its last event (gone, stalled, cancelled): it left
            self._end(turn, left=True)
            raise
        self._ending(turn)

    def _ending(self, turn: Turn) -> None:
        """End a completed call when the loop comes round (its record, usage and log line need
        not hold up the next message: the client has its last event); the socket's ``close``
        ends those still due first. A callback, not a task: a task a turn cost the loop more than
        the end itself."""
        turn.finished = time.perf_counter()
        self._ends[turn] = asyncio.get_running_loop().call_soon(self._end, turn)

    def passing(self, data: bytes) -> Turn | None:
        """The call an event belongs to when it is one that needs no reading: the only lane is
        the one without a ``stream_id``, its call has had its first event and keeps only the
        ones that end it, and the event, written as OpenAI writes events (``{"type":"...`` first),
        is of a type that neither ends a call nor is an error, and names no lane."""
        turn = self.lanes.get(None) if len(self.lanes) == 1 else None
        if turn is None or not turn.events or turn.every or not data.startswith(_TYPED):
            return None
        end = data.find(b'"', len(_TYPED))
        if end < 0 or data[len(_TYPED):end] in _NOT_PASSING or b'"stream_id"' in data:
            return None
        return turn

    async def refuse(self, error: ProjectionistError, lane: str | None, call: Call | None = None) -> None:
        """An error event for a message the proxy answers itself (its call, if it became one)."""
        if call is not None:
            call.ctx.fields["error_code"] = error.code
            answered(call, self.socket.ctx.request_id, error.status)
            if call.ctx.held is not None:
                call.ctx.held.release()
        if error.public_message != error.message:
            get_logger().warning("error_detail", code=error.code, detail=error.message,
                                 request_id=call.ctx.request_id if call is not None else self.socket.ctx.request_id)
        await self.to_client(error_event(error.code, error.public_message, error.status, lane))

    async def close(self, error: ProjectionistError | None, *, left: bool = False) -> None:
        """The socket is ending: each open call gets ``error`` as an event (when the client is
        still there) and ends with it."""
        turns, self.lanes = list(self.lanes.items()), {}
        for done, handle in list(self._ends.items()):  # the calls that completed: ended before the socket is
            handle.cancel()
            self._end(done)
        for lane, turn in turns:
            if error is not None and not left:
                with contextlib.suppress(ConnectionError, TimeoutError):
                    await self.to_client(error_event(error.code, error.public_message, error.status, lane))
            turn.end(error=error.code if error is not None else Code.UPSTREAM_UNAVAILABLE, left=left)

    def _call(self) -> Call:
        """A message's own call: a context and request id of its own (its stages read it from the
        call), on the upgrade's request cloned once without the handshake's headers. The message
        itself is the call's body (``read.inbound_of``)."""
        socket = self.socket
        ctx = Context(ROUTE)
        ctx.tenant, ctx.fmt, ctx.path_session = socket.ctx.tenant, openai_responses, socket.ctx.path_session
        ctx.fields["upstream"] = socket.upstream.name
        if self._request is None:
            self._request = socket.request.clone(headers=self.headers)
        return Call(self._request, socket.services, ctx, openai_responses, socket.upstream, socket.raw_path,
                    socket.path, True, Timing(ctx.started))


def _not_json(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return True
    return False


async def exchange(transport: Transport, url: URL, headers: CIMultiDict[str], message: bytes, *,
                   read_timeout: float, max_message: int) -> tuple[int, str, bytes]:
    """Send one recorded call's message on a WebSocket of its own (replay), opened by
    ``transport``: its status (200, or the ``error`` event's), content type and events, as the
    call's record keeps them. The upstream may be silent for ``read_timeout`` between two events."""
    with upstream_errors():
        async with transport.websocket(url, headers, (), handshake_timeout=read_timeout,
                                       max_message=max_message) as leg:
            try:
                await leg.send_frame(message, WSMsgType.TEXT)
            except ConnectionError:
                raise UpstreamError("the upstream closed the WebSocket before the message was sent") from None
            lines: list[bytes] = []
            status: int | None = None
            while True:
                async with asyncio.timeout(read_timeout):
                    msg = await leg.receive()
                if msg.type is not WSMsgType.TEXT:
                    raise UpstreamError("the upstream closed the WebSocket before the response completed")
                found = head(msg.data) or _Head()
                lines.append(as_line(msg.data))
                if status is None:
                    status = status_of(found) if found.type == "error" else 200
                if found.type in TERMINAL:
                    return status, EVENTS, b"".join(lines)
