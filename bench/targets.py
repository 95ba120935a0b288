"""Server processes under test: start on a free port, wait until ready, read /proc, stop by pid.

Every process the bench starts is registered in a ``Processes`` registry whose ``stop_all`` runs
in a ``finally``: SIGTERM by pid, then SIGKILL after a grace period, descendants included.
Targets: the fake upstream (``direct``), the peers' bare proxy, projectionist (on its defaults unless a
row says otherwise), LiteLLM and the Portkey gateway.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
LITELLM_KEY = "sk-bench"


class TargetFailed(RuntimeError):
    """A server did not come up (exited, or never answered before the deadline)."""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_base(self) -> str:
        """projectionist's console and admin API: its own listener, on the port after the proxy's."""
        return f"http://127.0.0.1:{self.port + 1}"

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_pair() -> int:
    """A port that is free and whose next one is free too (projectionist's console listens on
    ``port + 1``)."""
    while True:
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(tree.get(current, []))
    return out


def cpu_ticks(pids: Iterable[int]) -> int:
    """utime + stime (clock ticks) summed over ``pids``; vanished processes count 0."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)
    return total


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of ``pid`` in MB (MiB)."""
    out: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


class Processes:
    """Registry of started servers; ``stop_all`` must run in a ``finally``."""

    def __init__(self, workdir: Path, loop: str = "asyncio") -> None:
        self.workdir = workdir
        self.started: list[Proc] = []
        #: Event loop of every aiohttp server started (asyncio or uvloop): the same for all targets.
        self.loop = loop

    def start(self, name: str, argv: list[str], env: Mapping[str, str], port: int,
              ready_path: str = "/", need_200: bool = False, timeout: float = 30.0, cwd: Path | None = None) -> Proc:
        log_path = self.workdir / f"{name}.log"
        try:
            with open(log_path, "wb") as log:
                popen = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd or ROOT, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        except OSError as error:
            raise TargetFailed(f"{name} could not be started: {error}") from None
        proc = Proc(name, popen, port, log_path)
        self.started.append(proc)
        try:
            self._wait_ready(proc, ready_path, need_200, timeout)
        except TargetFailed:
            self.stop(proc)
            raise
        return proc

    @staticmethod
    def _wait_ready(proc: Proc, path: str, need_200: bool, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = proc.popen.poll()
            if code is not None:
                raise TargetFailed(f"{proc.name} exited with code {code}:\n{proc.log_tail()}")
            try:
                with urllib.request.urlopen(proc.base + path, timeout=2):
                    return
            except urllib.error.HTTPError as error:
                if not need_200:
                    return  # any HTTP answer means the server is listening
                error.close()
            except OSError:
                pass
            time.sleep(0.05)
        raise TargetFailed(f"{proc.name} did not answer {path} within {timeout:.0f} s:\n{proc.log_tail()}")

    def stop(self, proc: Proc, grace: float = 5.0) -> None:
        if proc in self.started:
            self.started.remove(proc)
        family = process_tree(proc.pid) if proc.popen.poll() is None else []
        if family:
            _signal(proc.pid, signal.SIGTERM)
            try:
                proc.popen.wait(grace)
            except subprocess.TimeoutExpired:
                _signal(proc.pid, signal.SIGKILL)
                proc.popen.wait()
        for pid in family[1:]:  # descendants that outlived their parent
            _signal(pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for proc in reversed(list(self.started)):
            self.stop(proc)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --- the targets -------------------------------------------------------------------------------


#: Where the reference programs (fake upstream, bare proxy) are looked for by default.
DEFAULT_PEERS = ROOT.parent / "shared" / "peers"


@dataclass(frozen=True)
class Peers:
    """Reference programs from the shared peers directory (absent: built-in fake upstream only)."""

    dir: Path | None

    @property
    def fake_upstream(self) -> Path | None:
        return self.dir / "fake_upstream.py" if self.dir else None

    @property
    def bare_proxy(self) -> Path | None:
        return self.dir / "bare_proxy.py" if self.dir else None


def start_upstream(procs: Processes, peers: Peers, name: str = "upstream", chunk_delay_ms: int = 0) -> Proc:
    port = free_port()
    env = {"PORT": str(port), "N_CHUNKS": "20", "CHUNK_DELAY_MS": str(chunk_delay_ms),
           "UVLOOP": "1" if procs.loop == "uvloop" else "0"}
    script = [str(peers.fake_upstream)] if peers.fake_upstream else ["-m", "bench.fake_upstream"]
    return procs.start(name, [sys.executable, *script], env, port)


def start_bare(procs: Processes, peers: Peers, upstream: Proc, name: str = "bare", loop: str | None = None) -> Proc:
    """The peers' bare aiohttp proxy, on ``loop`` (default: the run's ``--loop``)."""
    assert peers.bare_proxy is not None
    port = free_port()
    uvloop = (loop or procs.loop) == "uvloop"
    return procs.start(name, [sys.executable, str(peers.bare_proxy)],
                       {"PORT": str(port), "UPSTREAM": upstream.base, "UVLOOP": "1" if uvloop else "0"}, port)


def projectionist_config(upstream: Proc, log_level: str | None, cache_max_bytes: int | None,
                         extra_toml: str = "") -> str:
    """Defaults everywhere (event loop, logging, recording) but the upstream and what a row names."""
    lines = ["[upstreams.openai]", 'format = "openai"', f'url = "{upstream.base}"', ""]
    if log_level is not None:
        lines += ["[logging]", f'level = "{log_level}"', ""]
    if cache_max_bytes is not None:
        lines += ["[cache]", f"max_bytes = {cache_max_bytes}", ""]
    return "\n".join(lines) + extra_toml


def start_projectionist(procs: Processes, upstream: Proc, name: str, admin_token: str,
                        log_level: str | None = None, cache_max_bytes: int | None = None, workers: int = 1,
                        data_dir: Path | None = None, extra_toml: str = "", tree: Path | None = None) -> Proc:
    """``projectionist serve`` on its defaults; ``log_level``, ``cache_max_bytes`` and ``workers``
    change what a row says they change, and nothing else. ``tree``: a folder holding another
    checkout named ``projectionist`` (``checkout``), served instead of this one."""
    home = procs.workdir / name
    home.mkdir(exist_ok=True)
    config = home / "projectionist.toml"
    config.write_text(projectionist_config(upstream, log_level, cache_max_bytes, extra_toml))
    port = free_pair()
    argv = [sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--config", str(config), "--port", str(port),
            "--data-dir", str(data_dir or home / "data")]
    if workers != 1:
        argv += ["--workers", str(workers)]
    env = {"PROJECTIONIST_ADMIN_TOKEN": admin_token}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return procs.start(name, argv, env, port, "/healthz", need_200=True, cwd=tree / "projectionist" if tree else None)


#: The commit of the previous release, which P1 is measured against side by side (``--previous``).
PREVIOUS_RELEASE = ROOT / "bench" / "PREVIOUS_RELEASE"


def previous_release() -> str:
    """The revision ``PREVIOUS_RELEASE`` names (its first word; the rest says what it is)."""
    return PREVIOUS_RELEASE.read_text().split()[0]


def checkout(revision: str, into: Path) -> Path:
    """``revision`` of this repository as ``into/projectionist`` (``git archive``: no worktree
    left behind); returns ``into``, for ``start_projectionist(tree=...)``. ``TargetFailed`` when
    git cannot give it (no git, a shallow clone, an unknown revision)."""
    target = into / "projectionist"
    target.mkdir(parents=True, exist_ok=True)
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision],
                                 capture_output=True, check=True, timeout=120)
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, capture_output=True, check=True,
                       timeout=120)
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", b"") or b""
        raise TargetFailed(f"cannot check out {revision}: {detail.decode(errors='replace').strip() or error}") from None
    return into


PORTKEY_VERSION = "1.15.2"
PORTKEY_MAIN = Path("node_modules/@portkey-ai/gateway/build/start-server.js")


def find_portkey(explicit: str | None) -> tuple[Path | None, str]:
    """(dir, '') when ``npm install @portkey-ai/gateway@1.15.2`` was run in a folder found, else (None, why)."""
    candidates = [Path(explicit)] if explicit else []
    if os.environ.get("PORTKEY_DIR"):
        candidates.append(Path(os.environ["PORTKEY_DIR"]))
    candidates += [ROOT.parent / "portkey", ROOT / "portkey"]
    for folder in candidates:
        if (folder / PORTKEY_MAIN).exists():
            return folder, ""
    if shutil.which("node") is None:
        return None, "node is not installed"
    return None, (f"no Portkey gateway found (no {PORTKEY_MAIN} under --portkey, $PORTKEY_DIR or ../portkey); "
                  f"to include it: `mkdir DIR && cd DIR && npm install @portkey-ai/gateway@{PORTKEY_VERSION}`, "
                  "then --portkey DIR")


def portkey_headers(upstream: Proc) -> dict[str, str]:
    """What a client sends Portkey to reach an OpenAI-compatible upstream at a custom host."""
    return {"x-portkey-provider": "openai", "x-portkey-custom-host": f"{upstream.base}/v1"}


def start_portkey(procs: Processes, folder: Path, name: str = "portkey") -> Proc:
    port = free_port()
    argv = ["node", str(folder / PORTKEY_MAIN), f"--port={port}", "--headless"]
    return procs.start(name, argv, {"NODE_ENV": "production"}, port, "/", timeout=60.0)


def find_litellm(explicit: str | None, peers: Peers) -> tuple[Path | None, str]:
    """(venv, '') when a LiteLLM virtual environment with ``bin/litellm`` is found, else (None, why)."""
    candidates: list[Path] = []
    if explicit or os.environ.get("LITELLM_VENV"):
        candidates.append(Path(explicit or os.environ["LITELLM_VENV"]))
    else:
        for base in filter(None, [peers.dir, peers.dir.parent if peers.dir else None, ROOT, ROOT.parent]):
            candidates += [base / "litellm-venv", base / ".venv-litellm", base / "litellm" / ".venv"]
        on_path = shutil.which("litellm")
        if on_path:
            candidates.append(Path(on_path).resolve().parent.parent)
    for venv in candidates:
        if (venv / "bin" / "litellm").exists():
            return venv, ""
    return None, ("no LiteLLM virtual environment found (no bin/litellm in --litellm-venv, $LITELLM_VENV, on PATH, "
                  "or in litellm-venv/.venv-litellm beside the repository or the peers dir); to include it: "
                  "`python3 -m venv DIR && DIR/bin/pip install 'litellm[proxy]'`, then --litellm-venv DIR")


def start_litellm(procs: Processes, venv: Path, upstream: Proc) -> Proc:
    config = procs.workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: fake-model\n"
        "    litellm_params:\n"
        "      model: openai/fake-model\n"
        f"      api_base: {upstream.base}/v1\n"
        "      api_key: sk-fake\n"
        "litellm_settings: {telemetry: false, drop_params: true, turn_off_message_logging: true, callbacks: []}\n"
        "general_settings: {disable_spend_logs: true, disable_error_logs: true, "
        "allow_requests_on_db_unavailable: true}\n")
    port = free_port()
    env = {"LITELLM_MASTER_KEY": LITELLM_KEY, "LITELLM_TELEMETRY": "False", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    argv = [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    return procs.start("litellm", argv, env, port, "/health/liveliness", need_200=True, timeout=120.0)
