"""The aider CLI (``aider-chat``), run as its users run it (test support).

aider pins every dependency of its own (``litellm``, ``openai``, ``httpx``, ...) to versions that
conflict with ``.venv-clients`` (``tests/thirdparty.py``), so it gets a virtual environment of its
own, ``.venv-aider`` at the repository root, built the same way: pip from PyPI, once, behind a
lock, with a ready marker naming the pinned version. ``.ci/run`` builds it before the tests::

    .venv/bin/python -c 'from tests.aider import aider_python; aider_python()'

A test runs ``aider --message ...`` once (one turn, then it exits) in a temporary working folder
with a temporary ``HOME`` and nothing of this machine's configuration: no git, no release check,
no analytics, no model-metadata download, no browser, no prompts (``--yes-always``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.paths import ROOT
from tests.thirdparty import pinned_venv

#: The version tried.
AIDER: Final = "0.86.2"
VENV: Final = ROOT / ".venv-aider"
_READY: Final = VENV / ".projectionist-aider"


def requirements() -> list[str]:
    return [f"aider-chat=={AIDER}"]


def aider_python() -> Path:
    """aider's interpreter, building the environment first if it is missing or stale."""
    return pinned_venv(VENV, requirements(), _READY)


def aider_executable() -> Path:
    """The ``aider`` console script of ``.venv-aider`` (built first if needed)."""
    return aider_python().parent / "aider"


#: Flags for one non-interactive, offline turn: answer every question yes, exit after the message,
#: no git repository, no update/version check or install offers, no analytics, no model warnings,
#: no browser or GUI, no colours or pretty output (plain text to assert on), no streaming toggles
#: (aider streams by default; a test adds ``--no-stream`` when it wants to), no repo map, no
#: shell-command suggestions, no lint/test runs, no auto-commits.
OFFLINE_FLAGS: Final = (
    "--yes-always",
    "--no-git",
    "--no-gitignore",
    "--no-check-update",
    "--no-show-release-notes",
    "--no-analytics",
    "--no-show-model-warnings",
    "--no-check-model-accepts-settings",
    "--no-pretty",
    "--no-fancy-input",
    "--no-detect-urls",
    "--no-browser",
    "--disable-playwright",
    "--no-notifications",
    "--no-restore-chat-history",
    "--no-suggest-shell-commands",
    "--no-auto-commits",
    "--no-dirty-commits",
    "--no-auto-lint",
    "--no-auto-test",
    "--map-tokens", "0",
    "--encoding", "utf-8",
)

#: The environment of every run: nothing of this machine's, no home calls.
#: ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps litellm from fetching its price map from GitHub at import;
#: aider's own copy of that map (``~/.aider/caches/model_prices_and_context_window.json``, fetched
#: from GitHub when missing, empty or a day old) is seeded by the runner from litellm's bundled
#: backup, so it is never fetched.
QUIET_ENV: Final = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "NO_PROXY": "*",
    "no_proxy": "*",
    "TERM": "dumb",
    "PYTHONIOENCODING": "utf-8",
    "AIDER_ANALYTICS": "false",
    "AIDER_CHECK_UPDATE": "false",
    "AIDER_SHOW_RELEASE_NOTES": "false",
    "BROWSER": "/bin/false",
}


def bundled_prices() -> Path:
    """litellm's own copy of its model price map, inside ``.venv-aider``."""
    [found] = (VENV / "lib").glob("python3*/site-packages/litellm/model_prices_and_context_window_backup.json")
    return found


@dataclass(frozen=True)
class AiderRun:
    rc: int
    stdout: str
    stderr: str
    argv: tuple[str, ...]

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


async def run_aider(args: Sequence[str], env: Mapping[str, str], *, home: Path, cwd: Path | None = None,
                    files: Mapping[str, bytes] = {}, timeout: float = 180.0,
                    flags: Sequence[str] = OFFLINE_FLAGS) -> AiderRun:
    """Run ``aider <flags> <args>`` once in ``cwd`` (default ``home/work``) with ``HOME=home`` and
    only ``env`` on top of a minimal environment; ``files`` are written into ``cwd`` first (e.g.
    ``{"shot.png": data}``). Returns its exit code and output; a run that does not finish in
    ``timeout`` seconds is killed and fails the test."""
    executable = aider_executable()
    home.mkdir(parents=True, exist_ok=True)
    work = cwd if cwd is not None else home / "work"
    work.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (work / name).write_bytes(data)
    # aider's model metadata: an empty local file, and its price-map cache seeded and fresh, so it
    # never asks the network for one (ModelInfoManager fetches when the cache is missing or empty).
    metadata = home / ".aider.model.metadata.json"
    if not metadata.exists():
        metadata.write_text("{}")
    prices = home / ".aider" / "caches" / "model_prices_and_context_window.json"
    if not prices.exists():
        prices.parent.mkdir(parents=True, exist_ok=True)
        prices.write_bytes(bundled_prices().read_bytes())
    full = {"PATH": f"{executable.parent}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
            **QUIET_ENV, **env}
    argv = (str(executable), *flags, "--model-metadata-file", str(metadata), *args)
    process = await asyncio.create_subprocess_exec(*argv, env=full, cwd=str(work), stdin=asyncio.subprocess.DEVNULL,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"aider {list(args)} did not finish in {timeout} s") from None
    assert process.returncode is not None
    return AiderRun(process.returncode, out.decode(errors="replace"), err.decode(errors="replace"), argv)


if __name__ == "__main__":  # pragma: no cover - a developer's shortcut: build and print the path
    print(aider_executable())
