"""The proxied call (proxy layer, call sublayer): one object, built once by the edge, that every
stage of the call reads.

``Call`` holds what the edge decided: the request, the app's services, the request's context, the
wire format (the adapter, when the call is projected), the upstream and the checked path, and the
timing of the upstream leg. The stages
hand their results on as values of their own (``read.Inbound``, ``prepare.Prepared``), so a call
flows one way: read → prepare → send → record, and a re-send goes through the same stages again.
"""

from __future__ import annotations

from dataclasses import dataclass

from urllib.parse import unquote

from aiohttp import web

from ...adapters.base import WireFormat
from ...adapters.registry import SPEAKS, projecting
from ..inbound.context import Context, Timing
from ..inbound.services import Services
from ..upstream.target import Upstream
from ..upstream.urls import check_path


@dataclass(slots=True, eq=False)
class Call:
    """One routed request on its way upstream (see the module's docstring). ``path`` is the
    checked path decoded once; ``projected`` says whether the policy projects its body (a
    generation or token-counting call of the upstream's format), and then ``fmt`` is its adapter."""

    request: web.Request
    services: Services
    ctx: Context
    fmt: WireFormat
    upstream: Upstream
    raw_path: str
    path: str
    projected: bool
    timing: Timing

    @classmethod
    def of(cls, request: web.Request, services: Services, ctx: Context, upstream: Upstream, raw_path: str) -> Call:
        """The call of ``request`` (its ``ctx``) to ``upstream`` at ``raw_path``: the path is
        checked (``upstream.urls.check_path``) before anything else reads it."""
        timing = Timing(ctx.started)
        check_path(raw_path)
        path = unquote(raw_path) if "%" in raw_path else raw_path
        adapter = projecting(upstream.format, request.method, path)
        fmt = ctx.fmt = adapter if adapter is not None else SPEAKS[upstream.format]
        return cls(request, services, ctx, fmt, upstream, raw_path, path, adapter is not None, timing)
