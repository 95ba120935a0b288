"""Session plumbing of the proxy: the per-replica fold cache (owned by ``CachedLog``) and session ids."""

from __future__ import annotations

import pytest

from projectionist.policy.errors import InvalidRequest
from projectionist.policy.fold import SessionState
from projectionist.policy.model import check_session_id
from projectionist.proxy.sessionlog.cached import StateCache


def test_state_cache_is_bounded_and_keeps_the_newest_fold() -> None:
    cache = StateCache(capacity=2)
    cache.put("a", SessionState(3))
    cache.put("a", SessionState(2))  # an older fold from a slower concurrent request
    assert cache.get("a") == SessionState(3)
    cache.put("b", SessionState(1))
    cache.get("a")  # a is now the most recently used
    cache.put("c", SessionState(1))
    assert (cache.get("a"), cache.get("b"), len(cache)) == (SessionState(3), None, 2)


@pytest.mark.parametrize("value", ["", " ", "a b", "x" * 257, "é", "tab\there"])
def test_bad_session_ids_are_refused(value: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_session_id(value)
    assert info.value.code == "INVALID_SESSION_ID"


def test_good_session_ids_pass_unchanged() -> None:
    for value in ("s1", "user:42/run-7", "x" * 256, "0196f5c2-7a1e-7c3a-9f1e-1b2c3d4e5f60"):
        assert check_session_id(value) == value
