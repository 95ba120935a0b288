"""Layering: imports flow proxy -> adapters, policy and adapters -> policy only; modules say their layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IO_LIBRARIES = {"aiohttp", "multidict", "yarl", "sqlite3", "asyncpg", "aiobotocore", "botocore", "PIL",
                "socket", "structlog", "logging", "prometheus_client", "httpx"}
FORBIDDEN = {
    "policy": IO_LIBRARIES | {"adapters", "proxy"},
    "adapters": IO_LIBRARIES | {"proxy"},
}


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layers_import_one_way(package: str) -> None:
    found = modules(package)
    assert found, f"no modules under {package}/"
    offenders = {p.name: sorted(imported_roots(p) & FORBIDDEN[package]) for p in found}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_the_scanner_sees_imports() -> None:
    assert {"aiohttp", "policy", "adapters"} <= imported_roots(ROOT / "proxy" / "projecting.py")


@pytest.mark.parametrize("package", ["policy", "adapters", "proxy"])
def test_every_module_opens_with_a_docstring_naming_its_layer(package: str) -> None:
    for path in modules(package):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert f"{package} layer" in doc or (path.name == "__init__.py" and doc), f"{path} lacks a layer docstring"
