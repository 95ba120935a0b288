"""A client run in a network namespace of its own, seeing the proxy and nothing else (test support).

``isolated(argv, bridges)`` wraps a client's command line in ``unshare --net`` and this file run
as a script (``python netns.py PORT=SOCKET ... -- ARGV...``, the forwarder): inside it brings up
loopback, which a new namespace starts with down, listens on ``127.0.0.1:PORT`` for each pair,
runs ``ARGV`` and exits with its code. There, loopback holds only the ports given, each carried over a Unix
socket (the file system is shared, the network is not) to a ``Bridge`` in the test's own
namespace, which carries it on to a TCP port there (the proxy's, a scripted upstream's). A client
that phones home (an update check, telemetry, a price list, a model catalogue) fails at once and
never leaves the machine; what it sends the proxy is everything it sends at all.

Needs ``unshare`` (util-linux) and ``ip`` (iproute2), and the right to make a network namespace
(root, as on CI); ``available()`` says whether this machine has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

FORWARD: Final = Path(__file__).resolve()


@functools.cache
def available() -> bool:
    """Whether a network namespace can be made here (``unshare --net`` with ``ip``)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    done = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, check=False)
    return done.returncode == 0


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


class Bridge:
    """A Unix socket at ``path`` whose every connection is carried to ``127.0.0.1:port`` here;
    ``inside`` is the port the client dials in its namespace (the same number, so that URLs the
    proxy builds from its own address, ``public_url``, read the same on both sides)."""

    def __init__(self, path: Path, port: int) -> None:
        self.path = path
        self.port = port
        self.inside = port
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> Bridge:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def isolated(argv: Sequence[str], bridges: Sequence[Bridge]) -> list[str]:
    """``argv`` run in a new network namespace whose loopback holds only ``bridges``' ports."""
    pairs = [f"{b.inside}={b.path}" for b in bridges]
    return ["unshare", "--net", "--", sys.executable, str(FORWARD), *pairs, "--", *argv]


# -- the forwarder, inside the namespace ---------------------------------------------------------------


def _to_unix(path: str):  # type: ignore[no-untyped-def]
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
    return serve


async def _forward(pairs: list[tuple[int, str]], argv: list[str]) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    servers = [await asyncio.start_server(_to_unix(path), "127.0.0.1", port) for port, path in pairs]
    process = await asyncio.create_subprocess_exec(*argv)
    code = await process.wait()
    for server in servers:
        server.close()
    return code


if __name__ == "__main__":
    split = sys.argv.index("--")
    found = [(int(port), path) for port, _, path in (arg.partition("=") for arg in sys.argv[1:split])]
    sys.exit(asyncio.run(_forward(found, sys.argv[split + 1:])))
