"""A session nobody named stays one session through its client's compaction (proxy layer, call
sublayer).

A derived session (``sessions.derived``) is named by the conversation's opening, which a
compaction rewrites: Gemini CLI and Qwen Code make their summary the first message; Gemini CLI
keeps the latest turns as they were, Qwen Code 0.24 attaches the latest images anew to the last
message. What such a request still shares with its conversation is its images. So each
credential keeps a conversations index: for every image its client inlined, keyed by its
identity with the system prompt it was sent under, the format and the credential
(``sessions.image_keys``), the session of the first request that sent it. A request whose
session is derived is the session of its first image the index knows (the derived one when it
knows none), and its images the index does not know yet are linked to that session, durably,
before its call is built.

The index is a session of the log like the tenant's refusals (``~conversations``, in
``SHARDS`` sessions by the key's first hex digit, so conversations of one credential seldom
wait on each other's links; behind the tenant's name when client tokens name tenants, else
``@`` and a digest of the credential): every replica, and a restart, reads the same links and
decides alike; the first link of a key holds (``policy.fold``), and concurrent first requests
make one transition under the shard's lock and the log's conditional append. Each image is
linked once, when a request first carries it: a turn that brings no new image reads the cached
index and writes nothing.

What it can join: two requests of one credential, one format and one system prompt that carry
the same image bytes. A compacted conversation and the one it compacted; but also two
conversations of one credential and prompt that carry the same screenshot, as two
conversations that open alike already are. Never a side call with a prompt of its own, never
two credentials (the key holds the credential) and never two tenants (each has its own index).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from multidict import MultiMapping

from ...policy.events import Linked
from ...policy.fold import EMPTY, SessionState
from ...policy.model import scoped_session
from ...policy.transitions import refresh, transition
from ..sessionlog.cached import CachedLog
from .sessions import INDEXES, credentials

#: How many sessions a credential's index is spread over (by a link's first hex digit).
SHARDS: Final = 16


def scope_of(tenant: str | None, headers: MultiMapping[str], query: MultiMapping[str] | None, shard: str) -> str:
    """The index session of ``tenant`` (without one, of the request's credential) holding links
    whose digest starts with ``shard``."""
    name = f"{INDEXES}.{shard}"
    return scoped_session(tenant, name) if tenant is not None else f"{name}@{credentials(headers, query)}"


def resolved(state: SessionState, keys: Sequence[str], derived: str) -> str:
    """The session of the first of ``keys`` that ``state`` links (``derived`` when none is)."""
    linked = state.linked
    if linked:
        for key in keys:
            found = linked.get(key)
            if found is not None:
                return found
    return derived


async def _state(log: CachedLog, scope: str) -> SessionState:
    state = log.fresh(scope)
    return state if state is not None else await refresh(log, scope, log.state(scope) or EMPTY)


async def continued(log: CachedLog, scope: str, keys: Sequence[str], derived: str) -> str:
    """The session a request of derived session ``derived`` whose images' keys are ``keys`` (in
    the body's order, all of one shard's ``scope``) continues, with the keys not linked yet
    linked to it. Keys of several shards go through ``session_of``."""
    state = await _state(log, scope)
    if all(key in state.linked for key in keys):
        return resolved(state, keys, derived)

    def missing(now: SessionState) -> list[Linked]:
        session = resolved(now, keys, derived)
        return [Linked(key, session) for key in keys if key not in now.linked]

    now, _, _ = await transition(log, scope, state, log.lock(scope), "linking a conversation", missing)
    return resolved(now, keys, derived)


async def session_of(log: CachedLog, tenant: str | None, headers: MultiMapping[str],
                     query: MultiMapping[str] | None, keys: Sequence[str], derived: str) -> str:
    """The session a request of derived session ``derived`` with images' keys ``keys`` belongs
    to: the one its first known image was linked to, else ``derived``; every key not
    known yet is linked to it. Every shard the keys fall in is read before any is written; the
    shard of the first key is written first, and when another request linked that key first
    (another replica, in the meantime), its session holds for the rest."""
    shards: dict[str, list[str]] = {}
    for key in keys:
        shards.setdefault(key[0], []).append(key)
    states = {shard: await _state(log, scope_of(tenant, headers, query, shard)) for shard in shards}
    session = derived
    for key in keys:
        found = states[key[0]].linked.get(key)
        if found is not None:
            session = found
            break
    for shard, own in shards.items():  # the first key's shard first: dicts keep their order
        if any(key not in states[shard].linked for key in own):
            got = await continued(log, scope_of(tenant, headers, query, shard), own, session)
            if own[0] == keys[0]:
                session = got
    return session
