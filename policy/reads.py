"""How a projection reads the store: one verified read, with exactly one immediate retry of a
READ_FAILED; a probe of a retryable quarantine; a request's reads, a bounded number at once
(policy layer, pure: the store is the ``AttachmentStore`` port). Cancellation propagates;
an unclassified error is an ``InternalError``, never a read failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .errors import READ_FAILED, AttachmentError, InternalError, ProjectionistError, Unavailable
from .failures import retried
from .model import StoredImage
from .ports import AttachmentStore


async def read_once(store: AttachmentStore, attachment_id: str) -> StoredImage | AttachmentError:
    """One verified read: the image, or the store's ``AttachmentError`` as a value; any other
    projectionist error and cancellation propagate, an unclassified one is an ``InternalError``."""
    try:
        return await store.read_image(attachment_id)
    except AttachmentError as exc:
        return exc
    except ProjectionistError:
        raise
    except Exception as exc:  # unclassified: never a quarantine, always a clear failure
        raise InternalError(f"unclassified error reading {attachment_id[:15]}: {type(exc).__name__}") from exc


async def _read(store: AttachmentStore, attachment_id: str) -> tuple[StoredImage | AttachmentError, int]:
    """One verified read; a retryable failure (READ_FAILED) gets exactly one immediate retry.
    Cancellation propagates."""
    result = await read_once(store, attachment_id)
    if isinstance(result, AttachmentError) and retried(result.code):
        return await read_once(store, attachment_id), 2
    return result, 1


async def _probe(store: AttachmentStore, attachment_id: str, wait: float) -> tuple[StoredImage | AttachmentError, int]:
    """A probe of a retryable quarantine: one read, no retry, waited for at most ``wait``. Any
    failure (unreadable, a full store, still reading when the wait ends) is a failed probe: the
    request keeps the placeholder; a read still going on stays shared with whoever wants it next."""
    try:
        async with asyncio.timeout(wait):
            return await store.read_image(attachment_id), 1
    except AttachmentError as error:
        return error, 1
    except (TimeoutError, Unavailable):
        return AttachmentError(READ_FAILED, "the probe read did not verify in time", attachment_id=attachment_id), 1


async def read_many(
    store: AttachmentStore, ids: Sequence[str], parallel: int,
    probes: frozenset[str] = frozenset(), probe_wait: float = 2.0,
) -> dict[str, tuple[StoredImage | AttachmentError, int]]:
    """Read ``ids`` with at most ``parallel`` reads of this request in flight at once (the ids in
    ``probes`` by ``_probe``)."""
    async def one(aid: str) -> tuple[StoredImage | AttachmentError, int]:
        return await (_probe(store, aid, probe_wait) if aid in probes else _read(store, aid))

    if len(ids) <= 1:
        return {aid: await one(aid) for aid in ids}
    results: dict[str, tuple[StoredImage | AttachmentError, int]] = {}
    queue = iter(ids)

    async def worker() -> None:
        for aid in queue:
            results[aid] = await one(aid)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(parallel, len(ids))):
                group.create_task(worker())
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return {aid: results[aid] for aid in ids}

