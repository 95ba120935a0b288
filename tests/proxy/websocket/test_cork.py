"""The relay's cork (``call.websocket.Cork``): a burst of frames written in one turn of the event
loop is held by TCP_CORK and let go once the loop comes round, on a real TCP connection; a socket
that cannot cork is written to as it is."""

from __future__ import annotations

import asyncio
import socket

import pytest

from projectionist.proxy.call.websocket import TCP_CORK, Cork

pytestmark = pytest.mark.skipif(TCP_CORK is None, reason="TCP_CORK is Linux's")


_KEPT: list[asyncio.StreamWriter] = []  # the client ends' writers: one collected closes its connection


async def _connection() -> tuple[asyncio.StreamWriter, asyncio.StreamReader, asyncio.Server]:
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(writer)
        await reader.read()  # the connection stays open while the test writes to it

    server = await asyncio.start_server(keep, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, client = await asyncio.open_connection("127.0.0.1", port)
    _KEPT.append(client)
    return await accepted.get(), reader, server


def corked(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    assert TCP_CORK is not None
    return int(sock.getsockopt(socket.IPPROTO_TCP, TCP_CORK))


async def test_a_burst_is_corked_until_the_loop_comes_round_and_arrives_whole() -> None:
    writer, reader, server = await _connection()
    try:
        cork = Cork(writer.transport)
        for index in range(24):  # a response's burst of events, each its own write
            cork.hold()
            writer.write(b"frame %02d;" % index)
        assert corked(writer) == 1  # held while the burst is written
        await asyncio.sleep(0)
        assert corked(writer) == 0  # let go once the loop came round: nothing waits for the cork
        data = await asyncio.wait_for(reader.readexactly(24 * 9), 5)
        assert data == b"".join(b"frame %02d;" % index for index in range(24))
        cork.hold()  # the next turn corks again
        assert corked(writer) == 1
        await asyncio.sleep(0)
        assert corked(writer) == 0
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def test_a_flush_lets_go_at_once_and_the_turn_s_release_still_comes() -> None:
    writer, reader, server = await _connection()
    try:
        cork = Cork(writer.transport)
        cork.hold()
        writer.write(b"created;")
        cork.flush()  # a call's first event: out without waiting for the loop
        assert corked(writer) == 0
        assert await asyncio.wait_for(reader.readexactly(8), 5) == b"created;"
        cork.hold()  # the burst after it, in the same turn, corks again
        writer.write(b"delta;")
        assert corked(writer) == 1
        await asyncio.sleep(0)
        assert corked(writer) == 0  # let go by the release scheduled for the turn
        assert await asyncio.wait_for(reader.readexactly(6), 5) == b"delta;"
        cork.flush()  # nothing held: no change
        assert corked(writer) == 0
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def test_a_socket_that_cannot_cork_is_written_to_as_it_is() -> None:
    writer, reader, server = await _connection()
    try:
        cork = Cork(writer.transport)
        writer.get_extra_info("socket")  # the connection goes away under the cork:
        writer.transport.abort()
        await asyncio.sleep(0)
        cork.hold()  # no error, and no cork from now on
        await asyncio.sleep(0)
        assert cork._sock is None  # noqa: SLF001
        assert Cork(None)._sock is None  # noqa: SLF001  # no transport, nothing to cork
    finally:
        server.close()
        await server.wait_closed()
