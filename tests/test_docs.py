"""The README and the documentation site (``docs/``, ``mkdocs.yml``) say only what is true: the site
builds with ``mkdocs build --strict`` (a broken link or anchor fails it), the README stays small and
its links land, every shell command either shows is run here (``COVERED`` names the test for each),
and the tables that restate the code (config keys, CLI verbs, client versions, start-up codes) are
held to it."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from projectionist.policy.errors import STARTUP_CODES
from projectionist.proxy.config import load_config
from projectionist.proxy.ops.cli import build_parser
from tests.conftest import Harness
from tests.imaging import make_image
from tests.paths import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
BIN = Path(sys.prefix) / "bin"  # the venv the tests run in: its mkdocs, its projectionist
HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
SHELLS = ("sh", "bash", "console")

#: Every shell command the README and the docs show, and the test (in this module) that runs it.
#: That test reads the very block the command stands in (it names the page and the heading).
COVERED: dict[str, str] = {
    "projectionist prune --older-than 7": "test_the_retention_commands_run_as_shown",
    "projectionist prune --older-than 0 --session s1 --json": "test_the_retention_commands_run_as_shown",
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/projectionist demo":
        "test_the_demo_runs_on_a_fresh_checkout_as_shown",
    "PROJECTIONIST_CLIENT_TOKENS=tok-1 .venv/bin/projectionist serve --config config/replicas.example.toml":
        "test_the_demo_runs_on_a_fresh_checkout_as_shown",
    "apt-get update && apt-get install -y chromium chromium-driver && python3 -m venv .venv && "
    ".venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest":
        "test_the_test_command_is_what_ci_runs",
    "export PROJECTIONIST_ADMIN_TOKEN=$(openssl rand -hex 16)": "test_serve_and_an_upload_run_as_shown",
    ".venv/bin/projectionist serve": "test_serve_and_an_upload_run_as_shown",
    "curl -s --data-binary @shot.png -H 'Content-Type: image/png' 'http://127.0.0.1:8787/v1/attachments?name=shot.png'":
        "test_serve_and_an_upload_run_as_shown",
    "export OPENAI_BASE_URL=http://127.0.0.1:8787/s/my-session/v1":
        "test_the_sdks_take_the_proxy_from_the_environment_as_shown",
    "export ANTHROPIC_BASE_URL=http://127.0.0.1:8787/s/my-session":
        "test_the_sdks_take_the_proxy_from_the_environment_as_shown",
    "export OPENAI_API_KEY=${OPENAI_API_KEY:-key-held-by-the-proxy} ANTHROPIC_API_KEY=${ANTHROPIC_API_KEY:-key-held-by-the-proxy}":
        "test_the_sdks_take_the_proxy_from_the_environment_as_shown",
    "PROJECTIONIST_PG_DSN=postgresql://proxy@db.internal:5432/projectionist "
    "AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... PROJECTIONIST_ADMIN_TOKEN=... PROJECTIONIST_CLIENT_TOKENS=... "
    "projectionist serve --config config/replicas.example.toml":
        "test_a_replica_starts_as_shown",
    "projectionist sessions --data-dir /tmp/wf/data": "test_the_replay_walkthrough_runs_as_shown",
    "projectionist timeline agent-7 --data-dir /tmp/wf/data": "test_the_replay_walkthrough_runs_as_shown",
    "projectionist replay agent-7 --data-dir /tmp/wf/data": "test_the_replay_walkthrough_runs_as_shown",
    "projectionist replay agent-7 --show --data-dir /tmp/wf/data":
        "test_the_replay_walkthrough_runs_as_shown",
    "projectionist replay agent-7 --diff --config debug.toml --data-dir /tmp/wf/data":
        "test_the_replay_walkthrough_runs_as_shown",
    "projectionist replay agent-7 --seq 1 --data-dir /tmp/wf/data":
        "test_the_replay_walkthrough_runs_as_shown",
}


# --- reading the pages ---------------------------------------------------------------------------

def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def section(path: str, heading: str) -> str:
    """The text under ``heading`` (any level) in ``path``, up to the next heading of that level or above."""
    lines = (ROOT / path).read_text().splitlines()
    fenced, start, level = False, -1, 0
    for i, line in enumerate(lines):
        fenced ^= bool(FENCE.match(line))
        m = None if fenced else HEADING.match(line)
        if m and start < 0 and m.group(2) == heading:
            start, level = i + 1, len(m.group(1))
        elif m and start >= 0 and len(m.group(1)) <= level:
            return "\n".join(lines[start:i]) + "\n"
    assert start >= 0, f"{path} has no heading {heading!r}"
    return "\n".join(lines[start:]) + "\n"


def fenced_blocks(text: str) -> Iterator[tuple[str, str, str]]:
    """(language, body, the heading it stands under) of every fenced block of a Markdown text."""
    heading, lang, body = "", None, []
    for line in text.splitlines():
        m = FENCE.match(line)
        if lang is None and m:
            lang, body = m.group(1), []
        elif lang is not None and line.strip() == "```":
            yield lang, "\n".join(body) + "\n", heading
            lang = None
        elif lang is not None:
            body.append(line)
        elif (h := HEADING.match(line)) is not None:
            heading = h.group(2)


def block(path: str, heading: str, lang: str = "sh") -> str:
    """The one block of ``lang`` under ``heading`` of ``path``."""
    found = [body for kind, body, _ in fenced_blocks(section(path, heading)) if kind == lang]
    assert len(found) == 1, f"{path} § {heading}: {len(found)} {lang} blocks"
    return found[0]


def sh_commands(body: str) -> list[str]:
    """The commands of a sh/bash block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", body)
    commands = [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines()]
    return [c for c in commands if c and not c.startswith("#")]


def console_steps(body: str) -> list[tuple[str, list[str], list[str]]]:
    """(command, the output shown after it, narration lines ``# ...`` shown before it) of a console block."""
    steps: list[tuple[str, list[str], list[str]]] = []
    narration: list[str] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((re.sub(r"\s+#\s.*$", "", line[2:]).strip(), [], narration))
            narration = []
        elif line.startswith("# "):
            narration.append(line[2:])
        elif steps:
            steps[-1][1].append(line)
    return steps


def commands_of(lang: str, body: str) -> list[str]:
    return [c for c, _, _ in console_steps(body)] if lang == "console" else sh_commands(body)


def shown_commands() -> dict[str, list[tuple[str, str]]]:
    """Every shell command of the README and the docs, with the (page, heading) of each block it stands in."""
    shown: dict[str, list[tuple[str, str]]] = {}
    for path in pages():
        for lang, body, heading in fenced_blocks(path.read_text()):
            if lang in SHELLS:
                for command in commands_of(lang, body):
                    shown.setdefault(command, []).append((name(path), heading))
    return shown


def run_shell(script: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without a provider's key or base URL or the proxy's own tokens, and with
    this venv's programs on the path (``projectionist``, as an installed one would be)."""
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL", "_API_BASE"))
           and not (k.startswith("PROJECTIONIST_") and k != "PROJECTIONIST_TEST_PG_DSN")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


# --- the site and the README ---------------------------------------------------------------------

def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr[-5000:]
    assert (tmp_path / "site" / "index.html").is_file()
    for image in DOCS.glob("*.png"):  # the inspector's screenshots are shown, not only kept
        assert (tmp_path / "site" / image.name).is_file()
        assert any(f"../{image.name}" in p.read_text() for p in DOCS.rglob("*.md")), image.name


def test_key_names_in_the_reference_tables_are_never_broken_mid_word(tmp_path: Path) -> None:
    """The newcomer read ``client_max_`` / ``size``: in a real browser at a narrow window, every key
    and default of the configuration reference is one line, and no code block is cut at the edge."""
    from tests.browser import chromium

    built = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr[-5000:]
    with chromium(900, 1200) as driver:
        for page in ("reference/config", "reference/errors", "operations/admin", "clients"):
            driver.get((tmp_path / "site" / page / "index.html").as_uri())
            broken = driver.execute_script(
                "return [...document.querySelectorAll('td:first-child code, td:nth-child(2) code')]"
                ".filter(c => c.getClientRects().length > 1).map(c => c.textContent)")
            assert broken == [], (page, broken)
            cut = driver.execute_script(
                "return [...document.querySelectorAll('pre > code')].filter(c => c.scrollWidth > c.clientWidth + 1"
                " && getComputedStyle(c).overflowX !== 'auto').length")
            assert cut == 0, page
            if page == "reference/config":
                assert driver.execute_script("return document.querySelectorAll('td:first-child code').length") > 50


def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    """The validation settings of mkdocs.yml make --strict refuse what a reader would find broken."""
    for broken in ("[gone](no-such-page.md)", "[gone](clients.md#no-such-heading)"):
        shutil.rmtree(tmp_path / "copy", ignore_errors=True)
        shutil.copytree(DOCS, tmp_path / "copy" / "docs")
        shutil.copy(ROOT / "mkdocs.yml", tmp_path / "copy" / "mkdocs.yml")
        with (tmp_path / "copy" / "docs" / "index.md").open("a") as index:
            index.write(f"\n{broken}\n")
        built = mkdocs_build(tmp_path / "copy" / "mkdocs.yml", tmp_path / "site")
        assert built.returncode != 0, broken


def test_the_readme_is_at_most_15_kb() -> None:
    assert len(README.read_bytes()) <= 15 * 1024


def slugs(path: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub and mkdocs' toc both make them for plain headings."""
    anchors = set()
    fenced = False
    for line in path.read_text().splitlines():
        fenced ^= bool(FENCE.match(line))
        if not fenced and (m := HEADING.match(line)):
            text = re.sub(r"[`*\[\]]", "", m.group(2)).lower()
            anchors.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text)).strip("-"))
    return anchors


def links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_the_readmes_links_land() -> None:
    """Relative links point at files that exist (and at headings they hold); http(s) links are well
    formed (they cannot be fetched here)."""
    found = links(README.read_text())
    assert len(found) > 10
    for link in found:
        if link.startswith(("http://", "https://")):
            parts = urlsplit(link)
            assert parts.netloc and "." in parts.netloc and " " not in link, link
            continue
        assert not link.startswith(("/", "file:")), link
        target, _, anchor = link.partition("#")
        path = (README.parent / target) if target else README
        assert path.exists(), link
        if anchor:
            assert anchor in slugs(path), link


def test_every_external_link_is_well_formed() -> None:
    """mkdocs checks the site's own links; links out of it cannot be fetched here, so their form is checked."""
    external = [link for path in pages() for link in links(path.read_text()) if "://" in link]
    assert len(external) >= 4
    for link in external:
        parts = urlsplit(link)
        assert parts.scheme == "https" and "." in parts.netloc and not parts.username, link


def test_the_bench_readme_links_land() -> None:
    for link in links((ROOT / "bench" / "README.md").read_text()):
        assert (ROOT / "bench" / link.partition("#")[0]).exists(), link


def test_only_the_design_notes_name_module_paths_and_each_exists() -> None:
    """Module paths move (proxy/ is being reorganised): one page names them, and none is stale."""
    module = re.compile(r"(?<![\w/])(?:policy|adapters|proxy)/[\w/]+\.py\b")
    for path in pages():
        if path != DOCS / "design.md":
            assert module.findall(path.read_text()) == [], name(path)
    named = set(module.findall((DOCS / "design.md").read_text()))
    assert len(named) > 5
    assert {p for p in named if not (ROOT / p).is_file()} == set()


# --- every shell command shown is run ------------------------------------------------------------

def test_every_shown_command_is_run_by_the_test_named_for_it() -> None:
    shown = shown_commands()
    assert set(shown) == set(COVERED), "a command shown in the docs needs a test here that runs it (COVERED)"
    for command, places in shown.items():
        test = globals()[COVERED[command]]
        source = inspect.getsource(test)
        for page, heading in places:
            assert f'"{page}"' in source and f'"{heading}"' in source, (command, page, heading, COVERED[command])


def checkout_copy(to: Path) -> Path:
    """The checkout's files as a fresh clone would have them (tracked and new, not ignored), in ``to``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = ROOT / rel
        if source.is_file() and not source.is_symlink():
            (to / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / rel)
    return to


def test_the_demo_runs_on_a_fresh_checkout_as_shown(tmp_path: Path) -> None:
    """The README's first command, verbatim, in a copy of the checkout: a new venv, the base install
    (the embedded default, no extras), the demo printing what the README and the guide show. On
    that base install a backend without its extra is the one line the backends page shows."""
    [command] = sh_commands(block("README.md", "The demo"))
    assert sh_commands(block("docs/guide/index.md", "The demo")) == [command]
    shown = block("README.md", "The demo", "text")
    assert block("docs/guide/index.md", "The demo", "text") == shown
    work = checkout_copy(tmp_path / "checkout")
    env = {k: v for k, v in clean_env().items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(str(ROOT)))
    ran = run_shell(command, work, env, timeout=900)
    assert ran.returncode == 0, ran.stderr[-3000:]
    demo = ran.stdout[ran.stdout.index("projectionist demo: proxy on http://127.0.0.1:"):]  # after pip's lines
    first, blank, *story = demo.splitlines(keepends=True)
    assert blank == "\n" and "".join(story) == shown

    [(extra, output, _)] = console_steps(block("docs/operations/backends.md", "Extras", "console"))
    refused = run_shell(extra, work, env)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == output


def ci_steps(line: str) -> list[str]:
    """A command's words without what changes only its noise: env settings, quiet flags, redirections;
    ``.venv/bin/pip`` is ``.venv/bin/python -m pip``."""
    words = [w for w in shlex.split(line) if not re.fullmatch(r"[A-Z_]+=.*|-qq?|--quiet|>/dev/null", w)]
    return ["python3" if w == ".venv/bin/python3" else w for w in
            " ".join(words).replace(".venv/bin/pip ", ".venv/bin/python -m pip ").split()]


def test_the_test_command_is_what_ci_runs() -> None:
    """The README's (and the guide's) test command is what .ci/run runs, step for step and in order,
    with the docs' strict build before the tests."""
    [command] = sh_commands(block("README.md", "The tests"))
    assert sh_commands(block("docs/guide/index.md", "The tests")) == [command]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.strip().startswith("#")]
    at = 0
    for step in command.split(" && "):
        matches = [i for i, line in enumerate(ci) if i >= at and ci_steps(line) == ci_steps(step)]
        assert matches, f"{step!r} is not in .ci/run (after line {at})"
        at = matches[0] + 1
    build = [i for i, line in enumerate(ci) if ".venv/bin/mkdocs build --strict" in line]
    assert build and build[0] < ci.index(".ci/typecheck") < ci.index(".venv/bin/python -m pytest")


def free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def start(script: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A shown command that serves, started in a process group of its own, once it answers /healthz."""
    assert free(8787) and free(8788), "the documented commands listen on 127.0.0.1:8787 and :8788; both are in use"
    process = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        try:
            if get("http://127.0.0.1:8787/healthz")[0] == 200:
                return process
        except (OSError, ValueError):
            time.sleep(0.2)
    stop(process)
    pytest.fail("the shown command did not answer /healthz within 60 s")


def stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM to the process group started for it (SIGKILL after 20 s); its stdout and stderr."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.communicate()


def environment_of_serve(group: int) -> dict[str, str]:
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
            if argv and os.getpgid(int(proc.name)) == group and b"serve" in argv and b"bash" not in argv[0]:
                pairs = (proc / "environ").read_bytes().split(b"\0")
                return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)
        except (OSError, ProcessLookupError):
            continue
    raise AssertionError("no serve process in the group")


def test_serve_and_an_upload_run_as_shown(tmp_path: Path) -> None:
    """`projectionist serve` as shown, in a folder with `.venv` (this one): it listens where it says,
    keeps its data in ./.projectionist, and the admin token it was given guards the console; the
    upload shown, run there with a shot.png, answers what the page shows."""
    (tmp_path / ".venv").symlink_to(sys.prefix)
    serve = block("docs/operations/config.md", "Running the proxy")
    assert sh_commands(serve) == ["export PROJECTIONIST_ADMIN_TOKEN=$(openssl rand -hex 16)", ".venv/bin/projectionist serve"]
    process = start(serve, tmp_path, clean_env())
    try:
        assert (tmp_path / ".projectionist" / "sessions.sqlite3").is_file()
        status, body = get("http://127.0.0.1:8788/admin/sessions")
        assert (status, body["error"]["code"]) == (401, "ADMIN_UNAUTHORIZED")
        token = environment_of_serve(process.pid)["PROJECTIONIST_ADMIN_TOKEN"]
        assert re.fullmatch(r"[0-9a-f]{32}", token)
        assert get("http://127.0.0.1:8788/admin/sessions", {"Authorization": f"Bearer {token}"}) == (200, {"sessions": []})

        upload = block("docs/guide/references.md", "Uploading")
        [command] = sh_commands(upload)
        (tmp_path / "shot.png").write_bytes(make_image(12, 8))
        ran = run_shell(command, tmp_path, clean_env())
        assert ran.returncode == 0, ran.stderr
        answer = json.loads(ran.stdout)
        documented = "".join(line.lstrip("# ") for line in upload.splitlines() if line.startswith("#"))
        assert list(answer) == re.findall(r'"(\w+)":', documented.replace('"variants":{}', '"variants":'))
        assert (answer["media_type"], answer["width"], answer["height"], answer["name"]) == ("image/png", 12, 8, "shot.png")
        assert answer["url"] == f"attachment:{answer['id']}?name=shot.png"
        assert answer["href"] == f"http://127.0.0.1:8787/v1/attachments/{answer['id']}.png?name=shot.png"
    finally:
        printed, _ = stop(process)
    # what it printed once it listened is what the page shows
    assert printed == block("docs/operations/config.md", "Where the console is", "text")


def test_a_replica_starts_as_shown(tmp_path: Path) -> None:
    """The replicas' command, verbatim with its example values: it starts, and since those hosts are
    nowhere here, /readyz names both backends unready (the extras are installed in this venv)."""
    (tmp_path / "config").symlink_to(ROOT / "config")
    [command] = sh_commands(block("docs/operations/backends.md", "Running many replicas"))
    process = start(command, tmp_path, clean_env())
    try:
        status, body = get("http://127.0.0.1:8787/readyz")
        assert status == 503 and body["status"] == "unready", body
        assert body["checks"]["log"] != "ok" and body["checks"]["store"] != "ok"
    finally:
        _, stderr = stop(process)
    assert "MISSING_EXTRA" not in stderr and '"client_tokens":true' in stderr.replace(" ", "")


@pytest.fixture
async def live(make_harness: Callable[..., Awaitable[Harness]]) -> Harness:
    return await make_harness(**{"record.mode": "metadata"})


async def test_the_sdks_take_the_proxy_from_the_environment_as_shown(live: Harness, tmp_path: Path) -> None:
    """With only the exports shown, `OpenAI()` and `Anthropic()` reach the proxy, in the session the
    base URL names."""
    exports = block("docs/clients.md", "With the official SDKs")
    base = str(live.client.make_url("")).rstrip("/")
    program = ("from openai import OpenAI; from anthropic import Anthropic; "
               "OpenAI().chat.completions.create(model='gpt-4o', messages=[{'role': 'user', 'content': 'hi'}]); "
               "Anthropic().messages.create(model='claude-sonnet-4-5', max_tokens=16, "
               "messages=[{'role': 'user', 'content': 'hi'}])")
    script = exports.replace("http://127.0.0.1:8787", base) + f'exec "{sys.executable}" -c "{program}"\n'
    process = await asyncio.create_subprocess_exec("bash", "-c", script, cwd=tmp_path, env=clean_env(),
                                                   stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()[-3000:]
    assert [r.path_qs for r in live.upstream.received] == ["/v1/chat/completions", "/v1/messages"]
    assert live.upstream.received[0].headers.get("Authorization") == "Bearer key-held-by-the-proxy"
    events = await live.events("my-session")
    assert [e["type"] for e in events] == ["request/recorded", "request/recorded"]


VOLATILE = ((r"\d{4}-\d\d-\d\dT[\d:.]+Z", "TIME"), (r"\b[0-9a-f]{8,}\b", "HEX"), (r"\b\d+ ms\b", "N ms"),
            (r"\b\d+ bytes\b", "N bytes"))


def masked(line: str) -> str:
    for pattern, replacement in VOLATILE:
        line = re.sub(pattern, replacement, line)
    return " ".join(line.split())


def matches_shown(shown: list[str], printed: list[str]) -> bool:
    """The output printed is the output shown, times, digests and ids aside; a shown `...` stands for any lines."""
    printed = [masked(line) for line in printed]
    at = 0
    for i, line in enumerate(shown):
        if line == "...":
            nxt = masked(shown[i + 1]) if i + 1 < len(shown) else None
            while at < len(printed) and printed[at] != nxt:
                at += 1
            continue
        if at >= len(printed) or printed[at] != masked(line):
            return False
        at += 1
    return at == len(printed)


async def test_the_replay_walkthrough_runs_as_shown(make_harness: Callable[..., Awaitable[Harness]],
                                                    tmp_path: Path) -> None:
    """The agent session the walkthrough tells, then each command it shows, with the output it shows."""
    config = block("docs/guide/replay.md", "A walkthrough", "toml")
    harness = await make_harness(**{"record.mode": "full", "store.stamp_ttl": 0})
    (tmp_path / "debug.toml").write_text(config.replace("http://127.0.0.1:9000", harness.upstream.url))
    assert load_config(tmp_path / "debug.toml").record.mode == "full"
    diagram, screenshot = make_image(3, 2, color=40), make_image(2, 3, color=90)
    ids = [await harness.admit(diagram, name="diagram.png"), await harness.admit(screenshot, name="screenshot.png")]
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What changed between the diagram and the screenshot?"},
        *({"type": "image_url", "image_url": {"url": f"attachment:{i}?name={n}"}}
          for i, n in zip(ids, ("diagram.png", "screenshot.png")))]}]}

    async def send(session: str, sent: dict[str, Any]) -> None:
        resp = await harness.client.post("/v1/chat/completions", json=sent, headers={"X-Session-Id": session})
        assert resp.status == 200, await resp.text()
        await harness.events(session)  # its record is written before the next step (one order to show)

    await send("agent-7", body)
    await harness.remove(ids[1])
    await send("agent-7", body)
    await send("scratch", {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]})
    data = tmp_path / "data"  # make_config's data dir
    actions = {"after re-admitting screenshot.png (POST /v1/attachments with its bytes):":
               lambda: harness.admit(screenshot, name="screenshot.png")}
    for command, shown, narration in console_steps(block("docs/guide/replay.md", "A walkthrough", "console")):
        for said in narration:
            await actions[said]()
        while shown and not shown[-1].strip():
            shown = shown[:-1]
        expected_exit = 0
        if shown and (m := re.fullmatch(r"\(exit (\d+)\)", shown[-1])):
            expected_exit, shown = int(m.group(1)), shown[:-1]
        # --diff sends to the fake upstream, served by this test's loop: the command runs beside it
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", command.replace("/tmp/wf/data", str(data)), cwd=tmp_path, env=clean_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 120)
        printed = out.decode()
        assert process.returncode == expected_exit, (command, err.decode())
        assert matches_shown(shown, printed.rstrip("\n").splitlines()), f"$ {command}\n{printed}"


# --- tables that restate the code ----------------------------------------------------------------

def toml_blocks() -> Iterator[tuple[str, str]]:
    for path in pages():
        for lang, body, heading in fenced_blocks(path.read_text()):
            if lang == "toml":
                yield f"{name(path)} § {heading}", body


def test_every_toml_block_shown_is_a_config_the_proxy_takes(tmp_path: Path) -> None:
    shown = list(toml_blocks())
    assert len(shown) >= 4
    for where, body in shown:
        (tmp_path / "shown.toml").write_text(body)
        load_config(tmp_path / "shown.toml")  # an unknown key or a wrong type raises


def reference_rows() -> dict[str, str]:
    """``section.key`` -> the default shown, from the configuration reference's tables."""
    rows: dict[str, str] = {}
    current = ""
    for line in (DOCS / "reference" / "config.md").read_text().splitlines():
        if m := re.fullmatch(r"## \[([\w.]+)\]", line):
            current = m.group(1)
        elif current and (m := re.match(r"\| `(\w+)` \| (.*?) \|", line)):
            rows[f"{current}.{m.group(1)}"] = m.group(2)
    return rows


def test_the_configuration_reference_is_the_config_file() -> None:
    documented = tomllib.loads((ROOT / "config" / "projectionist.toml").read_text())
    expected: dict[str, Any] = {}

    def walk(table: dict[str, Any], prefix: str) -> None:
        for key, value in table.items():
            if prefix == "upstreams.":
                for inner, default in value.items():
                    expected.setdefault(f"upstreams.NAME.{inner}", default)
            elif isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                expected[f"{prefix}{key}"] = value
    walk(documented, "")
    rows = reference_rows()
    assert set(rows) == set(expected)
    for key, default in expected.items():
        if key.startswith("upstreams.NAME.") and key.rsplit(".", 1)[1] in ("format", "url"):
            continue
        assert rows[key] == f"`{json.dumps(default) if not isinstance(default, float) else default}`", key


def test_the_admin_verbs_table_is_the_cli() -> None:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    verbs = section("docs/operations/admin.md", "The admin verbs")
    rows = re.findall(r"^\| `(\w+)` \| `projectionist (\w+)([^`]*)` \|", verbs, re.M)
    assert {r[0] for r in rows} == set(sub.choices) - {"serve", "demo"}
    for verb, again, usage in rows:
        assert verb == again
        flags = {o for a in sub.choices[verb]._actions for o in a.option_strings}
        assert set(re.findall(r"--[\w-]+", usage)) <= flags, verb


def test_the_client_versions_shown_are_the_ones_tested() -> None:
    from tests import agents, aider, thirdparty
    table = section("README.md", "Protected with nothing but a base URL")
    assert f"Claude Code ({', '.join((*agents.CLAUDE_CODE_VERSIONS, agents.CURRENT_CLAUDE_CODE))})" in table
    for package, version, _ in agents.MORE_AGENTS:
        named = {"@google/gemini-cli": "Gemini CLI", "@qwen-code/qwen-code": "Qwen Code", "opencode-ai": "OpenCode",
                 "@mariozechner/pi-coding-agent": "pi", "cline": "Cline CLI"}[package]
        assert f"{named} ({version})" in table, package
    assert f"Codex CLI ({agents.CODEX_VERSION})" in table and f"aider ({aider.AIDER})" in table
    clients = section("docs/clients.md", "Third-party clients")
    shown = dict(re.findall(r"^\| `?([\w-]+)`?(?: \(CLI\))? ([\d.]+)", clients.replace("LiteLLM", "litellm"), re.M))
    assert {k: shown.get(k) for k in thirdparty.CLIENTS} == dict(thirdparty.CLIENTS)


def test_the_start_up_codes_shown_are_the_registered_ones() -> None:
    shown = set(re.findall(r"`([A-Z_]+)`", section("docs/reference/errors.md", "Start-up codes")))
    assert shown == set(STARTUP_CODES)


def test_every_dated_benchmark_file_is_linked_from_the_bench_page() -> None:
    index = (DOCS / "benchmarks" / "index.md").read_text()
    dated = sorted(p.name for p in (DOCS / "benchmarks").glob("20*.md"))
    assert dated and all(f"({d})" in index for d in dated)


def test_the_readme_names_the_latest_bench_report_with_its_date() -> None:
    """Issue 42: a reader finds the newest dated report from the README, and its date (a day may
    hold several reports: the README names one of the newest day's)."""
    reports = [p.name for p in (DOCS / "benchmarks").glob("20*.md")]
    newest = max(name[:10] for name in reports)
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"latest bench report: \[(\d{4}-\d{2}-\d{2})[^\]]*\]\(docs/benchmarks/([^)]+)\)", readme)
    assert found is not None
    assert found[2] in reports and found[2].startswith(newest) and found[1] == newest


async def test_the_retention_commands_run_as_shown(tmp_path: Path) -> None:
    """Each ``prune`` command of the retention section, run as shown in a folder whose default data
    dir holds a session ``s1`` with an old record and a state event."""
    from projectionist.policy.events import Quarantine, ResponseRecorded
    from projectionist.proxy.sessionlog.sqlite import SqliteLog

    times = iter(["2026-01-01T00:00:00.000Z", "2026-01-01T00:00:01.000Z"])
    log = SqliteLog(tmp_path / ".projectionist" / "sessions.sqlite3", clock=lambda: next(times))
    await log.append("s1", 0, [Quarantine(attachment_id="sha256:" + "a" * 64, failure="not_found", retryable=False)])
    await log.append("s1", None, [ResponseRecorded(request_id="r1", request_seq=1, status=200, latency_ms=1.0)],
                     durable=False)
    await log.close()
    shown = block("docs/guide/replay.md", "Retention", "bash")
    outputs = []
    for command in commands_of("bash", shown):
        done = run_shell(command.split("#")[0], tmp_path, clean_env())
        assert done.returncode == 0, (command, done.stderr)
        outputs.append(done.stdout)
    assert outputs[0].startswith("pruned 1 records in 1 sessions older than 7 days")
    assert json.loads(outputs[1])["records"] == 0  # pruned already by the first
