"""The fast loop stays pure: ``pytest tests/policy tests/adapters`` runs tests that start no backend and
no server, because ``tests/conftest.py`` refuses anything else there. These tests prove the refusals
work: a backend or server fixture (asked for up front, through another fixture, or on the fly) fails
a pure test, and inside one no socket connects or listens and no process starts."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tests import conftest
from tests.conftest import IMPURE_FIXTURES, TESTS, ImpureTest, is_pure, nothing_impure, refuse_impure_fixtures

PURE_TEST = TESTS / "policy" / "test_example.py"


def test_the_fast_loop_is_the_policy_and_adapter_folders() -> None:
    assert is_pure(PURE_TEST) and is_pure(TESTS / "adapters" / "test_gemini.py")
    assert not is_pure(TESTS / "proxy" / "call" / "test_proxy.py")
    assert not is_pure(TESTS / "system" / "test_sdks.py")
    assert not is_pure(TESTS / "test_layering.py") and not is_pure(TESTS / "policy_table.py")


def test_a_pure_test_using_a_backend_or_server_fixture_fails() -> None:
    """The hook gets a test's whole fixture closure (``item.fixturenames``): a fixture that uses one
    of these, like ``make_config`` (``upstream``, ``aiohttp_server``), is caught by the same check."""
    for fixture in sorted(IMPURE_FIXTURES):
        with pytest.raises(pytest.fail.Exception) as info:
            refuse_impure_fixtures("tests/policy/test_example.py::test_it", PURE_TEST, ["tmp_path", fixture])
        assert fixture in str(info.value) and "fast loop" in str(info.value)
        # The same fixture anywhere else is fine.
        refuse_impure_fixtures("tests/proxy/call/test_example.py::test_it", TESTS / "proxy" / "call" / "test_x.py",
                               ["tmp_path", fixture])
    refuse_impure_fixtures("tests/policy/test_example.py::test_it", PURE_TEST, ["tmp_path", "monkeypatch"])


def test_a_backend_fixture_requested_on_the_fly_by_a_pure_test_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    pure_item = SimpleNamespace(nodeid="tests/policy/test_example.py::test_it", path=PURE_TEST)
    monkeypatch.setattr(conftest, "_running", [pure_item])
    with pytest.raises(pytest.fail.Exception, match="seaweed"):
        conftest.refuse_on_the_fly("seaweed")
    conftest.refuse_on_the_fly("tmp_path")
    monkeypatch.setattr(conftest, "_running", [])  # between tests: nothing to refuse
    conftest.refuse_on_the_fly("seaweed")


def test_the_on_the_fly_guard_is_a_plugin_of_the_session(pytestconfig: pytest.Config) -> None:
    """Registered globally: this conftest's own hooks would not see session-scoped fixtures."""
    assert pytestconfig.pluginmanager.has_plugin("tests-pure-loop-guard")


async def test_inside_a_pure_test_no_socket_connects_or_listens_and_no_process_starts() -> None:
    async def nothing(reader: Any, writer: Any) -> None: ...

    with nothing_impure():
        with socket.socket() as s, pytest.raises(ImpureTest):
            s.connect(("127.0.0.1", 9))
        with socket.socket() as s, pytest.raises(ImpureTest):
            s.bind(("127.0.0.1", 0))
            s.listen()
        with pytest.raises(ImpureTest):
            await asyncio.start_server(nothing, "127.0.0.1", 0)  # what every aiohttp test server does
        with pytest.raises(ImpureTest):
            await asyncio.open_connection("127.0.0.1", 9)  # what every database or S3 client does
        with pytest.raises(ImpureTest):
            subprocess.run([sys.executable, "-c", "pass"], check=True)  # SeaweedFS, a throwaway PostgreSQL
    with socket.socket() as s:  # all restored afterwards
        s.bind(("127.0.0.1", 0))
        s.listen()
