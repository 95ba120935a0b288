"""Admin API: session summaries, events, quarantine view, verified recovery, fork, attachment
view — bearer-token guarded (proxy layer).

The same operations back the ``projectionist events|recover|fork`` CLI verbs. Decisions stay in
``policy``: recovery appends only after a verified read, under the session's lock. A session
exists once its log holds an event: the summary, events and quarantine view of one that holds
none are 404 ``SESSION_NOT_FOUND`` (the CLI's exit 1 with that code), told by the read itself (an
empty read from seq 0, a fold at seq 0), or for an empty read past ``?after=`` by the log's index.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from ...policy.errors import Code, InvalidRequest, NotFound, Unauthorized
from ...policy.events import Event
from ...policy.fold import SessionState
from ...policy.model import check_id, check_scoped_session
from ...policy.ports import SessionLog
from ...policy.projection import recover, refresh
from ..call import refusals
from ..call.sessions import is_own
from ..inbound.bodies import read_body
from ..inbound.context import Handler, context
from ..inbound.services import SERVICES, Services
from ..sessionlog.base import Log
from ..sessionlog.summary import summaries, summary
from ..call.replay import rebuild, send_and_compare
from ..inbound.params import natural


class ForkRequest(msgspec.Struct, forbid_unknown_fields=True):
    new_session_id: str
    at_seq: int | None = None


def quarantine_view(session_id: str, state: SessionState) -> dict[str, Any]:
    return {"session": session_id, "last_seq": state.last_seq,
            "quarantined": [msgspec.to_builtins(q) for q in [*state.quarantined.values(), *state.rejected.values()]],
            "variants": [msgspec.to_builtins(v) for v in state.variants.values()]}


def events_view(session_id: str, events: list[Event]) -> dict[str, Any]:
    return {"session": session_id, "events": events}


def no_session(session_id: str) -> NotFound:
    return NotFound(f"no session {session_id!r}", code=Code.SESSION_NOT_FOUND)


async def session_events(log: SessionLog, index: Log, session_id: str, after: int = 0) -> list[Event]:
    """The events of ``session_id`` past ``after``; ``SESSION_NOT_FOUND`` when its log holds none
    at all. One read: only a read past ``after`` > 0 that finds nothing asks ``index`` (the log's
    own, ``session_stats``) whether the session has events up to it (then it is ``[]``)."""
    events = await log.read(session_id, after)
    if not events and (after == 0 or not await index.session_stats(session_id)):
        raise no_session(session_id)
    return events


async def session_state(log: SessionLog, session_id: str) -> SessionState:
    """The fold of ``session_id``; ``SESSION_NOT_FOUND`` when its log holds no event (the read's
    last seq is 0)."""
    state = await refresh(log, session_id)
    if state.last_seq == 0:
        raise no_session(session_id)
    return state


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(payload), status=status, content_type="application/json")


def _authorize(request: web.Request, app: Services) -> None:
    if not app.guard.admin_token:
        raise Unauthorized("admin API disabled: set PROJECTIONIST_ADMIN_TOKEN or --admin-token")
    if not app.guard.is_admin(request.headers):
        raise Unauthorized("missing or wrong admin bearer token")


def _admin(handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        _authorize(request, request.app[SERVICES])
        await request.app[SERVICES].recording.drain()  # the records of calls that already finished
        session_id = check_scoped_session(request.match_info["sid"])
        context(request).fields.update(session=session_id)
        return await handler(request)
    return guarded


#: The most sessions one listing returns (``?limit=``; without it, every session).
MAX_LIMIT = 100_000


async def list_sessions(request: web.Request) -> web.StreamResponse:
    """Every session's summary, the most recently active first; ``?limit=N`` keeps the first N."""
    app = request.app[SERVICES]
    _authorize(request, app)
    raw = request.query.get("limit")
    limit = None
    if raw is not None:
        limit = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 6 else 0
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidRequest(f"'limit' must be an integer from 1 to {MAX_LIMIT}", code=Code.INVALID_QUERY)
    await app.recording.drain()  # the records of calls that already finished
    found = await summaries(app.log, limit=limit)
    context(request).fields.update(sessions=len(found))
    return _json({"sessions": found})


async def get_session(request: web.Request) -> web.StreamResponse:
    """One session's summary (404 ``SESSION_NOT_FOUND`` when its log holds no event)."""
    sid = request.match_info["sid"]
    found = await summary(request.app[SERVICES].log, sid)
    if found is None:
        raise no_session(sid)
    return _json(found)


async def get_events(request: web.Request) -> web.StreamResponse:
    """The session's events past ``?after=N`` (404 ``SESSION_NOT_FOUND`` when it holds none at
    all; ``[]`` for a session with nothing past N)."""
    app = request.app[SERVICES]
    sid = request.match_info["sid"]
    after = natural(request.query.get("after", "0"))
    if after is None or not after < 2**62:
        raise InvalidRequest("'after' must be a non-negative integer", code=Code.INVALID_QUERY)
    return _json(events_view(sid, await session_events(app.log, app.log.inner, sid, after)))


async def get_quarantine(request: web.Request) -> web.StreamResponse:
    """What is quarantined in the session (404 ``SESSION_NOT_FOUND`` when it holds no event)."""
    app = request.app[SERVICES]
    sid = request.match_info["sid"]
    return _json(quarantine_view(sid, await session_state(app.log, sid)))


async def post_recover(request: web.Request) -> web.StreamResponse:
    app = request.app[SERVICES]
    sid = request.match_info["sid"]
    attachment_id = check_id(request.match_info["aid"])
    state = await session_state(app.log, sid)  # a session with no event: 404, nothing written (as the CLI)
    result = await recover(attachment_id, store=app.store, log=app.log, session_id=sid, lock=app.log.lock(sid),
                           state=state)
    # the operator vouched for the bytes: the tenant's refusal of them goes too (``call.refusals``)
    lifted = await refusals.lift(app.store, app.log, app.log.inner, sid, attachment_id,
                                 tenants=app.guard.clients_required) if result.event else 0
    context(request).fields.update(recovered=result.event is not None)
    return _json({"session": sid, "attachment_id": attachment_id, "recovered": result.event is not None,
                  "tenant_lifted": lifted, "event": result.event})


async def post_fork(request: web.Request) -> web.StreamResponse:
    app = request.app[SERVICES]
    sid = request.match_info["sid"]
    try:
        spec = msgspec.json.decode(await read_body(request, app.budget), type=ForkRequest)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"fork body: {exc}", code=Code.INVALID_REQUEST) from None
    child = check_scoped_session(spec.new_session_id)
    if is_own(child):  # a fork into the tenant's refusals or a conversations index would write into them
        raise InvalidRequest("session ids of the proxy's own (~refusals, ~conversations) take no fork",
                             code=Code.INVALID_SESSION_ID)
    event = await app.log.fork(sid, child, spec.at_seq)
    return _json({"session": child, "parent": sid, "event": event}, status=201)


class ReplayRequest(msgspec.Struct, forbid_unknown_fields=True):
    seq: int | None = None
    request_id: str | None = None
    inbound: str | None = None
    show: bool = False
    send: bool = False
    diff: bool = False
    upstream: str | None = None
    headers: dict[str, str] = {}


async def get_replay(request: web.Request) -> web.StreamResponse:
    """Rebuild a recorded call and check its digest (``?seq=N``, ``?show=1`` for the body)."""
    app = request.app[SERVICES]
    seq = natural(request.query["seq"]) if "seq" in request.query else None
    if "seq" in request.query and seq is None:
        raise InvalidRequest("'seq' must be a non-negative integer", code=Code.INVALID_QUERY)
    rebuilt = await rebuild(app.log, app.store, request.match_info["sid"], seq,
                            request_id=request.query.get("request_id"), fit=app.config.policy.fit_images)
    return _json(rebuilt.summary(show=request.query.get("show") in ("1", "true")))


async def post_replay(request: web.Request) -> web.StreamResponse:
    """Rebuild, and optionally send and diff, a recorded call (body: ``ReplayRequest``)."""
    app = request.app[SERVICES]
    try:
        spec = msgspec.json.decode(await read_body(request, app.budget) or b"{}", type=ReplayRequest)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"replay body: {exc}", code=Code.INVALID_REQUEST) from None
    inbound = spec.inbound.encode() if spec.inbound is not None else None
    rebuilt = await rebuild(app.log, app.store, request.match_info["sid"], spec.seq, inbound, request_id=spec.request_id,
                            fit=app.config.policy.fit_images)
    report = rebuilt.summary(show=spec.show)
    if spec.send or spec.diff:
        live = app.upstreams.get(rebuilt.request.upstream)
        report.update(await send_and_compare(rebuilt, app.config, app.store, upstream_url=spec.upstream,
                                             headers=spec.headers, compare=spec.diff,
                                             transport=live.client if live is not None else None))
    return _json(report)


async def get_attachment(request: web.Request) -> web.StreamResponse:
    """One attachment as admitted (its record, no bytes read) and its variants (target -> id)."""
    app = request.app[SERVICES]
    _authorize(request, app)
    attachment_id = check_id(request.match_info["aid"])
    context(request).fields.update(attachment=attachment_id[:15])
    meta = await app.store.stat(attachment_id)
    if meta is None:
        raise NotFound(f"no attachment {attachment_id[:15]}", code=Code.FILE_NOT_FOUND)
    view: dict[str, Any] = {"id": meta.id, "media_type": meta.media_type, "bytes": meta.bytes,
                            "width": meta.width, "height": meta.height}
    if meta.name:
        view["name"] = meta.name
    view["created_at"] = meta.created_at
    view["variants"] = await app.variants.of(attachment_id)
    return _json(view)


def add_admin_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/admin/attachments/{aid}", get_attachment, allow_head=False, name="admin.attachment")
    router.add_get("/admin/sessions", list_sessions, allow_head=False, name="admin.sessions")
    base = "/admin/sessions/{sid}"
    router.add_get(base, _admin(get_session), allow_head=False, name="admin.session")
    router.add_get(f"{base}/events", _admin(get_events), name="admin.events")
    router.add_get(f"{base}/quarantine", _admin(get_quarantine), name="admin.quarantine")
    router.add_post(f"{base}/attachments/{{aid}}/recover", _admin(post_recover), name="admin.recover")
    router.add_post(f"{base}/fork", _admin(post_fork), name="admin.fork")
    router.add_get(f"{base}/replay", _admin(get_replay), name="admin.replay")
    router.add_post(f"{base}/replay", _admin(post_replay), name="admin.replay")
