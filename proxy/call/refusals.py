"""A refusal of an image's bytes holds for every session of the tenant (proxy layer, call sublayer).

When an upstream format refuses one image exactly (a refusal that names its place, or the one
new image of the call: ``Rejected.suspects == 1``), the refusal is about those bytes on that
format, not about the session that sent them. ``share`` records it in the tenant's own refusals
log, a session of the log like any other (``scope_of``: ``~refusals``, behind the tenant's name
when client tokens name tenants; without them ``~refusals@`` and a digest of the request's
credential, as derived sessions are scoped), durably and once. Every later call of any session of the same
tenant that carries those bytes to that format finds it (``standing``) before it is built: its
session gets an ``attachment/rejected`` of its own, durably, and the image its placeholder, with
no refused round trip. Each session's own log then holds what its calls were built from, so
restart, fork and replay stay byte-identical without the tenant's log.

Never across tenants: each tenant's refusals are its own session, which no other tenant's name
can reach (nor, without tenants, another credential). Refusals about the context of the images (the many-image rule, a model that takes none)
are rules about a target, never shared here. An operator's recovery of the image in any session
of the tenant (the admin API, ``projectionist recover``) lifts it in the tenant's log too, and so
does a recovery in the refusals session itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from ...policy.events import Rejected
from ...policy.fold import EMPTY
from multidict import MultiMapping

from ...policy.model import TENANT_MARK, is_tenant, scoped_session
from ...policy.ports import AttachmentStore, SessionLog
from ...policy.projection import recover, reject
from ...policy.transitions import refresh
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


def _scopes_of(session_id: str, known: Iterable[str], tenants: bool) -> list[str]:
    """The refusals sessions among ``known`` that a recovery in ``session_id`` lifts: with client
    tokens naming tenants (``tenants``), its tenant's; without, those of every credential (the
    operator vouched for the bytes). Whether there are tenants is the deployment's, never read
    off the shape of a session id (a client may name one ``a~b``)."""
    if not tenants:
        return [s for s in known if s != session_id and s.startswith(SCOPE + "@")]
    tenant, mark, _ = session_id.partition(TENANT_MARK)
    own = scoped_session(tenant, SCOPE) if mark and is_tenant(tenant) else None
    return [s for s in known if s != session_id and s == own]


async def standing(log: CachedLog, scope: str, upstream_format: str, ids: Iterable[str]) -> list[Rejected]:
    """The tenant's refusals of ``ids`` by upstreams of ``upstream_format`` (its cached fold when
    the log's watch vouches for it, else read)."""
    state = log.fresh(scope)
    if state is None:
        state = await refresh(log, scope, log.state(scope) or EMPTY)
    if not state.rejected:
        return []
    return [found for aid in ids if (found := state.rejected.get((upstream_format, aid))) is not None]


async def share(log: CachedLog, scope: str, rejected: Sequence[Rejected]) -> int:
    """Record the exact ones of ``rejected`` in the tenant's refusals log, once: how many it appended."""
    exact = tuple(r for r in rejected if r.suspects == 1)
    if not exact:
        return 0
    _, new = await reject(exact, log=log, session_id=scope, lock=log.lock(scope), state=log.state(scope))
    return len(new)


async def lift(store: AttachmentStore, log: SessionLog, index: Log, session_id: str, attachment_id: str, *,
               tenants: bool) -> int:
    """After an operator recovered ``attachment_id`` in ``session_id``: lift the refusals of it that
    the tenant's refusals sessions hold too (each after the same full verification; the append is
    conditional, as every transition's). How many it lifted."""
    known = [stats.session for stats in await index.session_stats() if stats.session.startswith(SCOPE)
             or TENANT_MARK + SCOPE in stats.session]
    lifted = 0
    for scope in _scopes_of(session_id, known, tenants):
        lifted += (await recover(attachment_id, store=store, log=log, session_id=scope)).event is not None
    return lifted
