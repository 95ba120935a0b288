"""The container recipe and the sidecar examples (issue 37): the ``Dockerfile`` and
``config/deploy/`` are held to the package and to each other, and the image is built and started
the way the Dockerfile says as far as this machine allows. It has no Docker daemon and no registry
for a base image, so the test does what the Dockerfile's lines do on this machine's Python: copy
what its COPY lines name, run its pip install in a fresh virtual environment, start its CMD (and
the sidecars' commands) and run its health check and the pod's probes against it."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
import venv
from pathlib import Path
from typing import Any

import pytest
import yaml

from projectionist.proxy.config import load_config
from tests.paths import ROOT

DEPLOY = ROOT / "config" / "deploy"


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, (keyword, rest), continuation lines joined, comments out."""
    lines: list[str] = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + line.strip()
        elif line.strip() and not line.lstrip().startswith("#"):
            lines.append(line.strip())
    return [(keyword.upper(), rest) for keyword, _, rest in (line.partition(" ") for line in lines)]


def one(keyword: str) -> str:
    [rest] = [rest for kw, rest in instructions() if kw == keyword]
    return rest


def cmd() -> list[str]:
    command: list[str] = json.loads(one("CMD"))
    return command


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def pod() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "sidecar-pod.yaml").read_text())
    return loaded


def test_the_dockerfile_installs_and_runs_what_the_package_has() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert one("FROM").startswith("python:3.11") and ">=3.11" in project["requires-python"]
    for kw, rest in instructions():
        if kw == "COPY":
            *sources, _ = rest.split()
            assert all((ROOT / source).exists() for source in sources), rest
    install = shlex.split(one("RUN").split("&&")[0])
    extras = install[-1].removeprefix(".[").removesuffix("]").split(",")
    assert install[:2] == ["pip", "install"] and set(extras) <= set(project["optional-dependencies"])
    argv = cmd()
    assert argv[0] in project["scripts"] and argv[1] == "serve"
    exposed = set(one("EXPOSE").split())
    assert {flag(argv, "--port"), flag(argv, "--admin-listen").rpartition(":")[2]} == exposed
    assert json.loads(one("VOLUME")) == [flag(argv, "--data-dir")]
    assert str(load_config(None).server.port) == flag(argv, "--port")  # the port every doc names
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copied = {source.rstrip("/") for kw, rest in instructions() if kw == "COPY" for source in rest.split()[:-1]}
    assert copied and not copied & ignored  # the build context keeps what the image copies


def test_the_sidecars_reach_the_proxy_on_localhost_with_their_own_keys() -> None:
    services = compose()["services"]
    proxy, agent = services["proxy"], services["agent"]
    argv = proxy["command"]
    port = flag(argv, "--port")
    assert flag(argv, "--host") == "127.0.0.1" and agent["network_mode"] == "service:proxy"
    assert agent["environment"]["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/v1"  # OpenAI's SDK base ends in /v1
    assert agent["environment"]["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}"  # Anthropic's does not
    assert f"projectionist-data:{flag(argv, '--data-dir')}" in proxy["volumes"]
    assert f"127.0.0.1:{port}/readyz" in " ".join(proxy["healthcheck"]["test"])
    assert set(proxy["environment"]) == {"PROJECTIONIST_ADMIN_TOKEN"}
    assert load_config(None).admin_token({"PROJECTIONIST_ADMIN_TOKEN": "t"}) == "t"  # the name the proxy reads

    spec = pod()["spec"]
    side, app = spec["containers"]
    args = side["args"]
    assert flag(args, "--host") == "127.0.0.1" and flag(args, "--port") == port
    mounts = {m["name"]: m["mountPath"] for m in side["volumeMounts"]}
    assert mounts["projectionist-data"] == flag(args, "--data-dir")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert f"127.0.0.1:{port}{path}" in " ".join(side[probe]["exec"]["command"])  # exec: the proxy is on localhost
    env = {e["name"]: e.get("value") for e in app["env"]}
    assert env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/v1" and env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}"
    assert spec["securityContext"]["runAsUser"] == 10001 and "--uid 10001" in one("RUN")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's filesystem as the Dockerfile makes it, on this machine's Python: its COPY lines
    into ``src``, its pip install into a fresh venv (with pip's cache: the same packages)."""
    root = tmp_path_factory.mktemp("image")
    src = root / "src"
    src.mkdir()
    for kw, rest in instructions():
        if kw == "COPY":
            *sources, target = rest.split()
            for source in sources:
                path = ROOT / source
                dest = src / target if target.endswith("/") and path.is_dir() else src / Path(source).name
                if path.is_dir():
                    shutil.copytree(path, dest, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(path, dest)
    venv.create(root / "env", with_pip=True)
    install = [arg for arg in shlex.split(one("RUN").split("&&")[0]) if arg != "--no-cache-dir"]
    subprocess.run([str(root / "env" / "bin" / "python"), "-m", *install], cwd=src, check=True, timeout=600,
                   capture_output=True)
    return root


def started(image: Path, argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], list[str]]:
    """``argv`` (a command of the recipe) started in the image with free ports and a data dir of its own."""
    port, admin = free_port(), free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--admin-listen") + 1] = f"{flag(argv, '--admin-listen').rpartition(':')[0]}:{admin}"
    argv[argv.index("--data-dir") + 1] = str(image / "data")
    bin_dir = image / "env" / "bin"
    environ = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(image), **env}
    proc = subprocess.Popen(argv, cwd=image, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, [f"http://127.0.0.1:{port}", str(port)]


def wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("not ready")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def probe(image: Path, command: list[str], port: str) -> int:
    """A health check or probe command of the recipe, run in the image against ``port``."""
    command = [c.replace(":8787/", f":{port}/") for c in command]
    env = {"PATH": f"{image / 'env' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(command, env=env, timeout=30).returncode


def test_the_image_serves_as_its_cmd_says_and_refuses_strangers_without_tokens(image: Path) -> None:
    argv = cmd()
    lone, _ = started(image, argv, {})
    assert lone.wait(timeout=60) == 2 and b"OPEN_PROXY_REFUSED" in (lone.stderr.read() if lone.stderr else b"")
    proc, (base, port) = started(image, argv, {"PROJECTIONIST_CLIENT_TOKENS": "tok-1"})
    try:
        wait_ready(base, proc)
        with urllib.request.urlopen(base + "/healthz", timeout=5) as answer:
            assert answer.status == 200
        health = json.loads(one("HEALTHCHECK").split("CMD", 1)[1])
        assert probe(image, health, port) == 0
    finally:
        stop(proc)
    assert probe(image, health, port) != 0  # and it fails once the proxy is gone


def test_the_sidecar_commands_serve_on_localhost_and_their_probes_pass(image: Path) -> None:
    side = pod()["spec"]["containers"][0]
    for argv in (compose()["services"]["proxy"]["command"], side["args"]):
        proc, (base, port) = started(image, argv, {})
        try:
            wait_ready(base, proc)
            for name in ("readinessProbe", "livenessProbe"):
                assert probe(image, side[name]["exec"]["command"], port) == 0
        finally:
            stop(proc)


def test_the_readme_installs_extras_from_the_checkout() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "pip install 'projectionist[" not in readme and "pip install -e '.[s3,postgres]'" in readme
    assert sys.version_info >= (3, 11)
