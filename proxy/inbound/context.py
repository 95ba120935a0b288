"""One request's context, as every handler and stage reads it (proxy layer, inbound sublayer).

``Context`` is what the proxy knows of a request from the moment the edge's middleware makes it:
its id, start, route, the wire format its errors take, the log line's fields, the tenant.
``error_response`` renders an error in that format; ``Timing`` times the upstream leg of a call.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from ...adapters import openai_chat
from ...adapters.base import WireFormat
from ...policy.errors import ProjectionistError

if TYPE_CHECKING:  # imported only when tracing is configured
    from ..observe.tracing import CallSpan
    from .budget import Held

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ERROR_CODE_HEADER = "x-projectionist-error-code"
#: Request ids: a random per-process prefix and a counter (unique across replicas, cheap to make).
_ID_PREFIX = secrets.token_hex(3)
_ids = itertools.count(1)


class Context:
    """One request as the proxy sees it: id, start time, route name, the wire format its errors
    take, the canonical log line's fields, the response once it has started, the call's span
    when tracing is on, and the client's tenant."""

    __slots__ = ("request_id", "started", "route", "fmt", "fields", "response", "trace", "tenant", "held",
                 "path_session")

    def __init__(self, route: str) -> None:
        self.request_id = f"{_ID_PREFIX}{next(_ids):010x}"
        self.started = time.perf_counter()
        self.route = route
        self.fmt: WireFormat = openai_chat
        #: The canonical log line's fields: handlers add counts and codes, never payloads.
        self.fields: dict[str, Any] = {}
        self.response: web.StreamResponse | None = None
        self.trace: CallSpan | None = None
        #: The client's tenant, once its token is checked; None is every tenant (no client tokens,
        #: or the admin token).
        self.tenant: str | None = None
        #: The bytes of the memory budget the request holds (``budget.hold``), released at its end.
        self.held: Held | None = None
        #: The session a ``/s/{session}/`` path prefix named (``edge.routing``), already checked.
        self.path_session: str | None = None


CONTEXT = web.RequestKey("projectionist.context", Context)


def context(request: web.Request) -> Context:
    return request[CONTEXT]


def error_response(fmt: WireFormat, error: ProjectionistError) -> web.Response:
    headers = {ERROR_CODE_HEADER: error.code}
    if error.retryable and error.status == 503:
        headers["Retry-After"] = "1"
    body = msgspec.json.encode(fmt.error_body(error.code, error.public_message, error.status))
    return web.Response(status=error.status, body=body, content_type="application/json", headers=headers)


class Timing:
    """Times of one request: ``headers_s`` from sending upstream to its response headers,
    ``upstream_s`` to the end of its body; ``request_started`` is when the proxy got the request."""

    __slots__ = ("request_started", "headers_s", "upstream_s", "status")

    def __init__(self, request_started: float) -> None:
        self.request_started = request_started
        self.headers_s = 0.0
        self.upstream_s = 0.0
        self.status: int | None = None
