"""Read, the first stage of a projected call (proxy layer, call sublayer): its body, and the session
it belongs to by ``sessions``' order, with the body as ``body.read_images`` read it for
that (only when it may hold images and nothing before the body named a session); a derived
session as the conversations index continues it (``conversations``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from ...policy.errors import Unavailable
from ...policy.model import scoped_session
from ..inbound.bodies import read_body
from .body import Read, decode_json, fetched, may_hold_inline, may_hold_refs, may_hold_urls, read_images
from . import conversations, sessions
from .call import Call


@dataclass(slots=True, eq=False)
class Inbound:
    """What the read found: the body as it came (decoded), its session (scoped to the tenant),
    and the body's tree and images when reading it for the session parsed it already; for a
    derived session, its images' keys (``sessions.image_keys``), which may continue another."""

    raw: bytes
    found: sessions.Found | None
    session_id: str | None
    read: Read | None
    links: tuple[str, ...] = ()
    #: Of ``links``, the ones the conversations index does not link yet (``continued`` found them).
    unlinked: tuple[str, ...] = ()


async def read(call: Call) -> Inbound:
    inbound = inbound_of(call, await read_body(call.request, call.services.budget, call.ctx))
    return await continued(call, inbound) if inbound.links else inbound


async def continued(call: Call, inbound: Inbound) -> Inbound:
    """``inbound`` (of a derived session: ``links`` set), its derived session continued by the conversations index when one of its
    images was sent before under another (``conversations``; the log line's ``session_source``
    says ``continued``), with the images the index does not link yet (``send`` links them once
    the call was answered). An index the log cannot read within ``conversations.TIMEOUT`` never
    fails or holds up the request: it keeps its derived session (the log line's
    ``session_index`` names why)."""
    if inbound.found is None:
        return inbound
    request = call.request
    scopes = conversations.scopes_of(call.ctx.tenant, request.headers, request.query, inbound.links)
    index = conversations.index_of(call.services.log)
    try:
        session, unlinked = await asyncio.wait_for(index.resolve(scopes, inbound.links, inbound.found.id),
                                                   conversations.TIMEOUT)
    except (Unavailable, TimeoutError) as error:
        call.ctx.fields["session_index"] = error.code if isinstance(error, Unavailable) else "TIMEOUT"
        return inbound
    if session == inbound.found.id:
        return replace(inbound, unlinked=unlinked)
    session_id = scoped_session(call.ctx.tenant, session)
    call.ctx.fields.update(session=session_id, session_source="continued")
    return replace(inbound, found=sessions.Found(session, "continued"), session_id=session_id, unlinked=unlinked)


def inbound_of(call: Call, raw: bytes) -> Inbound:
    """What the read finds of ``raw``, the call's body as it came (a request's, decoded; a
    WebSocket message's)."""
    found, parsed, links = _session(call, raw)
    ctx = call.ctx
    if found is not None:
        found = sessions.checked(found)
    session_id = scoped_session(ctx.tenant, found.id) if found is not None else None
    ctx.fields.update(adapter=call.fmt.NAME, session=session_id)
    if found is not None and found.source not in ("header", "path"):
        ctx.fields["session_source"] = found.source
    return Inbound(raw, found, session_id, parsed, links)


def _session(call: Call, raw: bytes) -> tuple[sessions.Found | None, Read | None, tuple[str, ...]]:
    """The request's session by ``sessions``' order, with the body as ``read_images`` read it for
    that (only when it may hold images and nothing before the body named one), and, for a derived
    one, its images' keys."""
    request, services, fmt = call.request, call.services, call.fmt
    found = sessions.named(request.headers, services.session_headers[0], services.session_headers[1:],
                           call.ctx.path_session)
    if found is not None or not services.config.server.client_sessions:
        return found, None, ()
    found = sessions.from_headers(request.headers)
    if found is not None:
        return found, None, ()
    read: Read
    if services.config.policy.inline_images and may_hold_inline(raw):
        read = read_images(fmt, raw, services.identities)
    elif may_hold_refs(raw) or (services.config.policy.url_images and may_hold_urls(fmt, raw)):
        read = (None, decode_json(raw), [])
    else:
        return None, None, ()
    _, tree, client = read
    found = sessions.from_body(fmt, tree, request.headers)
    if found is None and (client or services.config.policy.url_images and fetched(fmt, tree, services.http_refs)):
        # images of its own, or URLs the provider fetches: a session derived from its opening
        images = {id(c.value): aid for c, aid in client}
        found = sessions.derived(fmt, request.headers, tree, images, request.query)
        if found is not None:
            return found, read, sessions.image_keys(fmt, request.headers, tree, images, request.query)
    # references alone keep the sessionless policy
    return found, read, ()
