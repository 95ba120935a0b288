"""The relay's gathering of a burst (``call.websocket.Gather``): what aiohttp's frame writer writes
while it is held goes out in one write when the event loop comes round, at once on ``flush``,
past ``GATHER_BYTES`` or with a close frame; on a real TCP connection, on asyncio's loop and on
uvloop's, and on aiohttp's own writer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvloop
from aiohttp import web

from projectionist.proxy.call.websocket import GATHER_BYTES, Gather


class Counting:
    """A real connection's transport that counts the writes it is given (each a system call)."""

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport
        self.writes: list[int] = []  # how many pieces each write carried

    def write(self, data: bytes) -> None:
        self.writes.append(1)
        self.transport.write(data)

    def writelines(self, pieces: list[bytes]) -> None:
        self.writes.append(len(pieces))
        self.transport.writelines(pieces)

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def abort(self) -> None:
        self.transport.abort()


_KEPT: list[asyncio.StreamWriter] = []  # the client ends' writers: one collected closes its connection


@contextlib.asynccontextmanager
async def _gathering() -> AsyncIterator[tuple[Gather, Counting, asyncio.StreamReader]]:
    """A ``Gather`` over a real connection's counted transport, the connection's other end, and
    both closed afterwards."""
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(writer)
        await reader.read()  # the connection stays open while the test writes to it

    server = await asyncio.start_server(keep, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, client = await asyncio.open_connection("127.0.0.1", port)
    _KEPT.append(client)
    counting = Counting((await accepted.get()).transport)
    try:
        yield Gather(counting), counting, reader  # type: ignore[arg-type]
    finally:
        counting.transport.close()
        server.close()
        await server.wait_closed()


def _on_uvloop(test: Callable[[], Awaitable[None]]) -> None:
    """``test`` on the loop serve runs on (its transports are no ``asyncio.Transport``)."""
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(test())
    finally:
        loop.close()


async def _burst() -> None:
    async with _gathering() as (gather, counting, reader):
        for index in range(24):  # a response's burst of events, each written on its own
            gather.hold()
            gather.write(b"frame %02d;" % index)
        assert counting.writes == []  # held while the burst is written
        await asyncio.sleep(0)
        assert counting.writes == [24]  # one write once the loop came round
        data = await asyncio.wait_for(reader.readexactly(24 * 9), 5)
        assert data == b"".join(b"frame %02d;" % index for index in range(24))
        gather.write(b"alone;")  # not held: written as it came
        assert counting.writes == [24, 1]
        assert await asyncio.wait_for(reader.readexactly(6), 5) == b"alone;"


async def test_a_burst_goes_out_in_one_write_when_the_loop_comes_round() -> None:
    await _burst()


def test_a_burst_goes_out_in_one_write_on_uvloop() -> None:
    _on_uvloop(_burst)


async def test_a_flush_writes_at_once_and_the_next_hold_gathers_again() -> None:
    async with _gathering() as (gather, counting, reader):
        gather.hold()
        gather.write(b"created;")
        gather.flush()  # a call's first event: out without waiting for the loop
        assert counting.writes == [1]
        assert await asyncio.wait_for(reader.readexactly(8), 5) == b"created;"
        gather.hold()  # the burst after it, in the same turn, is gathered again
        gather.write(b"delta;")
        gather.write(b"delta;")
        assert counting.writes == [1]
        await asyncio.sleep(0)  # the release scheduled for the turn lets it go
        assert counting.writes == [1, 2]
        assert await asyncio.wait_for(reader.readexactly(12), 5) == b"delta;delta;"
        gather.flush()  # nothing held: nothing written
        assert counting.writes == [1, 2]


async def test_a_close_frame_and_what_is_past_the_bound_are_not_held() -> None:
    async with _gathering() as (gather, counting, reader):
        gather.hold()
        gather.write(b"\x81\x05hello")  # a text frame: held
        gather.write(b"\x88\x02\x03\xe8")  # a close frame (1000): aiohttp may close right after it
        assert counting.writes == [2]
        assert await asyncio.wait_for(reader.readexactly(11), 5) == b"\x81\x05hello\x88\x02\x03\xe8"
        gather.hold()
        gather.write(b"\x81\x05small")
        big = b"x" * GATHER_BYTES  # one write past the bound: out at once, with what was held
        gather.write(big)
        assert counting.writes == [2, 2]
        assert await asyncio.wait_for(reader.readexactly(7 + len(big)), 5) == b"\x81\x05small" + big
        gather.write(bytearray(b"\x81\x01!"))  # still held in this turn: kept as bytes of its own
        await asyncio.sleep(0)
        assert counting.writes == [2, 2, 1]
        assert await asyncio.wait_for(reader.readexactly(3), 5) == b"\x81\x01!"


async def test_it_installs_on_aiohttp_s_own_writer_and_frames_arrive_whole(aiohttp_client: Any) -> None:
    """The writer aiohttp prepares is the one ``install`` knows (this pins the aiohttp it runs
    on): a burst of frames sent in one turn is one write, and the client reads every frame."""
    installed: list[Gather | None] = []
    writes: list[int] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(decode_text=False)
        await socket.prepare(request)
        gather = Gather.install(socket)
        installed.append(gather)
        assert gather is not None
        real = gather._transport  # noqa: SLF001
        writelines = real.writelines
        real.writelines = lambda pieces: (writes.append(len(pieces)), writelines(pieces))[1]  # type: ignore[method-assign]
        gather.hold()
        for index in range(10):
            await socket.send_frame(b'{"n":%d}' % index, web.WSMsgType.TEXT)
        await asyncio.sleep(0)
        await socket.close()
        return socket

    app = web.Application()
    app.router.add_get("/", handler)
    client = await aiohttp_client(app)
    async with client.ws_connect("/") as ws:
        got = [(await ws.receive(timeout=5)).data for _ in range(10)]
    assert got == ['{"n":%d}' % index for index in range(10)]
    assert installed and installed[0] is not None
    assert writes == [10]


async def _held_then_closed() -> None:
    async with _gathering() as (gather, counting, reader):
        gather.hold()
        gather.write(b"\x81\x05held!")
        counting.transport.close()  # the client's connection goes while the frame is held
        await asyncio.sleep(0)  # the release finds it closing: the frame is dropped, nothing raises
        gather.hold()
        gather.write(b"\x81\x05later")
        gather.flush()
        await asyncio.sleep(0.05)  # closed by now (uvloop raises on a write to a closed transport)
        gather.hold()
        gather.write(b"\x81\x04last")
        gather.flush()
        assert counting.writes == []


async def test_frames_held_when_the_connection_goes_are_dropped_without_an_error() -> None:
    await _held_then_closed()


def test_frames_held_when_the_connection_goes_are_dropped_without_an_error_on_uvloop() -> None:
    _on_uvloop(_held_then_closed)


async def test_a_write_that_fails_when_released_closes_the_connection() -> None:
    """Released when the loop comes round, no pump hears of a failed write: the connection is
    aborted (the pumps then see it gone) rather than left open with its frames lost. An empty
    write is held like any other."""
    async with _gathering() as (gather, counting, reader):
        gather.hold()
        gather.write(b"")
        gather.write(b"\x81\x05held!")

        def refuse(pieces: list[bytes]) -> None:
            raise OSError("no")

        counting.writelines = refuse  # type: ignore[method-assign]
        await asyncio.sleep(0)
        assert counting.transport.is_closing()  # aborted
        assert await asyncio.wait_for(reader.read(), 5) == b""  # nothing arrived, and the connection ended


def test_a_writer_it_does_not_know_gets_none() -> None:
    class Stranger:
        _writer = None

    assert Gather.install(Stranger()) is None  # type: ignore[arg-type]
