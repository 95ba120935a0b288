"""The ``projectionist`` command line as a subprocess, from the repository root, and ``serve`` as a
running process (shared by the CLI tests)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator

from tests.paths import ROOT


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "projectionist.proxy.ops.cli", *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


class Served:
    """``projectionist serve`` as a real process: its proxy and console URLs, the lines it printed
    on stdout at start-up (``banner``), and the process."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int, admin: int, banner: list[str]) -> None:
        self.proc, self.banner = proc, banner
        self.url, self.admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
        assert proc.stderr is not None
        # read all along: a full pipe would stall the server's log, and with it the server
        self._log = asyncio.get_running_loop().create_task(proc.stderr.read())

    async def stop(self) -> str:
        """SIGTERM, wait, and its stderr (the JSON log)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(self.proc.wait(), 30)
        return (await asyncio.wait_for(self._log, 30)).decode()


@contextlib.asynccontextmanager
async def served(*args: str, lines: int, env: dict[str, str] | None = None) -> AsyncIterator[Served]:
    """``serve`` with ``args`` on free loopback ports, once it printed its ``lines`` start-up
    lines; stopped at the end. A port another test worker took between ``free_port`` and the
    bind is the test's own race, not what it checks: that start is tried again on other ports."""
    from tests.backends import free_port

    for _ in range(5):
        port, admin = free_port(), free_port()
        if port == admin:
            continue
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--port", str(port),
            "--admin-listen", f"127.0.0.1:{admin}", *args, cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        banner = [(await asyncio.wait_for(proc.stdout.readline(), 60)).decode().rstrip("\n") for _ in range(lines)]
        if not all(banner):  # it ended before it printed: a lost port race, or the test's failure
            err = (await asyncio.wait_for(proc.stderr.read(), 30)).decode()
            await proc.wait()
            if "LISTEN_FAILED" in err:
                continue
            raise AssertionError(f"serve ended before it listened: {err[-2000:]}")
        running = Served(proc, port, admin, banner)
        try:
            yield running
        finally:
            await running.stop()
        return
    raise AssertionError("no free ports for serve after 5 tries")
