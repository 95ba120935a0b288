"""The proxied call (proxy layer, call sublayer): one object, built once by the edge, that every
stage of the call reads.

``Call`` holds what the edge decided: the request, the app's services, the request's context, the
wire format, the upstream and the checked path, and the timing of the upstream leg. The stages
hand their results on as values of their own (``read.Inbound``, ``project.Prepared``), so a call
flows one way: read → prepare → send → record, and a re-send goes through the same stages again.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from ...adapters.base import WireFormat
from ..inbound.context import Context, Timing, context
from ..inbound.services import SERVICES, Services
from ..upstream.target import Upstream


@dataclass(slots=True, eq=False)
class Call:
    """One routed request on its way upstream (see the module's docstring)."""

    request: web.Request
    services: Services
    ctx: Context
    fmt: WireFormat
    upstream: Upstream
    raw_path: str
    timing: Timing

    @classmethod
    def of(cls, request: web.Request, fmt: WireFormat, upstream: Upstream, raw_path: str) -> Call:
        ctx = context(request)
        return cls(request, request.app[SERVICES], ctx, fmt, upstream, raw_path, Timing(ctx.started))
