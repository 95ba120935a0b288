"""Helpers for the refusal fault tests: request bodies, and a meter of event-loop stalls. (A test
scripts the upstream's answers with ``FakeUpstream.script``.)"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any





def chat_body(*refs: str, inline: list[str] | None = None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": f"attachment:{r}"}} for r in refs]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in inline or []]
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def anthropic_body(*refs: str) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
    blocks += [{"type": "image", "source": {"type": "url", "url": f"attachment:{r}"}} for r in refs]
    return {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": blocks}]}


class StallMeter:
    """``async with StallMeter() as meter``: the longest time the event loop went without running
    a ``tick``-second sleep on time (``meter.longest``, seconds), noted up to the block's end."""

    def __init__(self, tick: float = 0.005) -> None:
        self.tick = tick
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.tick)
            self.longest = max(self.longest, time.perf_counter() - before - self.tick)

    async def __aenter__(self) -> StallMeter:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await asyncio.sleep(10 * self.tick)  # the last stall is noted before the watch stops
        assert self._task is not None
        self._task.cancel()
