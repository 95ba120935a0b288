"""One import name: the wheel, installed into a fresh virtual environment, adds ``projectionist``
to site-packages and nothing else (no ``proxy``, ``policy`` or ``adapters`` of its own to clobber
or be clobbered by another distribution), and every module of the source tree ships in it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site-packages of a fresh venv with only the projectionist wheel in it (no dependencies)."""
    work = tmp_path_factory.mktemp("wheel")
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools keeps stale copies of moved modules there
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(work / "dist")],
                   check=True, timeout=300)
    [wheel] = (work / "dist").glob("projectionist-*.whl")
    venv.create(work / "env", with_pip=True)
    python = work / "env" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    before = {p.name for p in site.iterdir()}
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)
    (site / ".before").write_text("\n".join(sorted(before)))
    return site


def test_the_wheel_adds_only_the_projectionist_name(installed: Path) -> None:
    before = set((installed / ".before").read_text().split("\n"))
    added = {p.name for p in installed.iterdir()} - before - {".before"}
    names = {name for name in added if not name.endswith((".dist-info", ".pth"))}
    assert names == {"projectionist"}
    [dist] = [name for name in added if name.endswith(".dist-info")]
    assert (installed / dist / "top_level.txt").read_text().split() == ["projectionist"]


def test_every_source_module_ships_under_projectionist(installed: Path) -> None:
    shipped = {p.relative_to(installed / "projectionist").as_posix() for p in (installed / "projectionist").rglob("*.py")}
    source = {f"{top}/{p.relative_to(ROOT / top).as_posix()}"
              for top in ("policy", "adapters", "proxy") for p in (ROOT / top).rglob("*.py")}
    assert source | {"__init__.py"} == shipped


def test_the_base_install_leaves_each_backends_driver_to_its_extra(installed: Path) -> None:
    """The embedded default needs no S3 or PostgreSQL driver: they come only with [s3] and [postgres]."""
    [dist] = installed.glob("projectionist-*.dist-info")
    requires = [line.split(":", 1)[1].strip() for line in (dist / "METADATA").read_text().splitlines()
                if line.startswith("Requires-Dist:")]
    base = {r.split(";")[0].strip() for r in requires if "extra ==" not in r}
    for driver in ("aiobotocore", "botocore", "asyncpg"):
        assert not any(r.lower().startswith(driver) for r in base), base
    assert any(r.startswith("aiobotocore") and "extra == \"s3\"" in r for r in requires), requires
    assert any(r.startswith("asyncpg") and "extra == \"postgres\"" in r for r in requires), requires
