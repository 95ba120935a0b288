"""Session ids: what ``check_session_id`` refuses and what it passes unchanged (pure policy)."""

from __future__ import annotations

import pytest

from projectionist.policy.errors import InvalidRequest
from projectionist.policy.model import check_session_id


@pytest.mark.parametrize("value", ["", " ", "a b", "x" * 257, "é", "tab\there", ".", ".."])  # no URL names . or ..
def test_bad_session_ids_are_refused(value: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_session_id(value)
    assert info.value.code == "INVALID_SESSION_ID"


def test_good_session_ids_pass_unchanged() -> None:
    for value in ("s1", "user:42/run-7", "x" * 256, "0196f5c2-7a1e-7c3a-9f1e-1b2c3d4e5f60", "...", ".a", "a."):
        assert check_session_id(value) == value
