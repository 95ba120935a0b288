"""Send, the third stage of a call (proxy layer, call sublayer): the body goes upstream through the
upstream's transport (``relay``), the answer comes back chunk by chunk, and what the call reports
reaches its recorder (the fourth stage, ``record``), the log line and the metrics.

``send`` sends a prepared (projected) call: while it is in flight, its images count as carried
(``inflight``), for attributing a concurrent refusal. ``relay_body`` sends any body: a
projected one, one already read (the Files API), or the request's own stream as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import Any, Final

from aiohttp import web
from multidict import CIMultiDict

from ...adapters.responses import tokens
from ...policy.errors import ProjectionistError, UpstreamError
from ..observe.logger import ms
from . import conversations
from .call import Call
from .outgoing import base_url_mistake, naming, outgoing_headers, target_url
from .prepare import MODEL_MAX, Prepared
from .read import Inbound
from .record import Meter, Recorder
from .relay import Body, relay
from .resend import Resend


async def send(call: Call, inbound: Inbound, prepared: Prepared) -> web.StreamResponse:
    built, recorder, screen = prepared.built, prepared.recorder, prepared.screen
    meter = Meter() if recorder is None else None
    with in_flight(call, inbound, prepared):
        response = await relay_body(call, built.body, prepared.headers, recorder=recorder, screen=screen, meter=meter)
    if inbound.unlinked and 200 <= response.status < 300 and inbound.found is not None:
        link(call, inbound.unlinked, inbound.found.id)
    return response


def link(call: Call, keys: tuple[str, ...], session: str) -> None:
    """Link the images of an answered call the conversations index does not know yet to its
    session, off the request (``conversations.link_later``)."""
    request = call.request
    scopes = conversations.scopes_of(call.ctx.tenant, request.headers, request.query, keys)
    call.services.background(conversations.link_later(call.services.log, scopes, keys, session))


#: What a call that carries no image holds while it is in flight: nothing (one, for every such call).
_NOTHING: Final = contextlib.nullcontext()


def in_flight(call: Call, inbound: Inbound, prepared: Prepared) -> contextlib.AbstractContextManager[Any]:
    """While the block runs, the images of ``prepared``'s body count as carried by this call
    (``inflight``; a call of no session, or with no image, carries none)."""
    if inbound.session_id is None or not prepared.built.images:
        return _NOTHING
    carrying = call.services.inflight.carrying(inbound.session_id, call.fmt.FORMAT, prepared.carried, call.timing)
    prepared.in_flight.append(carrying)  # a re-send updates what it carries
    return carrying


async def relay_body(
    call: Call,
    body: Body,
    headers: CIMultiDict[str] | None = None,
    recorder: Recorder | None = None,
    screen: Resend | None = None,
    meter: Meter | None = None,
) -> web.StreamResponse:
    """Relay ``body`` to the call's upstream and the answer back; timing goes to the log line and
    metrics, and the recorder (if any) hears how the call ended. A ``screen`` may send the call
    once more (an image the upstream refused); then its recorder is the one that hears. What the
    answer reports (usage, model) is read from the recorder, else from ``meter``."""
    request, services, ctx, upstream, timing = call.request, call.services, call.ctx, call.upstream, call.timing
    url = target_url(call.raw_path, request.rel_url.raw_query_string, call.fmt, upstream, services.guard)
    if headers is None:
        headers = outgoing_headers(request.headers, call.fmt, upstream, services.guard)
    if ctx.trace is not None:
        ctx.trace.inject(headers)
    try:
        response = await relay(request, upstream.session, url, body, headers, timing,
                               request_id=ctx.request_id, observer=recorder or meter, screen=screen,
                               write_timeout=services.config.server.write_timeout,
                               on_404=partial(_mistake, call))
    except ProjectionistError as error:
        if (hearing := _hearing(screen, recorder)) is not None:
            hearing.failed(error.code)
        if isinstance(error, UpstreamError):
            raise naming(error, upstream) from None
        raise
    except asyncio.CancelledError:
        if (hearing := _hearing(screen, recorder)) is not None:
            hearing.cancelled()
        raise
    finally:
        ctx.fields.update(upstream_status=timing.status, upstream_ms=ms(timing.upstream_s))
        if timing.status is not None:
            services.metrics.upstream_answered(upstream.name, timing.headers_s)
    recorder = screen.recorder if screen is not None else recorder  # ``_hearing`` written out: every call takes it
    watched = recorder or meter
    if watched is not None:
        report_usage(call, watched)
    if recorder is not None:
        recorder.finished(response.status)
    return response


def _hearing(screen: Resend | None, recorder: Recorder | None) -> Recorder | None:
    """The recorder that hears how a call ended: the screen's (it may have sent the call once
    more), else the call's own."""
    return screen.recorder if screen is not None else recorder


def _mistake(call: Call) -> str | None:
    """``base_url_mistake`` of ``call`` (asked only when its upstream answered 404)."""
    return base_url_mistake(call.request.method, call.raw_path, call.upstream, call.services.config.public_url)


def report_usage(call: Call, meter: Meter) -> None:
    """The usage and model an answer reported: to the log line, the token counters (by the
    model the answer names, else the one the request named) and the span."""
    ctx = call.ctx
    usage, model = meter.reported(call.fmt)
    if usage is None:
        return
    input_tokens, output_tokens = tokens(usage)
    if input_tokens is not None:
        ctx.fields["input_tokens"] = input_tokens
    if output_tokens is not None:
        ctx.fields["output_tokens"] = output_tokens
    call.services.metrics.used(call.upstream.name, model or ctx.fields.get("model"), input_tokens, output_tokens)
    if ctx.trace is not None:
        ctx.trace.answered(model=model[:MODEL_MAX] if model else None, input_tokens=input_tokens,
                           output_tokens=output_tokens)
