"""A refusal of an image's bytes holds for every session of the tenant (proxy layer, call sublayer).

When an upstream format refuses one image exactly (a refusal that names its place, or the one
new image of the call: ``Rejected.suspects == 1``), the refusal is about those bytes on that
format, not about the session that sent them. ``share`` records it in the tenant's own refusals
log, a session of the log like any other (``scope_of``: ``~refusals``, behind the tenant's name
when client tokens name tenants; without them ``~refusals@`` and a digest of the request's
credential, as derived sessions are scoped), durably and once. Every later call of any session
of the same tenant that carries those bytes to that format finds it (``standing``) before it is
built: its session gets an ``attachment/rejected`` of its own, durably, and the image its
placeholder, with no refused round trip. Each session's own log then holds what its calls were
built from, so restart, fork and replay stay byte-identical without the tenant's log.

Never across tenants: each tenant's refusals are its own session, which no other tenant's name
can reach (nor, without tenants, another credential). Refusals about the context of the images
(the many-image rule, a model that takes none) are rules about a target, never shared here. An
operator's recovery of the image in any session of the tenant (the admin API, ``projectionist
recover``) lifts it in the tenant's log too, and so does a recovery in the refusals session
itself. And no refusal hides an image for ever: one recorded more than ``[policy]
refusal_reprobe_after`` ago no longer holds for a session that has not met it yet; that session
sends the image once more, and a refusal of it again records it anew.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Final

from multidict import MultiMapping

from ...policy.events import RecoveredEvent, Rejected, RejectedEvent
from ...policy.fold import EMPTY, SessionState
from ...policy.model import TENANT_MARK, is_tenant, scoped_session
from ...policy.ports import AttachmentStore, SessionLog
from ...policy.projection import recover
from ...policy.transitions import refresh, transition
from ..sessionlog.base import Log
from ..sessionlog.cached import CachedLog
from .sessions import RESERVED, credentials

#: The id of the refusals session (behind a tenant's name and ``~`` when there is one); no
#: client may name a session so (``sessions.RESERVED``).
SCOPE: Final = RESERVED


def scope_of(tenant: str | None, headers: MultiMapping[str], query: MultiMapping[str] | None = None) -> str:
    """The refusals session of ``tenant``; without one (no client tokens), of the credential the
    request carries, in its headers or its query (``@`` and its short digest, as a derived
    session is scoped): clients that bring their own provider keys never share what they learnt."""
    return scoped_session(tenant, SCOPE) if tenant is not None else f"{SCOPE}@{credentials(headers, query)}"


async def _scopes_of(session_id: str, index: Log, tenants: bool) -> list[str]:
    """The refusals sessions a recovery in ``session_id`` lifts: with client tokens naming tenants
    (``tenants``), its tenant's; without, those of every credential the log holds (the operator
    vouched for the bytes). Whether there are tenants is the deployment's, never read off the
    shape of a session id (a client may name one ``a~b``)."""
    if not tenants:
        return [stats.session for stats in await index.session_stats() if stats.session.startswith(SCOPE + "@")]
    tenant, mark, _ = session_id.partition(TENANT_MARK)
    own = scoped_session(tenant, SCOPE) if mark and is_tenant(tenant) else None
    return [own] if own is not None and own != session_id else []


#: When each refusal of each refusals session was recorded (epoch seconds), per log, as far as
#: its last seq: read once, then only what is new (a refusals session holds a few events).
_RECORDED: weakref.WeakKeyDictionary[CachedLog, dict[str, tuple[int, dict[tuple[str, str], float]]]] = \
    weakref.WeakKeyDictionary()


async def _state(log: CachedLog, scope: str) -> SessionState:
    """The refusals session's fold: cached when the log's watch vouches for it, else read."""
    state = log.fresh(scope)
    return state if state is not None else await refresh(log, scope, log.state(scope) or EMPTY)


async def _recorded(log: CachedLog, scope: str, state: SessionState) -> dict[tuple[str, str], float]:
    """When each standing refusal of ``scope`` was (last) recorded, by (format, attachment id)."""
    known = _RECORDED.setdefault(log, {})
    last, times = known.get(scope, (0, {}))
    if state.last_seq > last:
        times = dict(times)
        for event in await log.read(scope, last):
            if isinstance(event, RejectedEvent):
                times[(event.data.format, event.data.attachment_id)] = _epoch(event.time)
            elif isinstance(event, RecoveredEvent):
                times = {key: at for key, at in times.items() if key[1] != event.data.attachment_id}
            last = max(last, event.seq)
        known[scope] = (last, times)
    return times


def _epoch(value: str) -> float:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return 0.0  # an unreadable time: as old as can be, so the image is tried again
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()


async def standing(log: CachedLog, scope: str, upstream_format: str, ids: Iterable[str], *,
                   reprobe_after: float = 0.0) -> list[Rejected]:
    """The tenant's refusals of ``ids`` by upstreams of ``upstream_format``, but those recorded
    more than ``reprobe_after`` seconds ago (0: none is): the image is tried again then, and a
    refusal of it again records it anew (``share``)."""
    state = await _state(log, scope)
    if not state.rejected:
        return []
    found = [hit for aid in ids if (hit := state.rejected.get((upstream_format, aid))) is not None]
    if not found or reprobe_after <= 0:
        return found
    times = await _recorded(log, scope, state)
    cutoff = time.time() - reprobe_after
    return [r for r in found if times.get((r.format, r.attachment_id), 0.0) >= cutoff]


async def share(log: CachedLog, scope: str, rejected: Sequence[Rejected], *, reprobe_after: float = 0.0) -> int:
    """Record the exact ones of ``rejected`` in the tenant's refusals log, once, and anew where the
    standing one is older than ``reprobe_after``: how many it appended."""
    exact = tuple(r for r in rejected if r.suspects == 1)
    if not exact:
        return 0
    state = await _state(log, scope)
    times = await _recorded(log, scope, state) if reprobe_after > 0 and state.rejected else {}
    cutoff = time.time() - reprobe_after

    def missing(now: SessionState) -> list[Rejected]:
        return [r for r in exact if (r.format, r.attachment_id) not in now.rejected
                or reprobe_after > 0 and times.get((r.format, r.attachment_id), 0.0) < cutoff]

    _, new, _ = await transition(log, scope, state, log.lock(scope), "sharing a refusal", missing)
    return len(new)


async def lift(store: AttachmentStore, log: SessionLog, index: Log, session_id: str, attachment_id: str, *,
               tenants: bool) -> int:
    """After an operator recovered ``attachment_id`` in ``session_id``: lift the refusals of it that
    the tenant's refusals sessions hold too (each after the same full verification; the append is
    conditional, as every transition's). How many it lifted."""
    lifted = 0
    for scope in await _scopes_of(session_id, index, tenants):
        lifted += (await recover(attachment_id, store=store, log=log, session_id=scope)).event is not None
    return lifted
