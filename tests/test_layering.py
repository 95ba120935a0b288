"""Layering: imports flow proxy -> adapters, policy and adapters -> policy only; modules say their layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IO_LIBRARIES = {"aiohttp", "multidict", "yarl", "sqlite3", "asyncpg", "aiobotocore", "botocore", "PIL",
                "socket", "structlog", "logging", "prometheus_client", "httpx"}
FORBIDDEN = {
    "policy": IO_LIBRARIES | {"projectionist.adapters", "projectionist.proxy"},
    "adapters": IO_LIBRARIES | {"projectionist.proxy"},
}
#: The design card's folders were once import roots of their own; nothing may import them so now.
OLD_ROOTS = {"policy", "adapters", "proxy"}


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every absolute import of ``path``, as its root and, for projectionist, its first two levels."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        found = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        for name in found:
            parts = name.split(".")
            names.add(parts[0])
            if parts[0] == "projectionist" and len(parts) > 1:
                names.add(".".join(parts[:2]))
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layers_import_one_way(package: str) -> None:
    found = modules(package)
    assert found, f"no modules under {package}/"
    offenders = {p.name: sorted(imported(p) & FORBIDDEN[package]) for p in found}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


@pytest.mark.parametrize("package", ["policy", "adapters", "proxy", "tests", "bench"])
def test_everything_imports_the_one_package_name(package: str) -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(imported(p) & OLD_ROOTS) for p in modules(package)}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_the_scanner_sees_imports() -> None:
    assert {"aiohttp", "projectionist.policy", "projectionist.adapters"} <= \
        imported(ROOT / "proxy" / "upstream" / "prepare.py")


@pytest.mark.parametrize("package", ["policy", "adapters", "proxy"])
def test_every_module_opens_with_a_docstring_naming_its_layer(package: str) -> None:
    for path in modules(package):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert f"{package} layer" in doc or (path.name == "__init__.py" and doc), f"{path} lacks a layer docstring"
