"""Third-party clients people point at a base URL, run as their users run them (test support).

``llm``, LiteLLM (as a client library), ``langchain-openai``, ``instructor`` and ``openai-agents``
are separate programs with their own pinned dependencies (LiteLLM pins an older ``openai`` than
the SDK tests use), so they live in their own virtual environment, ``.venv-clients`` at the
repository root. ``.ci/run`` builds it before the tests; on a developer machine the first test
that needs it builds it (pip, from PyPI). A test runs a client as a subprocess against a live
proxy on loopback and checks what reached the fake upstream and the session's log.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from tests.paths import ROOT

#: The versions tried (the README's client table names them).
CLIENTS: Final = {
    "llm": "0.36",
    "litellm": "1.110.2",
    "langchain-openai": "1.7.4",
    "instructor": "1.17.0",
    "openai-agents": "0.24.0",
}
VENV: Final = ROOT / ".venv-clients"
_READY: Final = VENV / ".projectionist-clients"


def requirements() -> list[str]:
    return [f"{name}=={version}" for name, version in sorted(CLIENTS.items())]


def pinned_venv(venv: Path, pins: list[str], ready: Path) -> Path:
    """The interpreter of ``venv`` holding exactly ``pins``, built first (pip, from PyPI) when it
    is missing or stale; ``ready`` names what was installed. A lock beside it: pytest-xdist
    workers or two checkouts' runs build it once."""
    wanted = "\n".join(pins)
    python = venv / "bin" / "python"
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists() and ready.read_text() == wanted and python.exists():
            return python
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True)
        ready.write_text(wanted)
    return python


def clients_python() -> Path:
    """The clients' interpreter, building the environment first if it is missing or stale."""
    return pinned_venv(VENV, requirements(), _READY)


#: What every client run gets: no telemetry home calls, no remote price maps, no keys of this machine.
QUIET_ENV: Final = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LLM_USER_PATH": "",  # set per run to a temporary folder
    "NO_PROXY": "*",
}


async def run_client(python: Path, script: str, env: Mapping[str, str], *, home: Path,
                     args: tuple[str, ...] = (), timeout: float = 120.0) -> str:
    """Run ``script`` (or, with ``args`` and an empty script, a console program of the clients'
    environment) and return its stdout; a non-zero exit fails with its stderr."""
    full = {"PATH": f"{python.parent}:{os.environ.get('PATH', '')}", "HOME": str(home),
            **QUIET_ENV, "LLM_USER_PATH": str(home / "llm"), **env}
    argv = [str(python), "-c", script] if script else [str(python.parent / args[0]), *args[1:]]
    process = await asyncio.create_subprocess_exec(*argv, env=full, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"client {argv[:3]} did not finish in {timeout} s") from None
    assert process.returncode == 0, f"client exited {process.returncode}:\n{err.decode(errors='replace')[-3000:]}"
    return out.decode()
