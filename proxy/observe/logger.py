"""Structured logging: structlog JSON, one canonical line per request (proxy layer).

Every line about a request carries its request id and route explicitly. Never log bodies,
base64, API keys or tokens: callers pass counts and codes. The logger is created once (per-request
``get_logger`` calls would rebuild a bound logger each time).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec
import structlog
from yarl import URL


def setup_logging(level: str = "info", json: bool = True, *, pid: bool = False) -> None:
    """Configure structlog for a process (call once, from the CLI); with ``pid``, every line names
    the process that wrote it (the processes of ``serve --workers`` share one stderr)."""
    global _request_lines, _direct
    _request_lines = logging.getLevelNamesMapping()[level.upper()] <= logging.INFO
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_encode) if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    out = _Lines(sys.stderr.buffer) if json else None
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *([_with_pid(os.getpid())] if pid else []),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=(lambda *_: out) if out is not None else structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    chain = structlog.get_config()["processors"]  # the very list: a test's capture_logs empties it in place
    _direct = _Direct(chain, renderer, out, os.getpid() if pid else None) if out is not None else None
    if out is not None:
        atexit.register(out.write_queued)  # a process that exits between a line and its turn's end
    # what libraries log through the standard library (asyncio's "Future exception was never
    # retrieved", asyncpg's pool, aiohttp's server) becomes a line of the same chain: JSON too
    logging.basicConfig(handlers=[_Bridge()], level=logging.getLevelNamesMapping()[level.upper()], force=True)


class _Bridge(logging.Handler):
    """A standard-library record as a structlog line: its logger's name, its message (formatted
    with its arguments) and its traceback, if any, as the chain renders one (``exception``)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if _unparsed(record):
                return
            fields: dict[str, Any] = {"logger": record.name}
            if record.exc_info and record.exc_info[0] is not None:
                fields["exc_info"] = record.exc_info
            get_logger().log(record.levelno, record.getMessage(), **fields)
        except Exception:  # a line that cannot be written is dropped, never raised into its caller
            self.handleError(record)


def _unparsed(record: logging.LogRecord) -> bool:
    """A request aiohttp's parser refused before any handler saw it (a path or header that is no
    HTTP, a broken chunked body): its request line, with the status aiohttp answered, instead of
    a traceback. True when the record was that."""
    exc = record.exc_info[1] if record.exc_info else None
    # aiohttp's HttpProcessingError, by name: this layer imports no HTTP library
    if record.name != "aiohttp.server" or not any(c.__name__ == "HttpProcessingError" for c in type(exc).__mro__):
        return False
    code = getattr(exc, "code", None)
    status = code if isinstance(code, int) and 400 <= code < 500 else 400
    request_line({"method": None, "path": None, "route": "unparsed", "status": status,
                  "error": type(exc).__name__})
    return True


class _Lines(structlog.BytesLogger):
    """structlog's ``BytesLogger`` that also takes request lines to write once per turn of the
    event loop: a busy proxy finishes several requests per turn, and each of their lines was a
    ``write`` of its own. Any other line first writes the request lines queued before it, so the
    file keeps the order the lines were made in."""

    __slots__ = ("_queued", "_due")

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self._queued: list[bytes] = []
        self._due = False

    def msg(self, message: bytes) -> None:  # structlog's lines, from any thread
        with self._lock:
            self._write_queued_locked()
            self._write(message + b"\n")
            self._flush()

    def queue(self, message: bytes) -> None:
        """Write ``message`` after the callbacks of this turn of the running loop (at once without one)."""
        with self._lock:
            self._queued.append(message + b"\n")
            if self._due:
                return
            self._due = True
        try:
            asyncio.get_running_loop().call_soon(self.write_queued)
        except RuntimeError:
            self.write_queued()

    def write_queued(self) -> None:
        with self._lock:
            self._due = False
            if self._write_queued_locked():
                self._flush()

    def _write_queued_locked(self) -> bool:
        """Write the queued request lines (the caller holds the lock); whether there were any."""
        if not self._queued:
            return False
        self._write(b"".join(self._queued))
        self._queued.clear()
        return True


class _Direct(NamedTuple):
    """What ``request_line`` needs to write the JSON line structlog would, without its chain."""

    chain: list[Any]
    renderer: Any
    out: _Lines
    pid: int | None


_direct: _Direct | None = None


def ms(seconds: float) -> float:
    """``seconds`` in milliseconds to the microsecond, as ``round(seconds * 1000, 3)`` gives them
    (the float nearest the decimal), for a tenth of its cost: ``round`` with digits goes through a
    decimal string, and every call rounds three or four durations."""
    return round(seconds * 1_000_000) / 1000


def request_line(fields: dict[str, Any]) -> None:
    """The canonical per-request line, at level info: the line the JSON chain of ``setup_logging``
    would write (the same keys in the same order, the same encoder and file, under its lock),
    written straight, as a busy proxy writes one per request and the chain cost about 5 us of
    its 120, and written with the other request lines of the same turn of the event loop
    (``_Lines``). Through structlog like any other line when the chain is not that one (console
    output, a test's ``capture_logs``)."""
    direct = _direct
    if direct is None or not direct.chain or direct.chain[-1] is not direct.renderer:
        _LOGGER.info("request", **fields)
        return
    fields["event"] = "request"
    fields["level"] = "info"
    fields["timestamp"] = _utc_stamp()
    if direct.pid is not None:
        fields["pid"] = direct.pid
    direct.out.queue(_encode(fields))


#: The second of the latest stamp and its text up to the seconds (``2026-12-01T02:10:04``);
#: none before the first stamp (any int would be a second a clock can read: 1970's first).
_second: tuple[int | None, str] = (None, "")


def _utc_stamp() -> str:
    """Now, as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes it (``datetime.isoformat``
    with ``Z``: microseconds unless they are zero), with the date and time formatted once a second
    rather than once a line."""
    global _second
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    second, text = _second
    if second != seconds:
        text = datetime.fromtimestamp(seconds, UTC).isoformat()[:-6]  # without "+00:00"
        _second = (seconds, text)
    micros = nanos // 1000
    return f"{text}.{micros:06d}Z" if micros else text + "Z"


def _with_pid(pid: int) -> structlog.typing.Processor:
    def add_pid(_: Any, __: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
        event["pid"] = pid
        return event
    return add_pid


def _encode(event: Any, **_: Any) -> bytes:
    return msgspec.json.encode(event, enc_hook=str)


_LOGGER: structlog.typing.FilteringBoundLogger = structlog.get_logger("projectionist")
_request_lines = True


def get_logger() -> structlog.typing.FilteringBoundLogger:
    """The process's logger (a lazy proxy: it follows ``setup_logging`` and test captures)."""
    return _LOGGER


def request_lines() -> bool:
    """Whether the per-request line is emitted at all (level ``info`` or finer)."""
    return _request_lines


def redact_url(url: str) -> str:
    """``url`` with any user and password replaced by ``***``, for log lines and messages."""
    try:
        parsed = URL(url)
    except ValueError:
        return "<unparseable url>"
    if parsed.raw_password is None and parsed.raw_user is None:
        return url
    return str(parsed.with_user("***").with_password(None))
