"""Read, the first stage of a projected call (proxy layer, call sublayer): its body, and the session
it belongs to by ``sessions``' order, with the body as ``body.read_images`` read it for
that (only when it may hold images and nothing before the body named a session).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...policy.model import scoped_session
from ..inbound.bodies import read_body
from .body import Read, decode_json, fetched, may_hold_inline, may_hold_refs, may_hold_urls, read_images
from . import sessions
from .call import Call


@dataclass(slots=True, eq=False)
class Inbound:
    """What the read found: the body as it came (decoded), its session (scoped to the tenant),
    and the body's tree and images when reading it for the session parsed it already."""

    raw: bytes
    found: sessions.Found | None
    session_id: str | None
    read: Read | None


async def read(call: Call) -> Inbound:
    return inbound_of(call, await read_body(call.request, call.services.budget, call.ctx))


def inbound_of(call: Call, raw: bytes) -> Inbound:
    """What the read finds of ``raw``, the call's body as it came (a request's, decoded; a
    WebSocket message's)."""
    found, parsed = _session(call, raw)
    ctx = call.ctx
    if found is not None:
        found = sessions.checked(found)
    session_id = scoped_session(ctx.tenant, found.id) if found is not None else None
    ctx.fields.update(adapter=call.fmt.NAME, session=session_id)
    if found is not None and found.source not in ("header", "path"):
        ctx.fields["session_source"] = found.source
    return Inbound(raw, found, session_id, parsed)


def _session(call: Call, raw: bytes) -> tuple[sessions.Found | None, Read | None]:
    """The request's session by ``sessions``' order, with the body as ``read_images`` read it for
    that (only when it may hold images and nothing before the body named one)."""
    request, services, fmt = call.request, call.services, call.fmt
    found = sessions.named(request.headers, services.session_headers[0], services.session_headers[1:],
                           request.get(sessions.PATH_SESSION))
    if found is not None or not services.config.server.client_sessions:
        return found, None
    found = sessions.from_headers(request.headers)
    if found is not None:
        return found, None
    read: Read
    if services.config.policy.inline_images and may_hold_inline(raw):
        read = read_images(fmt, raw, services.identities)
    elif may_hold_refs(raw) or (services.config.policy.url_images and may_hold_urls(fmt, raw)):
        read = (None, decode_json(raw), [])
    else:
        return None, None
    _, tree, client = read
    found = sessions.from_body(fmt, tree, request.headers)
    if found is None and (client or services.config.policy.url_images and fetched(fmt, tree, services.http_refs)):
        # images of its own, or URLs the provider fetches: a session derived from its opening
        found = sessions.derived(fmt, request.headers, tree, {id(c.value): aid for c, aid in client}, request.query)
    # references alone keep the sessionless policy
    return found, read
