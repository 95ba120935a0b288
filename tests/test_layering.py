"""Layering: imports flow one way, between the packages and inside ``proxy/``; modules say their layer.

    policy     pure domain                      (nothing of ours below it)
    adapters   wire formats, pure               -> policy
    proxy/     all I/O, in layers, each importing only the ones below it:
      ops          CLI, demo, serve, workers              -> anything
      edge         apps, middleware, routing, readiness   -> files, console, call, and below
      files, console   file APIs; admin API and inspector -> call, and below (never each other)
      call         the proxied call: read, send, record, re-send, replay -> inbound, and below
      inbound      context, services, auth, bodies        -> upstream, and below
      upstream     transports, targets, URLs, body prep   -> stores, sessionlog, observe, config
      stores, sessionlog   backends             -> observe, config     (never each other; no aiohttp.web)
      observe, config, lanes, faults   leaves   -> nothing of proxy/
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IO_LIBRARIES = {"aiohttp", "multidict", "yarl", "sqlite3", "asyncpg", "aiobotocore", "botocore", "PIL",
                "socket", "structlog", "logging", "prometheus_client", "httpx", "httptools"}
P = "projectionist.proxy"
#: proxy/'s folders from the top down: each imports only the ones after it (files and console
#: stand side by side and never import each other; stores and sessionlog likewise).
ORDER = ("ops", "edge", "files", "console", "call", "inbound", "upstream", "stores", "sessionlog", "observe", "config")
ALL = ORDER


def above(part: str) -> set[str]:
    """The folders above ``part``, which it may not import."""
    return {f"{P}.{name}" for name in ORDER[:ORDER.index(part)]}


#: What each part may NOT import (besides the standard library and third-party packages).
FORBIDDEN: dict[str, set[str]] = {
    "policy": IO_LIBRARIES | {"projectionist.adapters", P},
    "adapters": IO_LIBRARIES | {P},
    "proxy/config.py": {f"{P}.{part}" for part in ALL},
    "proxy/lanes.py": {f"{P}.{part}" for part in ALL},
    "proxy/faults.py": IO_LIBRARIES | {P, "projectionist.adapters"},  # stdlib and policy.errors only
    "proxy/observe": {f"{P}.{part}" for part in ALL if part != "observe"} | {"aiohttp"},
    "proxy/stores": above("stores") | {f"{P}.sessionlog", "aiohttp.web"},
    "proxy/sessionlog": above("sessionlog") | {f"{P}.stores", "aiohttp"},
    "proxy/upstream": above("upstream"),
    "proxy/inbound": above("inbound"),
    "proxy/call": above("call"),
    "proxy/files": above("files") | {f"{P}.console"},
    "proxy/console": above("console") | {f"{P}.files"},
    "proxy/edge": above("edge"),
}
#: Pairs inside a part that must stay apart.
APART = [("proxy/sessionlog/postgres.py", f"{P}.sessionlog.sqlite"), ("proxy/sessionlog/sqlite.py", f"{P}.sessionlog.postgres"),
         ("proxy/stores/s3.py", f"{P}.stores.filesystem"), ("proxy/stores/filesystem.py", f"{P}.stores.s3")]
#: The design card's folders were once import roots of their own; nothing may import them so now.
OLD_ROOTS = {"policy", "adapters", "proxy"}


def modules(part: str) -> list[Path]:
    path = ROOT / part
    return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def module_name(path: Path) -> list[str]:
    """The import name of a file of the checkout, as pyproject's package-dir maps it (``proxy/x.py``
    is ``projectionist.proxy.x``); tests and bench keep their own names."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ["projectionist", *parts] if parts[0] in OLD_ROOTS else parts


def _run_time(tree: ast.Module) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``: an import made for an
    annotation alone names a type and is never run, so it ties no layer to another."""
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
               and node.test.id == "TYPE_CHECKING" for child in node.body for n in ast.walk(child)}
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def imported(path: Path) -> set[str]:
    """Every import of ``path`` that runs, relative ones resolved: each module name and all its
    parents (``a.b.c``, ``a.b``, ``a``)."""
    package = module_name(path)[:-1]
    names: set[str] = set()
    for node in _run_time(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                assert node.level <= len(package), f"{path}: a relative import climbs out of the package"
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            found = [f"{base}.{a.name}" for a in node.names]
        else:
            found = []
        for name in found:
            parts = name.split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_layers_import_one_way(part: str) -> None:
    found = modules(part)
    assert found, f"no modules at {part}"
    offenders = {str(p.relative_to(ROOT)): sorted(imported(p) & FORBIDDEN[part]) for p in found}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


@pytest.mark.parametrize(("module", "forbidden"), APART)
def test_sibling_backends_stay_apart(module: str, forbidden: str) -> None:
    assert forbidden not in imported(ROOT / module)


@pytest.mark.parametrize("package", ["policy", "adapters", "proxy", "tests", "bench"])
def test_everything_imports_the_one_package_name(package: str) -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(imported(p) & OLD_ROOTS) for p in modules(package)}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


@pytest.mark.parametrize("package", ["policy", "adapters", "proxy"])
def test_the_package_imports_itself_relatively(package: str) -> None:
    """Inside the package every import of its own is relative, so a tool that reads imports by
    path (no import hook, no package-dir mapping) draws the same graph as Python runs."""
    offenders = [str(p.relative_to(ROOT)) for p in modules(package)
                 if any(isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").startswith("projectionist")
                        or isinstance(n, ast.Import) and any(a.name.startswith("projectionist") for a in n.names)
                        for n in ast.walk(ast.parse(p.read_text())))]
    assert offenders == []


def test_no_folder_of_the_package_is_a_link() -> None:
    """The checkout is the package: no part of it reaches its folders through a link."""
    assert (ROOT / "__init__.py").is_file()
    links = [str(p.relative_to(ROOT)) for top in OLD_ROOTS for p in [ROOT / top, *(ROOT / top).rglob("*")] if p.is_symlink()]
    assert links == []


def test_the_scanner_sees_imports() -> None:
    names = imported(ROOT / "proxy" / "call" / "send.py")
    assert {"aiohttp", "projectionist.policy", f"{P}.call", f"{P}.call.relay"} <= names
    assert f"{P}.call" in FORBIDDEN["proxy/upstream"] and f"{P}.call" in names  # a real offence would show


@pytest.mark.parametrize("package", ["policy", "adapters", "proxy"])
def test_every_module_opens_with_a_docstring_naming_its_layer(package: str) -> None:
    for path in modules(package):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert f"{package} layer" in doc or (path.name == "__init__.py" and doc), f"{path} lacks a layer docstring"


def test_the_tests_folders_mirror_the_codes() -> None:
    """A folder of tests under ``tests/proxy`` is named for the code it tests: a folder or a module
    at the same place under ``proxy/`` (``tests/proxy/call/websocket`` tests ``proxy/call/websocket.py``),
    so a test is found where its code is and a folder the code no longer has does not live on."""
    root = Path(__file__).resolve().parents[1]
    folders = sorted(p for p in (root / "tests" / "proxy").rglob("*")
                     if p.is_dir() and p.name != "__pycache__" and (p / "__init__.py").exists())
    assert {p.name for p in folders} >= {"call", "edge", "inbound", "files", "console", "websocket"}
    strays = [p.relative_to(root).as_posix() for p in folders
              if not ((code := root / p.relative_to(root / "tests")).is_dir() or code.with_suffix(".py").is_file())]
    assert strays == [], f"test folders with no code of their name under proxy/: {strays}"
