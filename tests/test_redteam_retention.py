"""Red team (redteam2): retention against a hand-damaged row."""

from __future__ import annotations

from projectionist.policy.events import REQUEST, UnknownEvent
from tests.proxy.sessionlog.test_log_contract import LogBackend, log_backend  # noqa: F401 (fixture)
from tests.proxy.sessionlog.test_retention import CUT, OLD, Clock, a_session


async def test_one_damaged_record_does_not_stop_retention_for_every_other_session(log_backend: LogBackend) -> None:
    """``pruned_row`` decodes each old record's type and time (``_stamp.decode``); a row whose body
    is not JSON raises ``msgspec.DecodeError`` out of ``prune``: the transaction rolls back, and
    since every prune starts from the first session again, the log's retention stops for good
    (the server logs ``log_prune_failed`` every ``prune_every``; ``projectionist prune`` fails).
    Records of other sessions, before and after it in key order, are never pruned."""
    clock = Clock()
    log = log_backend.make(clock=clock)
    await a_session(log, clock, "aaa")
    await a_session(log, clock, "zzz")
    await log_backend.insert_raw("mmm", 1, REQUEST, OLD, b'{"type":"request","time":"' + OLD.encode() + b'", trunc')
    try:
        done = await log.prune(CUT)
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"one damaged row fails the whole prune: {type(exc).__name__}: {exc}") from exc
    assert done.records >= 8
    assert sum(isinstance(e, UnknownEvent) for e in await log.read("zzz")) == 4

