"""The canonical log line: the raw path (never its query), the model where the proxy read it
anyway, and the tokens the answer reported."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import hypothesis
import msgspec
import pytest
import structlog
from structlog.testing import capture_logs

from projectionist.proxy.observe import logger
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness
from tests.fakes import FakeUpstream
from tests.imaging import make_image, ref_id
from tests.paths import ROOT


async def logged(harness: Harness, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
    with capture_logs() as logs:
        resp = await harness.client.request(method, url, **kwargs)
        await resp.read()
    [line] = [entry for entry in logs if entry["event"] == "request"]
    return line


async def test_a_projected_call_logs_its_path_model_and_tokens_and_never_its_query(harness: Harness) -> None:
    aid = await harness.admit(make_image(color=30))
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"attachment:{aid}"}},
        {"type": "image_url", "image_url": {"url": f"attachment:{ref_id(make_image(color=31))}"}}]}]}
    line = await logged(harness, "POST", "/v1/chat/completions?api_key=sk-in-the-query&x=1", json=body,
                        headers={"X-Session-Id": "log-line"})
    assert line["path"] == "/v1/chat/completions"
    assert (line["model"], line["input_tokens"], line["output_tokens"]) == ("gpt-4o-mini", 10, 7)
    assert (line["refs"], line["placeholders"], line["upstream"]) == (2, 1, "openai")
    assert "sk-in-the-query" not in repr(line)


async def test_a_body_without_references_is_not_decoded_for_its_model(harness: Harness) -> None:
    line = await logged(harness, "POST", "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": []})
    assert "model" not in line and "refs" not in line  # sent as it came
    assert (line["input_tokens"], line["output_tokens"]) == (10, 7)  # the answer was read: it is small


async def test_a_stream_logs_the_tokens_its_events_reported(harness: Harness) -> None:
    line = await logged(harness, "POST", "/v1/messages", headers={"anthropic-version": "2023-06-01"},
                        json={"model": "claude-x", "max_tokens": 9, "stream": True, "messages": []})
    assert (line["input_tokens"], line["output_tokens"]) == (10, harness.upstream.chunks)


async def test_gemini_names_its_model_in_the_path(make_harness: Callable[..., Awaitable[Harness]],
                                                  upstream: FakeUpstream) -> None:
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    path = "/v1beta/models/gemini-2.5-flash:generateContent"
    line = await logged(harness, "POST", f"{path}?key=AIza-secret", json={"contents": []})
    assert (line["path"], line["model"], line["input_tokens"], line["output_tokens"]) == (path, "gemini-2.5-flash", 10, 7)
    assert "AIza-secret" not in repr(line)


async def test_a_pass_through_call_logs_its_path_only(harness: Harness) -> None:
    line = await logged(harness, "GET", "/v1/models?key=abc")
    assert line["path"] == "/v1/models" and line["route"] == "passthrough"
    assert not {"model", "input_tokens", "output_tokens"} & set(line)


async def test_the_proxy_s_own_routes_log_their_path(harness: Harness) -> None:
    line = await logged(harness, "GET", "/admin/sessions/s1/events?after=0", headers={"Authorization": "Bearer admintok"})
    assert (line["path"], line["status"]) == ("/admin/sessions/s1/events", 404)  # s1 holds no event
    assert "upstream" not in line


@pytest.mark.parametrize("pid", [False, True])
def test_the_request_line_written_straight_is_the_line_structlog_writes(
        pid: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.BytesIO()
    stderr = io.TextIOWrapper(buffer)
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(logger, "_LOGGER", structlog.get_logger("projectionist"))  # not cached by another test
    monkeypatch.setattr(logger, "_request_lines", logger._request_lines)  # the process's logging, as it was
    monkeypatch.setattr(logger, "_direct", logger._direct)
    before = structlog.get_config()
    root = (logging.root.handlers[:], logging.root.level)  # setup_logging bridges the standard library too
    fields = {"method": "POST", "path": "/v1/chat/completions", "duration_ms": 1.25, "route": "openai_chat",
              "request_id": "abc", "status": 200, "session": "s", "quarantined": ["not_found"], "odd": Path("/x")}
    try:
        logger.setup_logging("info", json=True, pid=pid)
        logger.request_line(dict(fields))  # straight: no processor chain
        structlog.get_logger("test").info("request", **fields)  # through the chain (a proxy not cached yet)
        with capture_logs() as captured:  # a capture empties the chain in place: the line goes through it
            logger.request_line(dict(fields))
        written = buffer.getvalue()
    finally:
        structlog.configure(**before)
        logging.root.handlers[:], _ = root
        logging.root.setLevel(root[1])
    straight, chained = (msgspec.json.decode(line) for line in written.splitlines())
    stamps = [straight.pop("timestamp"), chained.pop("timestamp")]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", stamp) for stamp in stamps), stamps
    written_at = [datetime.fromisoformat(stamp.replace("Z", "+00:00")) for stamp in stamps]
    assert abs(written_at[0] - written_at[1]) < timedelta(seconds=5) and written_at[0].utcoffset() == timedelta(0)
    assert list(straight.items()) == list(chained.items())  # the same keys, in the same order
    assert straight["odd"] == "/x" and ("pid" in straight) is pid and straight["level"] == "info"
    assert [entry["event"] for entry in captured] == ["request"]


@pytest.mark.parametrize("nanos", [1_764_554_404_000_000_000, 1_764_554_404_196_904_123, 1_764_554_405_000_999_999,
                                   1_767_225_599_999_999_999])
def test_the_stamp_of_a_line_is_the_one_datetime_isoformat_writes(nanos: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stamp formatted once a second is what structlog's ISO stamper writes at that instant:
    without a fraction at a whole second, with six digits otherwise, across a change of year."""
    for offset in (0, 1_000_000_000):  # a second later: the cached date and time move on
        monkeypatch.setattr(logger.time, "time_ns", lambda: nanos + offset)
        seconds, nanos_left = divmod(nanos + offset, 1_000_000_000)
        at = datetime.fromtimestamp(seconds, UTC).replace(microsecond=nanos_left // 1000)
        assert logger._utc_stamp() == at.isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize("nanos", [123_456_789, 0, -999_999_999])
def test_the_first_stamp_of_a_process_is_right_whatever_second_the_clock_reads(nanos: int) -> None:
    """A process whose clock reads the first second of 1970 (a board without a real-time clock, a
    frozen test clock), or the one before it, still stamps its first line with the date and time:
    no second counts as formatted before one was."""
    code = ("import time; from projectionist.proxy.observe import logger; "
            f"time.time_ns = lambda: {nanos}; print(logger._utc_stamp())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[3])
    seconds, nanos_left = divmod(nanos, 1_000_000_000)
    at = datetime.fromtimestamp(seconds, UTC).replace(microsecond=nanos_left // 1000)
    assert done.stdout.strip() == at.isoformat().replace("+00:00", "Z")


async def test_request_lines_of_one_turn_are_one_write_and_keep_their_order_with_other_lines() -> None:
    class Counting(io.BytesIO):
        writes = 0

        def write(self, data: Any) -> int:
            Counting.writes += 1
            return super().write(data)

    out = logger._Lines(Counting())
    for n in range(3):
        out.queue(b'{"n":%d}' % n)
    assert Counting.writes == 0  # nothing yet: the turn is not over
    out.msg(b'{"warning":1}')  # another line writes what was queued before it first
    out.queue(b'{"n":3}')
    out.queue(b'{"n":4}')
    await asyncio.sleep(0)  # the turn ends
    await asyncio.sleep(0)
    assert out._file.getvalue().splitlines() == [  # type: ignore[attr-defined]
        b'{"n":0}', b'{"n":1}', b'{"n":2}', b'{"warning":1}', b'{"n":3}', b'{"n":4}']
    assert Counting.writes == 3  # the three queued lines, the warning, the two queued after it


def test_what_libraries_log_is_json_too() -> None:
    """asyncio's "Future exception was never retrieved" and a driver's traceback (asyncpg's pool
    logs through the standard library) come out as JSON lines of the same chain."""
    script = """
import asyncio, gc, logging
from projectionist.proxy.observe.logger import setup_logging
setup_logging("info", json=True)
try:
    raise ConnectionResetError("the database went away")
except ConnectionResetError:
    logging.getLogger("asyncpg.pool").exception("Error while closing %s", "a connection")

async def main():
    future = asyncio.get_running_loop().create_future()
    future.set_exception(RuntimeError("nobody looked"))
    del future
    gc.collect()
    await asyncio.sleep(0)

asyncio.run(main())
logging.getLogger("aiohttp.server").warning("plain %d", 7)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 3, done.stderr
    entries = [json.loads(line) for line in lines]  # every line is JSON
    assert [e.get("logger") for e in entries] == ["asyncpg.pool", "asyncio", "aiohttp.server"]
    assert entries[0]["event"] == "Error while closing a connection" and "ConnectionResetError" in entries[0]["exception"]
    assert "never retrieved" in entries[1]["event"] and "nobody looked" in entries[1]["exception"]
    assert entries[2]["event"] == "plain 7" and entries[2]["level"] == "warning"


@hypothesis.given(hypothesis.strategies.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_durations_in_milliseconds_are_what_round_gives_for_a_tenth_of_its_cost(seconds: float) -> None:
    """``ms`` replaced ``round(seconds * 1000, 3)`` on every call's log line and record: the same
    value to the microsecond (they may differ only on a tie, by the last digit's rounding)."""
    assert abs(logger.ms(seconds) - round(seconds * 1000, 3)) <= 0.001 * (1 + 1e-9)
    assert logger.ms(seconds) == round(logger.ms(seconds), 3)  # never more than three decimals


def test_a_duration_keeps_its_three_decimals_as_the_json_line_writes_them() -> None:
    assert [logger.ms(s) for s in (0.0000864, 0.0012344, 1.5, 0.0)] == [0.086, 1.234, 1500.0, 0.0]
    assert json.dumps(logger.ms(0.0123456)) == "12.346"
