"""A session nobody named stays one session through its client's compaction (proxy layer, call
sublayer).

A derived session (``sessions.derived``) is named by the conversation's opening, which a
compaction rewrites: Gemini CLI and Qwen Code make their summary the first message; Gemini CLI
keeps the latest turns as they were, Qwen Code 0.24 attaches the latest images anew to the last
message. What such a request still shares with its conversation is its images. So there is a
conversations index: for every image a client inlined, keyed by its identity with the system
prompt it was sent under, the format and the credential (``sessions.image_keys``), the session of
the first call that sent it and was answered. A request whose session is derived is the session
of its first image the index knows (the derived one when it knows none): ``resolve``, before its
call, reads only what this process has not seen of the index, and nothing when it knows every
image of the request. Its images the index does not know yet are linked to that session once
its call was answered 2xx (``link``, off the request): a call that failed (a made-up key's 401)
links nothing, and a log that cannot take a write delays no call.

The index is sessions of the log like the tenant's refusals (``~conversations.<hex digit>``:
``SHARDS`` by the key's first digit; behind the tenant's name when client tokens name tenants,
shared by the tenant's credentials, else ``@`` and a digest of the credential). Every replica,
and a restart, reads the same links and decides alike; the first link of a key holds (in log
order), and a link is appended conditionally on what its writer read, so two writers of one key
make one link. Links are ``conversation/linked`` events, which no session's fold holds: this
module reads them whole, so no checkpoint, not even an older replica's that knows no links,
can drop one. A shard holds at most ``SHARD_LINKS`` links (later images are not linked), and a
process keeps ``KEPT_SHARDS`` shards in memory (an evicted one is read again when needed).

What it can join: two requests of one credential (one tenant, with client tokens), one format
and one system prompt that carry the same image bytes. A compacted conversation and the one it
compacted; but also two conversations that carry the same screenshot, as two conversations that
open alike already are, and transitively (a third that shares the second's other image). Never
a side call with a prompt of its own, never two credentials without tenants, never two tenants.
Two first calls that send the same new images at the same moment each keep their own session;
whichever is answered first links them.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from multidict import MultiMapping

from ...policy.errors import AppendConflict
from ...policy.events import Event, Linked, LinkedEvent
from ...policy.model import TENANT_MARK, scoped_session
from ...policy.transitions import MAX_ROUNDS
from ..observe.logger import get_logger
from ..sessionlog.cached import CachedLog
from .sessions import INDEXES, credentials

#: How many sessions an index is spread over (by a key's first hex digit).
SHARDS: Final = 16
#: Links one shard holds at most: an index stays below 16 × this many (about 175 bytes each in
#: the log, about 200 in each replica's memory while the shard is kept).
SHARD_LINKS: Final = 4096
#: Shards one process keeps in memory (the most recently used): about 50 MB at the very most.
KEPT_SHARDS: Final = 64
#: Seconds a request waits for the index before its call (then it keeps its derived session), and
#: a link of an answered call may take.
TIMEOUT: Final = 1.0
#: Links under way at once in one process; more answered calls link nothing (a later one will).
LINKING: Final = 64


def scopes_of(tenant: str | None, headers: MultiMapping[str], query: MultiMapping[str] | None,
              keys: Sequence[str]) -> dict[str, str]:
    """The index session of each shard ``keys`` fall in (by their first hex digit), in the order
    of their first key: ``tenant``'s, or without one the request credential's."""
    owner = f"@{credentials(headers, query)}" if tenant is None else ""
    return {digit: scoped_session(tenant, f"{INDEXES}.{digit}{owner}") for digit in dict.fromkeys(key[0] for key in keys)}


def linked_session(index: str, session: str) -> str:
    """The session, as the log holds it, that a link in index session ``index`` names (a link
    keeps it as its request found it, before the tenant scoped it)."""
    tenant, mark, rest = index.partition(TENANT_MARK)
    return scoped_session(tenant, session) if mark and tenant and rest.startswith(INDEXES) else session


class _Shard:
    """What this process read of one index session: its links, up to ``last_seq``."""

    __slots__ = ("last_seq", "links")

    def __init__(self) -> None:
        self.last_seq = 0
        self.links: dict[str, str] = {}

    def learn(self, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, LinkedEvent):
                self.links.setdefault(event.data.key, event.data.session)  # the first link holds
            if event.seq > self.last_seq:
                self.last_seq = event.seq


class Index:
    """One log's conversations index, as this process has read it."""

    def __init__(self, log: CachedLog) -> None:
        self.log = log
        self._shards: OrderedDict[str, _Shard] = OrderedDict()
        self.linking = 0

    def _shard(self, scope: str) -> _Shard:
        shard = self._shards.get(scope)
        if shard is None:
            shard = self._shards[scope] = _Shard()
            while len(self._shards) > KEPT_SHARDS:
                self._shards.popitem(last=False)
        else:
            self._shards.move_to_end(scope)
        return shard

    async def _read(self, scope: str, shard: _Shard) -> None:
        """What the log holds of ``scope`` beyond ``shard``."""
        shard.learn(await self.log.read(scope, shard.last_seq))

    async def resolve(self, scopes: dict[str, str], keys: Sequence[str], derived: str) -> tuple[str, tuple[str, ...]]:
        """The session of the first of ``keys`` the index links (``derived`` when none), and the
        keys it does not link yet. A shard is read only for keys this process has not seen linked."""
        shards = {digit: self._shard(scope) for digit, scope in scopes.items()}
        for digit, scope in scopes.items():
            shard = shards[digit]
            if any(key[0] == digit and key not in shard.links for key in keys):
                await self._read(scope, shard)
        session = next((found for key in keys if (found := shards[key[0]].links.get(key)) is not None), derived)
        return session, tuple(key for key in keys if key not in shards[key[0]].links)

    async def link(self, scopes: dict[str, str], keys: Sequence[str], session: str) -> int:
        """Link the ones of ``keys`` still unlinked to ``session``, each shard under its lock (a
        shard another call is linking now is left: a later call links what is left), conditionally
        on what was read of it; how many links this appended."""
        appended = 0
        for digit, scope in scopes.items():
            lock = self.log.lock(scope)
            if lock.locked():
                continue
            own = [key for key in keys if key[0] == digit]
            async with lock:
                shard = self._shard(scope)
                for _ in range(MAX_ROUNDS):
                    await self._read(scope, shard)
                    missing = [key for key in own if key not in shard.links]
                    room = SHARD_LINKS - len(shard.links)
                    if not missing or room <= 0:
                        break
                    try:
                        events = await self.log.append(scope, shard.last_seq,
                                                       [Linked(key, session) for key in missing[:room]])
                    except AppendConflict:
                        continue  # another writer's link came first: read it, and link what is left
                    shard.learn(events)
                    appended += len(events)
                    break
        return appended


_INDEXES: weakref.WeakKeyDictionary[CachedLog, Index] = weakref.WeakKeyDictionary()


def index_of(log: CachedLog) -> Index:
    """``log``'s conversations index (one per log and process)."""
    found = _INDEXES.get(log)
    if found is None:
        found = _INDEXES[log] = Index(log)
    return found


async def link_later(log: CachedLog, scopes: dict[str, str], keys: Sequence[str], session: str) -> None:
    """``Index.link`` off a call that was answered, bounded by ``TIMEOUT`` and ``LINKING``; what
    fails or runs out of time is left for a later call (links are an aid, never a call's answer)."""
    index = index_of(log)
    if index.linking >= LINKING:
        return
    index.linking += 1
    try:
        await asyncio.wait_for(index.link(scopes, keys, session), TIMEOUT)
    except Exception as error:  # the log down, out of time: a later call links
        get_logger().info("conversation_link_skipped", reason=getattr(error, "code", type(error).__name__))
    finally:
        index.linking -= 1
