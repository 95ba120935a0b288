"""The WebSocket relay: a client's socket on a route its provider serves over WebSocket, relayed
frame by frame to the configured upstream (proxy layer, call sublayer).

The routes with one are the ones the upstream's format declares (``adapters.facts.Socket``). Two
have one, on OpenAI-format upstreams: the Responses WebSocket mode (``/v1/responses``),
where each ``response.create`` is a projected call (``websocket_calls``), and Realtime
(``/v1/realtime``), relayed unchanged. The trust rules are HTTP's: the edge checked the client's
token at the upgrade; the upstream leg goes to the configured base plus the checked path, with
the headers ``outgoing_headers`` makes (the configured key instead of the client's, none of the
proxy's own) and the subprotocols the client offered minus any credential they carry
(Realtime's ``openai-insecure-api-key.*`` when the upstream has a key, anything holding a proxy
token). The upstream leg is opened first, by the upstream's transport (``Transport.websocket``,
the one its HTTP calls go through): a refusal of the upgrade (``UPGRADE_REFUSED``), a
connection that fails, or a 101 that does not come within the upstream's ``connect_timeout``
(``UPSTREAM_TIMEOUT``: the handshake is part of connecting) is an HTTP error in the route's
format, before the client's 101.

Then two pumps, one each way, each reading one frame, sending it and awaiting the send before it
reads the next, so neither side is ever buffered beyond one message and aiohttp's own queue: a
slow reader holds its writer back through TCP. A message is at most ``[server]
websocket_max_message`` bytes (a bigger one closes its leg with 1009, and the relay closes the
other), and a client's message is held of the proxy's memory budget while it is relayed (a
``response.create``: until its call ends); one past the budget closes a Realtime socket with 1013
(try again later) and is an ``error`` event ``MEMORY_BUSY`` on a Responses one; a client that leaves one frame unread for ``write_timeout`` is closed, and the error
events a socket that ends owes its open calls get ``write_timeout`` in all. The socket is
closed when no message passes for ``websocket_idle_timeout`` (``read_timeout`` while a response
is in flight) and after ``websocket_timeout`` in all. When the upstream goes away during a
response, the client gets an ``error`` event for it, then a close (1014, bad gateway).

The frames a response streams arrive in bursts (a dozen events in one TCP read), and aiohttp
writes each frame the relay sends on its own. The client's connection gathers a burst instead
(``Gather``, between aiohttp's frame writer and the connection): what is written in one turn of
the event loop goes out in one write when the loop comes round, so a streamed turn costs the relay
a few system calls, not one per event, and its client a few segments. Nothing waits for it: a
call's first and last events, which its client waits for, go out at once (``flush``; with sixteen
busy sockets, the loop coming round took long enough to cost a tenth of the turns), and what is
gathered never exceeds ``GATHER_BYTES``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.http_websocket import WSMessageNoDecodeText
from multidict import CIMultiDict, CIMultiDictProxy, MultiMapping

from ...adapters import openai_responses
from ...adapters.registry import FORMATS
from ...policy.errors import Code, InvalidRequest, ProjectionistError, UpstreamError
from ..inbound.budget import MemoryBusy
from ..observe.logger import get_logger
from ..upstream.target import Upstream
from ..upstream.transport import ClientError, Refused, UpstreamSocket
from .call import Call
from .outgoing import Withheld, naming, outgoing_headers, target_url
from .relay import client_error
from .websocket_calls import ROUTE, Calls

#: Upstream statuses a refused upgrade passes on (a client acts on them); any other is a 502.
PASSED_ON: Final = frozenset({401, 403, 404, 426, 429})
#: The subprotocol prefix Realtime's browser clients carry their API key in.
KEY_PROTOCOL: Final = "openai-insecure-api-key."
#: Close codes a relay may not send as they came (reserved: no status, abnormal closure, TLS).
_UNSENDABLE: Final = frozenset({1005, 1006, 1015})


def serves(upstream_format: str, path: str) -> str | None:
    """The kind of WebSocket a path of ``upstream_format`` has (``responses``, ``realtime``), if any."""
    facts = FORMATS.get(upstream_format)
    for socket in facts.sockets if facts is not None else ():
        if socket.path.fullmatch(path):
            return socket.kind
    return None


def handshake_headers(incoming: MultiMapping[str], call: Call) -> CIMultiDict[str]:
    """The upstream handshake's headers: ``outgoing_headers``, minus the client's handshake (its
    key, version, extensions, subprotocols: the upstream leg has its own)."""
    headers = outgoing_headers(incoming, call.fmt, call.upstream, call.services.guard)
    for name in [n for n in headers if n.lower().startswith("sec-websocket-")]:
        headers.popall(name, None)
    return headers


def offered(incoming: MultiMapping[str], upstream: Upstream, withheld: Withheld) -> list[str]:
    """The subprotocols the client offered, minus every one that carries a credential the upstream
    must not get: one holding a proxy token, and a key the configured one replaces."""
    found = [p.strip() for value in incoming.getall("Sec-WebSocket-Protocol", ()) for p in value.split(",")]
    return [p for p in found if p and not withheld.holds_own(p)
            and not (upstream.api_key and p.lower().startswith(KEY_PROTOCOL))]


def _message_headers(incoming: MultiMapping[str]) -> CIMultiDictProxy[str]:
    """The upgrade's headers as each call of the socket carries them: no handshake, no body framing."""
    return CIMultiDictProxy(CIMultiDict((k, v) for k, v in incoming.items()
                                        if not k.lower().startswith("sec-websocket-")
                                        and k.lower() not in ("content-encoding", "content-length")))


async def relay(call: Call) -> web.StreamResponse:
    """Relay ``call``'s socket (an upgrade on a route ``serves`` names) until either side ends it."""
    request, services, upstream = call.request, call.services, call.upstream
    kind = serves(upstream.format, unquote(call.raw_path))
    if kind is None:
        raise InvalidRequest("this route has no WebSocket; send the call without Upgrade",
                             code=Code.UPGRADE_NOT_SUPPORTED)
    call.ctx.route = ROUTE
    if kind == "responses":
        call.fmt = openai_responses
    if not web.WebSocketResponse().can_prepare(request).ok:
        raise InvalidRequest("not a valid WebSocket handshake (RFC 6455 §4.2.1)", code=Code.INVALID_REQUEST)
    server = services.config.server
    url = target_url(call.raw_path, request.rel_url.raw_query_string, call.fmt, upstream, services.guard)
    async with contextlib.AsyncExitStack() as stack:
        try:
            leg = await stack.enter_async_context(upstream.session.websocket(
                url, handshake_headers(request.headers, call), offered(request.headers, upstream, services.guard),
                handshake_timeout=upstream.connect_timeout, max_message=server.websocket_max_message,
                heartbeat=server.websocket_heartbeat))
        except Refused as refused:
            status = refused.status if refused.status in PASSED_ON else 502
            raise naming(UpstreamError(str(refused), code=Code.UPGRADE_REFUSED, status=status), upstream) from None
        except (ClientError, TimeoutError) as exc:
            raise naming(client_error(exc) or UpstreamError("upstream unreachable"), upstream) from None
        client = web.WebSocketResponse(
            protocols=(leg.protocol,) if leg.protocol else (), autoping=True, heartbeat=server.websocket_heartbeat,
            max_msg_size=server.websocket_max_message, compress=False, decode_text=False)
        await client.prepare(request)
        await Socket(call, client, leg, kind == "responses").run()
        return client
    raise AssertionError("unreachable")  # an AsyncExitStack never swallows what its block raised


@dataclass(frozen=True, slots=True)
class _End:
    """How a socket ended: the close each leg gets (None: it is closed already), why (for the log
    line), and the error an open call is told of."""

    why: str
    to_client: int | None = WSCloseCode.OK
    to_upstream: int | None = WSCloseCode.OK
    reason: bytes = b""
    error: ProjectionistError | None = None


#: What ``Gather`` holds back at most before it writes (a bigger frame goes at once, and with it what
#: was held): beyond it, the connection's own buffer and its back-pressure take over.
GATHER_BYTES: Final = 64 * 1024
#: The opcode of a close frame (RFC 6455 §5.5.1), the low bits of a frame's first byte.
_CLOSE: Final = 0x8
#: The longest write that can be a whole close frame: its 125-byte payload and a 4-byte header.
_CLOSE_MAX: Final = 129


class Gather:
    """The client connection as the socket's frame writer writes to it: while held, what the writer
    writes is gathered and goes out in one write (``writelines``: one system call) when the event
    loop comes round, at ``flush``, past ``GATHER_BYTES``, or with a close frame (which must not
    wait: aiohttp may close the connection right after it). Not held, a write goes as it came.

    It stands in for the writer's transport (``install``); everything but ``write`` is the
    transport's own. An aiohttp whose writer keeps its transport elsewhere gets no ``Gather``: its
    frames are each written as they come (``install`` says so), which is slower, never wrong."""

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._size = 0
        self._held = False
        #: Whether a release is scheduled for when the loop comes round.
        self._due = False

    @classmethod
    def install(cls, client: web.WebSocketResponse) -> Gather | None:
        """A ``Gather`` between ``client``'s frame writer (prepared) and its connection, or None
        when that writer is not aiohttp's as this module knows it."""
        writer: Any = getattr(client, "_writer", None)
        transport: Any = getattr(writer, "transport", None)
        if not all(callable(getattr(transport, name, None)) for name in ("write", "writelines", "is_closing")):
            return None  # (uvloop's transports are no ``asyncio.Transport``: what counts is what it has)
        gather = cls(transport)
        writer.transport = gather
        return gather

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:  # asked before every frame: not through ``__getattr__``
        return self._transport.is_closing()

    def hold(self) -> None:
        """Gather what is written until the loop comes round (``flush`` lets go sooner)."""
        if not self._held:
            self._held = True
            if not self._due:
                self._due = True
                asyncio.get_running_loop().call_soon(self._release)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._transport.write(data)
            return
        self._pending.append(bytes(data) if not isinstance(data, bytes) else data)
        self._size += len(data)
        if self._size >= GATHER_BYTES or (0 < len(data) <= _CLOSE_MAX and data[0] & 0x0F == _CLOSE):
            self._write()

    def flush(self) -> None:
        """Write what was gathered now, and stop gathering until the next ``hold``."""
        self._held = False
        self._write()

    def _release(self) -> None:
        self._due = False
        try:
            self.flush()
        except Exception:  # no pump hears of it here: the connection goes, and the pumps see it gone
            get_logger().exception("websocket_write_failed")
            self._transport.abort()

    def _write(self) -> None:
        if not self._pending:
            return
        pending, self._pending, self._size = self._pending, [], 0
        if self._transport.is_closing():  # gone while they were held: nothing can take them (and
            return  # uvloop raises on a write to a closed transport, where aiohttp's writer would not write)
        if len(pending) == 1:
            self._transport.write(pending[0])
        else:
            self._transport.writelines(pending)


def _passed(code: object) -> int:
    """A close code as it may be sent on (a reserved one stands as a plain close)."""
    return code if isinstance(code, int) and 1000 <= code <= 4999 and code not in _UNSENDABLE else WSCloseCode.OK


def _broken_off() -> UpstreamError:
    """What a call in flight is told when its upstream leg ends before its response does."""
    return UpstreamError("the upstream closed the WebSocket before the response completed")


def _gone(why: str) -> _End:
    """The upstream leg broke (no close of its own, or a frame the relay could not take)."""
    return _End(why, to_client=WSCloseCode.BAD_GATEWAY, to_upstream=None, reason=b"upstream connection lost",
                error=_broken_off())


class Socket:
    """One relayed socket: its two pumps and its watchdog (see the module's docstring)."""

    def __init__(self, call: Call, client: web.WebSocketResponse, leg: UpstreamSocket, projecting: bool) -> None:
        self.call, self.client, self.leg = call, client, leg
        server = call.services.config.server
        self.idle, self.total, self.write_timeout = (server.websocket_idle_timeout, server.websocket_timeout,
                                                     server.write_timeout)
        self.read_timeout = call.upstream.read_timeout
        self._time = asyncio.get_running_loop().time
        self.opened = self.last = self._time()
        #: Since when sends to the client have been under way (None: none is), for the watchdog.
        self.writing: float | None = None
        #: When the socket's last frames to the client must be sent by (None: it is not ending).
        self.closing_by: float | None = None
        self._sending = 0
        self.messages_in = self.messages_out = 0
        self._gather = Gather.install(client)
        self.calls = Calls(call, _message_headers(call.request.headers), self.to_upstream, self.to_client) \
            if projecting else None

    async def to_upstream(self, data: bytes, opcode: WSMsgType = WSMsgType.TEXT) -> None:
        await self.leg.send_frame(data, opcode)

    async def to_client(self, data: bytes, opcode: WSMsgType = WSMsgType.TEXT) -> None:
        if self.closing_by is not None:  # the socket is ending: its last events (one per open call)
            async with asyncio.timeout_at(self.closing_by):  # get write_timeout in all, however many
                await self.client.send_frame(data, opcode)
            return
        if self._gather is not None:
            self._gather.hold()
        # no timer per frame (a fifth of the relay's own time): the watchdog sees a send that hangs,
        # from when the sends under way began (both pumps may send to the client)
        if not self._sending:
            self.writing = self._time()
        self._sending += 1
        try:
            await self.client.send_frame(data, opcode)
        finally:
            self._sending -= 1
            if not self._sending:
                self.writing = None

    async def run(self) -> None:
        pumps = [asyncio.ensure_future(p) for p in (self._inward(), self._outward(), self._watch())]
        end = _End("cancelled", to_client=WSCloseCode.GOING_AWAY, to_upstream=WSCloseCode.GOING_AWAY)
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            end = self._ended(done.pop())
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            if end.why == "cancelled" and self.client.closed:  # it left as it closed (handler_cancellation)
                end = _End("client closed", to_client=None, to_upstream=_passed(self.client.close_code))
            await self._close(end)

    def _ended(self, pump: asyncio.Future[_End]) -> _End:
        try:
            return pump.result()
        except Exception:  # a bug: both legs close (1011), the app goes on
            get_logger().exception("websocket_relay_failed", request_id=self.call.ctx.request_id)
            return _End("internal error", to_client=WSCloseCode.INTERNAL_ERROR,
                        to_upstream=WSCloseCode.GOING_AWAY, error=UpstreamError("the relay failed; see the proxy log"))

    async def _close(self, end: _End) -> None:
        """Tell the open calls, close each leg still open, note how it went in the socket's line."""
        self.call.ctx.fields.update(closed=end.why, messages_in=self.messages_in, messages_out=self.messages_out)
        if self._gather is not None:  # before the close and the last events (those are not gathered)
            self._gather.flush()
        self.closing_by = self._time() + self.write_timeout  # a client that reads none of them cannot hold it open
        if self.calls is not None:
            await self.calls.close(end.error, left=end.to_client is None or end.why == "cancelled")
        if end.to_upstream is not None and not self.leg.closed:
            with contextlib.suppress(Exception):  # a leg that cannot take its close is dropped with its session
                await self.leg.close(code=end.to_upstream, message=end.reason)
        if end.to_client is not None and not self.client.closed:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.write_timeout):
                    await self.client.close(code=end.to_client, message=end.reason)
        if not self.client.closed and (transport := self.call.request.transport) is not None:
            transport.abort()  # a client that takes no close (stalled, or none is due) loses the connection

    async def _inward(self) -> _End:
        """Client to upstream, one message at a time, each held of the memory budget while it is
        (a call's, until its call ends)."""
        client, calls, budget = self.client, self.calls, self.call.services.budget
        while True:
            msg = await client.receive()
            if msg.type is WSMsgType.TEXT or msg.type is WSMsgType.BINARY:
                self.last = self._time()
                self.messages_in += 1
                data: bytes = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
                try:
                    if calls is None:
                        try:
                            held = budget.take(len(data), "message")
                        except MemoryBusy:
                            return _End("memory budget spent", to_client=WSCloseCode.TRY_AGAIN_LATER,
                                        to_upstream=WSCloseCode.GOING_AWAY, reason=b"memory budget spent; retry")
                        try:
                            await self.to_upstream(data, msg.type)
                        finally:
                            held.release()
                    elif msg.type is WSMsgType.TEXT:
                        await calls.from_client(data)
                    else:
                        await calls.refuse(InvalidRequest("a binary frame where a JSON message is expected",
                                                          code=Code.INVALID_MESSAGE), None)
                except ConnectionError:
                    return _gone("upstream gone")
            elif msg.type is WSMsgType.CLOSE:  # aiohttp answered it already
                return _End("client closed", to_client=None, to_upstream=_passed(msg.data),
                            reason=(msg.extra or "").encode()[:123])
            elif msg.type is WSMsgType.ERROR:  # a frame over the limit (1009) or a protocol error: closed by aiohttp
                code = client.close_code or WSCloseCode.PROTOCOL_ERROR
                why = "client message too large" if code == WSCloseCode.MESSAGE_TOO_BIG else "client protocol error"
                return _End(why, to_client=None, to_upstream=WSCloseCode.GOING_AWAY)
            else:  # CLOSING, CLOSED: the client's connection is gone
                return _End("client gone", to_client=None, to_upstream=WSCloseCode.GOING_AWAY)

    async def _outward(self) -> _End:
        """Upstream to client, one message at a time (each call's events seen by its call first)."""
        leg, calls = self.leg, self.calls
        while True:
            msg = await leg.receive()
            try:
                if msg.type is WSMsgType.TEXT:
                    self.last = self._time()
                    self.messages_out += 1
                    if calls is None or not calls.open:
                        await self.to_client(msg.data)
                    elif (turn := calls.passing(msg.data)) is not None:  # the middle of a call: as it came
                        turn.events += 1
                        await self.to_client(msg.data)
                    else:  # a call's first or last event, or one of a lane: its client may be waiting for it
                        await calls.from_upstream(msg.data)
                        if self._gather is not None:
                            self._gather.flush()
                    continue
                if msg.type is WSMsgType.BINARY:
                    self.last = self._time()
                    self.messages_out += 1
                    await self.to_client(msg.data, WSMsgType.BINARY)
                    continue
            except ConnectionError:
                return _End("client gone", to_client=None, to_upstream=WSCloseCode.GOING_AWAY)
            return self._upstream_ended(msg)

    def _upstream_ended(self, msg: WSMessageNoDecodeText) -> _End:
        """How the socket ends when the upstream leg gives no data frame: its close passed on (a
        bad gateway while a call is open, which is told), or the leg broke."""
        if msg.type is WSMsgType.CLOSE:
            open_calls = self.calls is not None and self.calls.open
            return _End("upstream closed", to_client=_passed(msg.data) if not open_calls else WSCloseCode.BAD_GATEWAY,
                        to_upstream=None, reason=(msg.extra or "").encode()[:123],
                        error=_broken_off() if open_calls else None)
        if msg.type is WSMsgType.ERROR:
            return _gone("upstream message too large" if self.leg.close_code == WSCloseCode.MESSAGE_TOO_BIG
                         else "upstream protocol error")
        return _gone("upstream gone")

    async def _watch(self) -> _End:
        """The idle and total timeouts, and a client that takes no frame for ``write_timeout``.
        It looks at least once every ``write_timeout`` (a send that hangs, or a call that opened
        while it slept, is seen within that) and by the earlier of the two silences."""
        while True:
            busy = self.calls is not None and self.calls.open
            idle_at = self.last + (self.read_timeout if busy else self.idle)
            total_at = self.opened + self.total
            now = self._time()
            writing = self.writing
            if writing is not None and now - writing >= self.write_timeout:
                get_logger().warning("client_write_timeout", request_id=self.call.ctx.request_id)
                return _End("client stalled", to_client=None, to_upstream=WSCloseCode.GOING_AWAY)
            if now >= total_at:
                return _End("time limit", reason=b"socket time limit",
                            error=UpstreamError("the socket reached its time limit", code=Code.UPSTREAM_TIMEOUT))
            if now >= idle_at:
                if busy:
                    return _End("upstream silent", to_client=WSCloseCode.BAD_GATEWAY, reason=b"upstream timed out",
                                error=UpstreamError("upstream timed out before responding", code=Code.UPSTREAM_TIMEOUT))
                return _End("idle", reason=b"idle timeout")
            wake = min(idle_at, total_at, (writing if writing is not None else now) + self.write_timeout)
            quiet_at = self.last + min(self.idle, self.read_timeout)
            await asyncio.sleep((min(wake, quiet_at) if quiet_at > now else wake) - now)


__all__ = ["ROUTE", "Socket", "relay", "serves"]
