"""``projectionist serve --workers N`` as real processes on a real port: connections spread over
the workers, one quarantine across them (SQLite and PostgreSQL), stop within the grace and no
orphans, a dead worker replaced, bad values refused in one line."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from projectionist.proxy.ops.workers import RestartBudget
from tests.backends import free_port, free_port_pair, pg_dsn
from tests.commands import cli
from tests.conftest import drop_schema
from tests.fakes import FakeUpstream
from tests.imaging import make_image, ref_id
from tests.paths import ROOT
from tests.proxy.ops.test_cli_errors import one_line_error, serve_briefly

ADMIN_TOKEN = "workers-admin"


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it has exited, only its parent has not reaped it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@dataclass
class Supervised:
    """A ``serve --workers`` supervisor process, its base URL and its log file (stderr)."""

    process: asyncio.subprocess.Process
    url: str
    log: Path
    #: The console's and admin API's own listener (``--admin-listen``).
    admin_url: str = ""

    def lines(self) -> list[dict[str, Any]]:
        text = self.log.read_bytes().decode(errors="replace")
        return [msgspec.json.decode(line) for line in text.splitlines() if line.startswith("{")]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == name]

    @property
    def pids(self) -> list[int]:
        return list(self.events("listening")[0]["pids"])

    async def wait_for(self, name: str, count: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.events(name)
            if len(found) >= count:
                return found
            if self.process.returncode is not None:
                break
            await asyncio.sleep(0.1)
        pytest.fail(f"no {count} {name!r} line(s); log:\n{self.log.read_text()}")

    async def stop(self, timeout: float = 30.0) -> float:
        """SIGTERM the supervisor; the seconds it took to exit."""
        started = time.monotonic()
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.process.wait(), timeout)
        return time.monotonic() - started


@pytest.fixture
async def supervise(tmp_path: Path) -> AsyncIterator[Any]:
    """Start ``serve --workers`` with the given arguments; everything it started is gone afterwards."""
    started: list[Supervised] = []

    async def start(*args: str, workers: int = 2) -> Supervised:
        port, admin = free_port(), free_port()
        log = tmp_path / f"serve-{len(started)}.log"
        env = {**os.environ, "PROJECTIONIST_ADMIN_TOKEN": ADMIN_TOKEN}
        with open(log, "wb") as stderr:  # a file, not a pipe: a full pipe would block the workers
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--workers", str(workers),
                "--port", str(port), "--admin-listen", f"127.0.0.1:{admin}", *args, cwd=ROOT, env=env,
                stdout=asyncio.subprocess.DEVNULL, stderr=stderr)
        served = Supervised(process, f"http://127.0.0.1:{port}", log, f"http://127.0.0.1:{admin}")
        started.append(served)
        await served.wait_for("listening")
        return served

    yield start
    for served in started:
        pids = served.pids if served.events("listening") else []
        if served.process.returncode is None:
            served.process.kill()
            await served.process.wait()
        for pid in pids + [line["worker_pid"] for line in served.events("worker_restarted")]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def fresh_connections() -> aiohttp.ClientSession:
    """A client that opens a new connection per request, so the kernel picks a worker each time."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def chat(http: aiohttp.ClientSession, url: str, session: str, *ids: str, stream: bool = False) -> int:
    parts = [{"type": "text", "text": "look"}] + [
        {"type": "image_url", "image_url": {"url": f"attachment:{i}"}} for i in ids]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}], "stream": stream}
    async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": session}) as resp:
        await resp.read()
        return resp.status


def request_pids(served: Supervised, session: str | None = None) -> set[int]:
    return {line["pid"] for line in served.events("request") if session is None or line.get("session") == session}


async def test_two_workers_share_the_port_and_both_serve(supervise: Any, upstream: FakeUpstream, tmp_path: Path) -> None:
    served = await supervise("--data-dir", str(tmp_path / "d"), "--upstream", f"openai={upstream.url}")
    listening = served.events("listening")[0]
    assert listening["workers"] == 2 and len(set(served.pids)) == 2
    assert served.process.pid not in served.pids and all(alive(pid) for pid in served.pids)
    async with fresh_connections() as http:
        statuses = [await chat(http, served.url, "spread") for _ in range(40)]
    assert statuses == [200] * 40
    # 40 connections, each hashed to one of two listeners: both workers took some
    assert request_pids(served) == set(served.pids)
    assert await served.stop() < 15 and served.process.returncode == 0


def postgres_config(path: Path, schema: str) -> Path:
    path.write_text(f'[log]\nkind = "postgres"\n\n[log.postgres]\ndsn = "{pg_dsn()}"\nschema = "{schema}"\n')
    return path


@pytest.mark.parametrize("log_kind", ["sqlite", "postgres"])
async def test_concurrent_requests_through_two_workers_make_one_quarantine(
    supervise: Any, upstream: FakeUpstream, tmp_path: Path, log_kind: str
) -> None:
    args = ["--data-dir", str(tmp_path / "d"), "--upstream", f"openai={upstream.url}"]
    schema = f"t_{uuid.uuid4().hex[:16]}"
    if log_kind == "postgres":
        args += ["--config", str(postgres_config(tmp_path / "pg.toml", schema))]
    try:
        served = await supervise(*args)
        missing = ref_id(make_image(color=170))
        async with fresh_connections() as http:
            statuses = await asyncio.gather(*(chat(http, served.url, "race", missing) for _ in range(60)))
            async with http.get(f"{served.admin_url}/admin/sessions/race/events",
                                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as resp:
                assert resp.status == 200
                events = (await resp.json())["events"]
        assert statuses == [200] * 60
        assert request_pids(served, "race") == set(served.pids)  # the race ran in both processes
        quarantines = [e for e in events if e["type"] == "attachment/quarantine"]
        assert [(q["data"]["attachment_id"], q["data"]["failure"]) for q in quarantines] == [(missing, "not_found")]
        assert len({r.body for r in upstream.received}) == 1  # every worker projected the same placeholder
    finally:
        if log_kind == "postgres":
            await drop_schema(schema)


async def test_sigterm_stops_every_worker_within_the_grace(supervise: Any, upstream: FakeUpstream, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[server]\nshutdown_grace = 2.0\n")
    served = await supervise("--config", str(config), "--data-dir", str(tmp_path / "d"),
                             "--upstream", f"openai={upstream.url}")
    upstream.gate = asyncio.Event()  # a stream that never ends holds its worker until the grace is up
    async with aiohttp.ClientSession() as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with http.post(f"{served.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.content.readline()
            took = await served.stop()
    assert took < 2.0 + 1.5, took
    assert served.process.returncode == 0
    assert not [pid for pid in served.pids if alive(pid)]


async def test_workers_exit_when_the_supervisor_is_killed(supervise: Any, tmp_path: Path) -> None:
    served = await supervise("--data-dir", str(tmp_path / "d"))
    served.process.kill()  # no chance to stop anyone: the workers must notice by themselves
    await served.process.wait()
    deadline = time.monotonic() + 10.0  # the default shutdown_grace
    while time.monotonic() < deadline and any(alive(pid) for pid in served.pids):
        await asyncio.sleep(0.1)
    assert not [pid for pid in served.pids if alive(pid)]


async def test_a_worker_that_dies_is_logged_and_replaced(supervise: Any, upstream: FakeUpstream, tmp_path: Path) -> None:
    served = await supervise("--data-dir", str(tmp_path / "d"), "--upstream", f"openai={upstream.url}")
    victim, survivor = served.pids
    os.kill(victim, signal.SIGKILL)
    exited = (await served.wait_for("worker_exited"))[0]
    assert (exited["worker_pid"], exited["status"], exited["level"]) == (victim, "SIGKILL", "warning")
    replacement = (await served.wait_for("worker_restarted"))[0]["worker_pid"]
    assert replacement not in (victim, survivor) and alive(replacement) and alive(survivor)
    async with fresh_connections() as http:
        assert [await chat(http, served.url, "after") for _ in range(30)] == [200] * 30
    assert request_pids(served, "after") == {survivor, replacement}
    await served.stop()
    assert not alive(replacement) and not alive(survivor)


def test_the_restart_budget_slows_a_crash_loop_to_its_rate() -> None:
    budget = RestartBudget(limit=3, window=60.0)
    for now in (0.0, 1.0, 2.0):
        assert budget.wait(now) == 0.0
        budget.spend(now)
    assert budget.wait(3.0) == 57.0  # a fourth restart waits until the first leaves the window
    assert budget.wait(60.0) == 0.0
    budget.spend(60.0)
    assert budget.wait(60.5) == 0.5


@pytest.mark.parametrize("value", ["0", "65", "-1", "abc", "1.5", ""])
async def test_a_bad_workers_flag_is_one_line(tmp_path: Path, value: str) -> None:
    rc, _, err = await cli("serve", "--workers", value, "--port", str(free_port()), "--data-dir", str(tmp_path / "d"))
    one_line_error(rc, err, "INVALID_CONFIG", "workers")


@pytest.mark.parametrize("value", ["0", "65", '"2"', "true", "2.0"])
async def test_a_bad_workers_setting_is_one_line(tmp_path: Path, value: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f"[server]\nworkers = {value}\n")
    rc, _, err = await cli("serve", "--config", str(config), "--port", str(free_port()), "--data-dir", str(tmp_path / "d"))
    one_line_error(rc, err, "INVALID_CONFIG", "workers")


async def test_the_flag_overrides_the_config_file(supervise: Any, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[server]\nworkers = 64\n")
    served = await supervise("--config", str(config), "--data-dir", str(tmp_path / "d"), workers=3)
    assert served.events("listening")[0]["workers"] == 3 and len(set(served.pids)) == 3


async def test_start_up_errors_with_workers_stay_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port_pair()))  # the console's port + 1 free: the port is what fails
        taken.listen()
        port = taken.getsockname()[1]
        rc, _, err = await cli("serve", "--workers", "2", "--port", str(port), "--data-dir", str(tmp_path / "d"))
    one_line_error(rc, err, "LISTEN_FAILED", str(port))
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")  # found by the workers as they open the store: reported once, by the supervisor
    rc, _, err = await cli("serve", "--workers", "2", "--port", "0", "--data-dir", str(afile))
    one_line_error(rc, err, "STARTUP_FAILED", str(afile))
    env = {**os.environ, "OPENAI_KEY": "sk-held"}
    env.pop("PROJECTIONIST_CLIENT_TOKENS", None)
    config = tmp_path / "c.toml"
    config.write_text('[upstreams.openai]\nformat = "openai"\nurl = "http://127.0.0.1:9"\napi_key_env = "OPENAI_KEY"\n')
    rc, _, err = await cli("serve", "--workers", "2", "--config", str(config), "--host", "0.0.0.0",
                           "--port", str(free_port()), "--data-dir", str(tmp_path / "d"), env=env)
    one_line_error(rc, err, "OPEN_PROXY_REFUSED")


async def test_one_worker_is_todays_single_process(tmp_path: Path) -> None:
    log = await serve_briefly("--data-dir", str(tmp_path / "d"))
    assert log["workers"] == 1 and "pids" not in log and "pid" not in log


async def test_a_gemini_upload_started_on_one_worker_finishes_on_any(supervise: Any, tmp_path: Path) -> None:
    """The resumable protocol's start and its bytes are two requests; with fresh connections the
    kernel hands them to either worker. Every upload finishes (the token carries the start,
    signed with the key the supervisor gave its workers)."""
    served = await supervise("--data-dir", str(tmp_path / "d"))
    images = [make_image(color=150 + n) for n in range(20)]
    statuses = []
    async with fresh_connections() as http:
        for data in images:
            async with http.post(f"{served.url}/upload/v1beta/files", json={"file": {"display_name": "x.png"}},
                                 headers={"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
                                          "X-Goog-Upload-Header-Content-Type": "image/png",
                                          "X-Goog-Upload-Header-Content-Length": str(len(data))}) as start:
                assert start.status == 200, await start.text()
                url = start.headers["X-Goog-Upload-URL"]
            async with http.post(url, data=data, headers={"X-Goog-Upload-Command": "upload, finalize",
                                                          "X-Goog-Upload-Offset": "0"}) as done:
                statuses.append(done.status)
                assert done.status == 200, await done.text()
            async with http.post(url, data=data, headers={"X-Goog-Upload-Command": "upload, finalize",
                                                          "X-Goog-Upload-Offset": "0"}) as again:
                statuses.append(again.status)  # used once; a second use, wherever it lands: 404 or admitted
    assert statuses[0::2] == [200] * 20
    assert len(request_pids(served)) == 2  # the uploads did cross workers
