"""What the proxy needs of a session log beyond the policy's Protocol, and the log's clock (proxy layer)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

from projectionist.policy.ports import SessionLog


class Log(SessionLog, Protocol):
    """A ``SessionLog`` with a lifetime: ``start`` opens it (schema included), ``close`` ends it."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...


def utc_now() -> str:
    """The default clock of every backend: UTC ISO-8601 with milliseconds and a ``Z`` suffix."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
