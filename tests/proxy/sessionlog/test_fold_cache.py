"""Session plumbing of the proxy: the per-replica fold cache (owned by ``CachedLog``). (Session ids,
which the policy checks, are in ``tests/policy/test_session_ids.py``.)"""

from __future__ import annotations

from projectionist.policy.fold import SessionState
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
