"""Endpoint wrapper: request context, canonical log line, errors in the client's wire shape (proxy layer).

Every route is wrapped once with the wire format its clients speak, so any ``ProjectionistError``
(and any bug, as a 500 ``UNCLASSIFIED_ERROR``) is rendered the way that provider's SDK parses it.
Errors are decided before the first response byte; a handler that already started streaming
never gets an error body appended.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from projectionist.adapters.base import WireFormat
from projectionist.policy.errors import InternalError, InvalidRequest, PayloadTooLarge, ProjectionistError
from projectionist.proxy.observe.logger import get_logger, request_lines
from projectionist.proxy.http.services import APP

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
INFO = web.RequestKey("projectionist.info", dict[str, Any])
REQUEST_ID = web.RequestKey("projectionist.request_id", str)
STARTED = web.RequestKey("projectionist.started", float)
#: Request ids: a random per-process prefix and a counter (unique across replicas, cheap to make).
_ID_PREFIX = secrets.token_hex(3)
_ids = itertools.count(1)
REQUEST_ID_HEADER = "x-projectionist-request-id"
ERROR_CODE_HEADER = "x-projectionist-error-code"


def error_response(fmt: WireFormat, error: ProjectionistError) -> web.Response:
    headers = {ERROR_CODE_HEADER: error.code}
    if error.retryable and error.status == 503:
        headers["Retry-After"] = "1"
    body = msgspec.json.encode(fmt.error_body(error.code, error.message, error.status))
    return web.Response(status=error.status, body=body, content_type="application/json", headers=headers)


def info(request: web.Request) -> dict[str, Any]:
    """The canonical log line's fields for this request; handlers add counts, never payloads."""
    return request[INFO]


async def respond(
    request: web.Request, fmt: WireFormat, route: str, call: Callable[[], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Run ``call`` as one request: context, canonical log line, errors in ``fmt``'s wire shape."""
    request_id = f"{_ID_PREFIX}{next(_ids):010x}"
    fields: dict[str, Any] = {"route": route, "request_id": request_id}
    request[INFO] = fields
    request[REQUEST_ID] = request_id
    request[STARTED] = started = time.perf_counter()
    metrics = request.app[APP].metrics
    metrics.in_flight += 1
    try:
        response = await _call(call)
    except ProjectionistError as error:
        fields["error_code"] = error.code
        response = error_response(fmt, error)
    except asyncio.CancelledError:
        metrics.answered(route, "cancelled")
        _log_line(request, fields, started, status=None, cancelled=True)
        raise
    except Exception:
        get_logger().exception("unhandled_error", request_id=request_id, route=route)
        internal = InternalError("internal error; see the proxy log")
        fields["error_code"] = internal.code
        response = error_response(fmt, internal)
    finally:
        metrics.in_flight -= 1
    if not response.prepared:
        response.headers[REQUEST_ID_HEADER] = request_id
    metrics.answered(route, response.status)
    if request_lines():
        _log_line(request, fields, started, status=response.status)
    return response


def endpoint(fmt: WireFormat, route: str) -> Callable[[Handler], Handler]:
    """Decorator form of ``respond`` for routes with a fixed format."""
    def wrap(handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            return await respond(request, fmt, route, lambda: handler(request))
        return wrapped
    return wrap


def _log_line(request: web.Request, fields: dict[str, Any], started: float, **extra: Any) -> None:
    duration_ms = round((time.perf_counter() - started) * 1000, 3)
    get_logger().info("request", method=request.method, duration_ms=duration_ms, **extra, **fields)


async def _call(call: Callable[[], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await call()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge("request body exceeds the configured client_max_size") from None
    except msgspec.DecodeError:
        raise InvalidRequest("request body is not valid JSON", code="INVALID_JSON") from None
