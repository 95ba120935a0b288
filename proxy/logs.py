"""Structured logging: structlog JSON, one canonical line per request (proxy layer).

Request context (request id, session, route) is bound with contextvars so every line of one
request carries it. Never log bodies, base64, API keys or tokens: callers pass counts and codes.
"""

from __future__ import annotations

import logging
import sys

import structlog


def setup_logging(level: str = "info", json: bool = True) -> None:
    """Configure structlog for a process (call once, from the CLI)."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger() -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger("projectionist")
    return logger
