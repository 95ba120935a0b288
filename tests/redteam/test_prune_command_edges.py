"""Red team: ``projectionist prune`` argument edges and the retention setting.

* ``--session ''`` (an empty shell variable: ``--session "$SID"``) is taken as no ``--session`` at
  all: every record of EVERY session is pruned, irreversibly.
* ``--older-than nan``, ``inf`` and ``1e6`` pass the ``< 0`` check and end in a Python traceback
  (ValueError / OverflowError from ``timedelta``), not a clean INVALID_CONFIG.
* ``[record] keep_days = inf`` (or 1e6) is accepted by the config, and then every prune of the
  server fails (OverflowError, logged and retried for ever): retention silently never runs."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from projectionist.policy.errors import ProjectionistError
from projectionist.proxy.config import load_config
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from tests.commands import cli
from tests.proxy.sessionlog.test_log_contract import record


async def _two_sessions(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    log = SqliteLog(data_dir / "sessions.sqlite3", clock=lambda: "2020-01-01T00:00:00.000Z")
    await log.start()
    for session in ("alpha", "beta"):
        await log.append(session, None, [record(), record()])
    await log.close()


async def _kinds(data_dir: Path, session: str) -> list[str]:
    code, out, err = await cli("timeline", session, "--data-dir", str(data_dir), "--json")
    assert code == 0, err
    return [e["type"] for e in msgspec.json.decode(out)["events"]]


async def test_prune_with_an_empty_session_prunes_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    await _two_sessions(data_dir)
    code, out, err = await cli("prune", "--data-dir", str(data_dir), "--older-than", "1", "--session", "")
    pruned_beta = (await _kinds(data_dir, "beta")).count("record/pruned")
    assert pruned_beta == 0, f"--session '' pruned every session (rc={code}, out={out!r})"
    assert code == 1 and "INVALID_SESSION_ID" in err  # refused as any invalid session id is, by every verb


@pytest.mark.parametrize("days", ["nan", "inf", "1e6"])
async def test_prune_refuses_days_it_cannot_compute_cleanly(tmp_path: Path, days: str) -> None:
    data_dir = tmp_path / "data"
    await _two_sessions(data_dir)
    code, _, err = await cli("prune", "--data-dir", str(data_dir), f"--older-than={days}")
    assert "Traceback" not in err, err[-300:]
    assert code == 2 and "INVALID_CONFIG" in err


@pytest.mark.parametrize("days", [float("inf"), 1e6])
def test_a_keep_days_retention_can_never_compute_is_a_config_error(days: float) -> None:
    with pytest.raises(ProjectionistError) as info:
        load_config(None, **{"record.keep_days": days})
    assert info.value.code == "INVALID_CONFIG"
