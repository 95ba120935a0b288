"""Session plumbing of the proxy: the per-replica fold cache and the checkpoints ``CachedLog`` writes. (Session ids,
which the policy checks, are in ``tests/policy/test_session_ids.py``.)"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from projectionist.policy.errors import AppendConflict, Unavailable
from projectionist.policy.events import Checkpoint, CheckpointEvent, Event, EventData, Quarantine, ResponseRecorded
from projectionist.policy.fold import SessionState, fold
from projectionist.proxy.sessionlog.cached import CachedLog, StateCache
from tests.memory import MemoryLog
from tests.records import whole_calls


def test_state_cache_is_bounded_and_keeps_the_newest_fold() -> None:
    cache = StateCache(capacity=2)
    cache.put("a", SessionState(3))
    cache.put("a", SessionState(2))  # an older fold from a slower concurrent request
    assert cache.get("a") == SessionState(3)
    cache.put("b", SessionState(1))
    cache.get("a")  # a is now the most recently used
    cache.put("c", SessionState(1))
    assert (cache.get("a"), cache.get("b"), len(cache)) == (SessionState(3), None, 2)


class RefusingLog(MemoryLog):
    """A MemoryLog whose checkpoint appends fail as told (a lost race, an outage)."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.error = error

    async def append(self, session_id: str, expected_seq: int | None, data: Sequence[EventData], *,
                     durable: bool = True) -> list[Event]:
        if self.error is not None and any(isinstance(d, Checkpoint) for d in data):
            raise self.error
        return await super().append(session_id, expected_seq, data, durable=durable)

    async def start(self) -> None:
        pass


def quarantine(n: int) -> Quarantine:
    return Quarantine(f"sha256:{n:064x}", "not_found", False)


async def test_the_cached_log_checkpoints_when_due_and_a_cold_one_folds_from_there() -> None:
    memory = RefusingLog()
    log = CachedLog(memory, checkpoint_every=3)
    for n in range(3):
        cached = log.state("s")
        await log.append("s", cached.last_seq if cached else 0, [quarantine(n)])
        await log.append("s", None, [ResponseRecorded("r", 1, 200, 1.0)], durable=False)  # no checkpoint: a record
    kinds = [type(e).__name__ for e in await memory.read("s")]
    assert kinds.count("CheckpointEvent") == 1 and kinds.index("CheckpointEvent") == 5  # right after the 3rd
    cold = CachedLog(memory, checkpoint_every=3)
    read = await cold.read_state("s")
    assert isinstance(read.events[0], CheckpointEvent) and len(read.events) == 1
    assert cold.state("s") == fold(await memory.read("s")) == log.state("s")


@pytest.mark.parametrize("error", [AppendConflict("s", 3, 4), Unavailable("down", code="LOG_UNAVAILABLE")])
async def test_a_checkpoint_that_cannot_be_written_is_skipped_and_tried_again_later(error: Exception) -> None:
    memory = RefusingLog(error)
    log = CachedLog(memory, checkpoint_every=2)
    for n in range(3):
        events = await log.append("s", n, [quarantine(n)])  # the decision's append still succeeds
        assert [e.seq for e in events] == [n + 1]
    memory.error = None
    await log.append("s", 3, [quarantine(3)])
    assert isinstance((await memory.read("s"))[-1], CheckpointEvent)


async def test_whole_calls_move_the_cached_fold_on_to_their_last_seq_as_their_records_would() -> None:
    """``append_calls`` appends records only: the cached fold stays what it was and moves on to
    their last seq, so the next decision expects the seq a read would give, with no read."""
    memory = MemoryLog()
    log = CachedLog(memory)
    await log.append("s", 0, [quarantine(1)])
    before = log.state("s")
    assert await log.append_calls("s", whole_calls(3)) == 4
    after = log.state("s")
    assert before is not None and after is not None and after.last_seq == 4
    assert after == fold(await memory.read("s"))
    landed = await log.append("s", after.last_seq, [quarantine(2)])
    assert [e.seq for e in landed] == [5]
