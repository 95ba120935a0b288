"""One middleware for every route: request context, the canonical log line, errors in the client's
wire shape, and nothing ever written into a response that has started (proxy layer).

Routing names the wire format a request's errors take (``Context.fmt``); any ``ProjectionistError``
(and any bug, as a 500 ``UNCLASSIFIED_ERROR``) raised before the response starts is rendered the
way that provider's SDK parses it. Once the response has started (aiohttp's
``on_response_prepare`` says so), an error is logged and counted and the connection is closed, so
the client sees a cut response, never a second status line inside the first one.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web
from aiohttp.web_exceptions import HTTPException

from ...adapters import openai_chat
from ...adapters.base import WireFormat
from ...policy.errors import Code, InternalError, InvalidRequest, PayloadTooLarge, ProjectionistError
from ..observe.logger import get_logger, ms, request_line, request_lines
from ..observe.metrics import Metrics
from ..call.relay import REQUEST_ID_HEADER, abort
from ..inbound.context import CONTEXT, Context, Handler, error_response

#: The token of a Gemini upload URL (``files.gemini.UPLOAD_ROUTE``), under a session prefix too.
_UPLOAD_TOKEN = re.compile(r"(/v1/attachments/uploads/)[^/]+")

def _translate(exc: Exception) -> ProjectionistError | None:
    """aiohttp's and msgspec's words for a bad request body, as the client's errors."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge("request body exceeds the configured client_max_size")
    if isinstance(exc, (msgspec.DecodeError, RecursionError)):
        return InvalidRequest("request body is not valid JSON", code=Code.INVALID_JSON)
    if isinstance(exc, web.RequestPayloadError):
        return InvalidRequest("request body cannot be decoded (Content-Encoding)", code=Code.INVALID_BODY)
    return None


def context_middleware(metrics: Metrics, quiet: frozenset[str]) -> Any:
    """The middleware; routes named in ``quiet`` (health, metrics) get no context and no count."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.name or "unrouted"
        if route in quiet:
            return await handler(request)
        ctx = request[CONTEXT] = Context(route)
        metrics.in_flight += 1
        try:
            response = await handler(request)
        except ProjectionistError as error:
            response = _failed(request, ctx, metrics, error)
        except asyncio.CancelledError:
            metrics.answered(ctx.route, "cancelled", ctx.fields.get("upstream", ""))
            _log_line(request, ctx, status=None, cancelled=True)
            if ctx.trace is not None:
                ctx.trace.end(None, ctx.fields)
            raise
        except Exception as exc:
            translated = _translate(exc)
            if translated is None:
                if isinstance(exc, HTTPException):
                    if ctx.trace is not None:
                        ctx.trace.end(exc.status, ctx.fields)
                    raise
                get_logger().exception("unhandled_error", request_id=ctx.request_id, route=ctx.route)
                translated = InternalError("internal error; see the proxy log")
            response = _failed(request, ctx, metrics, translated)
        finally:
            metrics.in_flight -= 1
            if ctx.held is not None:  # the bytes of the memory budget it held
                ctx.held.release()
        if not response.prepared:
            response.headers[REQUEST_ID_HEADER] = ctx.request_id
        metrics.answered(ctx.route, response.status, ctx.fields.get("upstream", ""))
        if request_lines():
            _log_line(request, ctx, status=response.status)
        if ctx.trace is not None:
            ctx.trace.end(response.status, ctx.fields)
        return response

    return middleware


def _failed(request: web.Request, ctx: Context, metrics: Metrics, error: ProjectionistError) -> web.StreamResponse:
    ctx.fields["error_code"] = error.code
    if error.public_message != error.message:  # the client gets the code's own words; the detail stays here
        get_logger().warning("error_detail", code=error.code, detail=error.message, request_id=ctx.request_id)
    started = ctx.response
    if started is not None and started.prepared:
        metrics.errors_after_start += 1
        get_logger().error("error_after_response_started", code=error.code, request_id=ctx.request_id,
                           route=ctx.route)
        abort(request)
        return started
    return error_response(ctx.fmt, error)


async def note_started(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: from here on, this request's response has started."""
    try:
        ctx = request[CONTEXT]  # (``get`` is a Python ``Mapping`` method on a request: two calls, not one)
    except KeyError:  # a quiet route
        return
    ctx.response = response


def _log_line(request: web.Request, ctx: Context, **extra: Any) -> None:
    """The canonical line; ``path`` is the raw path without its query (where keys may travel) and
    without the token of a Gemini upload URL (that upload's only credential)."""
    duration_ms = ms(time.perf_counter() - ctx.started)
    path = request.rel_url.raw_path
    if "/uploads/" in path:  # the substitution costs a microsecond; nearly every path has no token
        path = _UPLOAD_TOKEN.sub(r"\1***", path)
    request_line({"method": request.method, "path": path, "duration_ms": duration_ms, "route": ctx.route,
                  "request_id": ctx.request_id, **extra, **ctx.fields})
