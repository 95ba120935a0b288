"""Where things are, for test modules at any depth: the repository root and the test data folders."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
GOLDEN = TESTS / "golden"
SNAPSHOTS = TESTS / "snapshots"
