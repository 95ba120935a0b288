"""``projectionist serve --workers N``: a supervisor of N server processes on one port (proxy layer, ops).

The supervisor serves nothing. It first checks what it can (the open-proxy rule, the event loop,
that the port is free), so those mistakes stay one line and exit 2 with no worker started. Each
worker (``worker.py``) is a fresh interpreter, ``python -m``, never a fork of this one: no copied
threads, loop or id prefix, and its one input is a JSON brief on stdin. All run the same app on
the port with SO_REUSEPORT, so the kernel spreads connections over them, and share the data dir
(or PostgreSQL and S3): the log's conditional append keeps one transition per failure across them.

- Start: every worker reports ``ready`` or its start-up error; the first error stops the others
  and is the supervisor's one line.
- A worker that dies later is logged (``worker_exited``) and replaced, at most ``RESTART_LIMIT``
  times in any ``RESTART_WINDOW`` seconds; beyond that a replacement waits for the window
  (``worker_restart_delayed``): a crash loop is slowed to that rate, never spun, never given up.
- SIGTERM/SIGINT: SIGTERM to every worker, SIGKILL to any still running ``shutdown_grace`` later.
"""

from __future__ import annotations

import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from types import FrameType

import msgspec

from ...policy.errors import Code
from ..config import Config
from ..observe.logger import get_logger, setup_logging
from .serve import StartupError, admit_open_proxy, banner, event_loop, listening_fields, say
from .worker import Brief, Report
from ..inbound.resumable import KEY_ENV as UPLOAD_KEY_ENV

RESTART_LIMIT = 5
RESTART_WINDOW = 60.0
WORKER_COMMAND = (sys.executable, "-m", "projectionist.proxy.ops.worker")


class RestartBudget:
    """At most ``limit`` restarts in any ``window`` seconds."""

    def __init__(self, limit: int = RESTART_LIMIT, window: float = RESTART_WINDOW) -> None:
        self.limit, self.window = limit, window
        self.spent: deque[float] = deque()

    def wait(self, now: float) -> float:
        """Seconds until the next restart may start (0.0: at once)."""
        while self.spent and self.spent[0] <= now - self.window:
            self.spent.popleft()
        return 0.0 if len(self.spent) < self.limit else self.spent[0] + self.window - now

    def spend(self, now: float) -> None:
        self.spent.append(now)


@dataclass
class Worker:
    slot: int
    process: subprocess.Popen[bytes]
    restarted: bool
    ready: bool = False
    error: Report | None = None
    partial: bytes = b""

    @property
    def pid(self) -> int:
        return self.process.pid


def supervise(config: Config, *, insecure_open_proxy: bool = False) -> None:
    """Run ``server.workers`` server processes on one port until SIGTERM/SIGINT."""
    open_proxy = admit_open_proxy(config, insecure_open_proxy)
    loop = event_loop(config.server.event_loop)  # uvloop asked for and missing: one line, no worker started
    kind = type(loop).__module__
    loop.close()
    port = probe_port(config.server.host, config.server.port)
    config = msgspec.structs.replace(config, server=msgspec.structs.replace(config.server, port=port))
    setup_logging(config.logging.level, config.logging.json, pid=True)
    Supervisor(config, open_proxy, kind).run()


def probe_port(host: str, port: int) -> int:
    """Bind every address the workers will listen on, without SO_REUSEPORT, and let go: a port that
    anyone holds is LISTEN_FAILED before a worker starts. Port 0 becomes the one the kernel picks."""
    held: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            held.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's create_server does
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address[0], port, *address[2:]))
            port = sock.getsockname()[1]
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", code=Code.LISTEN_FAILED) from None
    finally:
        for sock in held:
            sock.close()
    return port


def exit_status(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return signal.Signals(-returncode).name
    return f"exit {returncode}"


class Supervisor:
    """Starts the workers, replaces the ones that die, stops them all on SIGTERM/SIGINT."""

    def __init__(self, config: Config, open_proxy: bool, loop: str) -> None:
        self.config, self.open_proxy, self.loop = config, open_proxy, loop
        self.brief = msgspec.json.encode(Brief(config, os.getpid()))
        self.workers: dict[int, Worker] = {}  # by slot
        self.due: dict[int, float] = {}  # slot -> monotonic time its replacement may start
        self.budget = RestartBudget()
        self.selector = selectors.DefaultSelector()
        self.stopping = False

    def run(self) -> None:
        # one key for the workers' resumable-upload tokens: a start on one, its bytes on another
        os.environ.setdefault(UPLOAD_KEY_ENV, secrets.token_hex(32))
        wake = self._catch_signals()
        try:
            for slot in range(self.config.server.workers):
                self._start(slot, restarted=False)
            if self._until_ready():
                get_logger().info("listening", **listening_fields(self.config, self.loop, self.open_proxy),
                                  admin="%s:%d" % self.config.admin_address, pids=[w.pid for w in self.workers.values()])
                say(banner(self.config, self.config.console_url))
                self._supervise()
        finally:
            self._stop_all()
            signal.set_wakeup_fd(-1)
            self.selector.close()
            for fd in wake:
                os.close(fd)

    def _catch_signals(self) -> tuple[int, int]:
        """SIGTERM/SIGINT set ``stopping`` and wake the select (a self-pipe)."""
        wake = os.pipe()
        for fd in wake:
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake[1])
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop)
        self.selector.register(wake[0], selectors.EVENT_READ, None)
        return wake

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _start(self, slot: int, *, restarted: bool) -> None:
        # a process group of its own: a terminal's Ctrl-C reaches the supervisor, which stops workers once
        process = subprocess.Popen(WORKER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, process_group=0)
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(self.brief)
            process.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: its EOF says so
        os.set_blocking(process.stdout.fileno(), False)
        worker = Worker(slot, process, restarted)
        self.workers[slot] = worker
        self.selector.register(process.stdout, selectors.EVENT_READ, worker)

    def _until_ready(self) -> bool:
        """Wait until every worker listens (True) or a stop signal (False); a worker that exits
        first is the start-up error of all."""
        while not self.stopping:
            if all(w.ready for w in self.workers.values()):
                return True
            for worker in self._poll(None):
                error = worker.error or Report(code=Code.STARTUP_FAILED, message=(
                    f"worker {worker.slot} ended before it listened ({exit_status(worker.process.returncode)})"))
                raise StartupError(error.message, code=error.code)
        return False

    def _supervise(self) -> None:
        while not self.stopping:
            timeout = max(0.0, min(self.due.values()) - time.monotonic()) if self.due else None
            for worker in self._poll(timeout):
                self._exited(worker)
            self._restart_due()

    def _poll(self, timeout: float | None) -> list[Worker]:
        """Read what workers reported; return the ones that exited (their pipe ended)."""
        exited: list[Worker] = []
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                _drain(key.fd)
                continue
            worker: Worker = key.data
            try:
                chunk = os.read(key.fd, 4096)
            except BlockingIOError:
                continue
            if chunk:
                self._read(worker, chunk)
                continue
            self.selector.unregister(key.fileobj)
            worker.process.wait()
            del self.workers[worker.slot]
            exited.append(worker)
        return exited

    def _read(self, worker: Worker, chunk: bytes) -> None:
        *lines, worker.partial = (worker.partial + chunk).split(b"\n")
        for line in lines:
            try:
                report = msgspec.json.decode(line, type=Report)
            except msgspec.DecodeError:
                continue
            if report.ready:
                worker.ready = True
                if worker.restarted:
                    get_logger().info("worker_restarted", slot=worker.slot, worker_pid=worker.pid)
            elif report.code:
                worker.error = report

    def _exited(self, worker: Worker) -> None:
        now = time.monotonic()
        get_logger().warning("worker_exited", slot=worker.slot, worker_pid=worker.pid,
                             status=exit_status(worker.process.returncode),
                             code=worker.error.code if worker.error else None)
        wait = self.budget.wait(now)
        if wait:
            get_logger().warning("worker_restart_delayed", slot=worker.slot, seconds=round(wait, 1),
                                 limit=f"{RESTART_LIMIT} in {RESTART_WINDOW:g} s")
        self.due[worker.slot] = now + wait

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot, due in list(self.due.items()):
            if due > now:
                continue
            wait = self.budget.wait(now)
            if wait:  # others took the budget meanwhile
                self.due[slot] = now + wait
                continue
            del self.due[slot]
            self.budget.spend(now)
            self._start(slot, restarted=True)

    def _stop_all(self) -> None:
        """SIGTERM to every worker; SIGKILL to whichever still runs ``shutdown_grace`` later."""
        live = [w for w in self.workers.values() if w.process.poll() is None]
        for worker in live:
            worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.config.server.shutdown_grace
        for worker in live:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
                get_logger().warning("worker_killed", slot=worker.slot, worker_pid=worker.pid,
                                     grace=self.config.server.shutdown_grace)
        for worker in self.workers.values():
            if worker.process.stdout is not None:
                worker.process.stdout.close()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
