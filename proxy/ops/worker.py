"""One server process of ``projectionist serve --workers N`` (proxy layer, ops).

The supervisor (``workers.py``) starts it as ``python -m projectionist.proxy.ops.worker`` and
writes its ``Brief`` (the config already resolved from file, flags and port check) to its stdin.
It runs the same app as ``serve``, on a port it shares with its siblings (SO_REUSEPORT), and
reports on its stdout, which only the supervisor reads: ``ready`` once listening, or its one
start-up error. It never outlives the supervisor: PR_SET_PDEATHSIG on Linux, a parent-pid watch
everywhere.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import BinaryIO

import msgspec
from aiohttp import web

from ...policy.errors import ProjectionistError
from ..config import Config
from ..observe.logger import setup_logging
from .serve import CleanupCtx, limit_malloc_arenas, run_server

#: prctl(2) option: the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1
#: Seconds between two looks at the parent pid (the fallback where prctl is missing or misses).
PARENT_WATCH_EVERY = 1.0


class Brief(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the supervisor tells a worker: the resolved config and who to die with."""

    config: Config
    supervisor: int


class Report(msgspec.Struct, frozen=True, omit_defaults=True):
    """One line a worker writes to the supervisor: ``ready``, or a start-up error's code and message."""

    ready: bool = False
    code: str = ""
    message: str = ""


def die_with_parent(parent: int) -> None:
    """Get SIGTERM (a graceful stop) when ``parent`` dies; exit now if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: parent_watch alone
    if os.getppid() != parent:
        raise SystemExit(0)


def parent_watch(parent: int) -> CleanupCtx:
    """A cleanup context that stops the server (as SIGTERM does) once ``parent`` is gone."""

    async def watch(_: web.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            while os.getppid() == parent:
                await asyncio.sleep(PARENT_WATCH_EVERY)
            os.kill(os.getpid(), signal.SIGTERM)

        task = asyncio.get_running_loop().create_task(loop())
        yield
        task.cancel()

    return watch


def report(status: BinaryIO, what: Report) -> None:
    status.write(msgspec.json.encode(what) + b"\n")
    status.flush()


def main() -> int:
    status = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print goes to the log, never into the supervisor's pipe
    brief = msgspec.json.decode(sys.stdin.buffer.read(), type=Brief)
    die_with_parent(brief.supervisor)
    limit_malloc_arenas()
    setup_logging(brief.config.logging.level, brief.config.logging.json, pid=True)
    try:
        run_server(brief.config, lambda *_: report(status, Report(ready=True)), reuse_port=True,
                   contexts=[parent_watch(brief.supervisor)])
    except ProjectionistError as error:
        report(status, Report(code=error.code, message=error.message))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
