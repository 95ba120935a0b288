"""An image the upstream refuses never bricks a session: quarantine it and send once more (proxy layer).

``Resend`` is the relay's ``Screen`` for a projected call with a session. When the upstream
refuses the call and its adapter reads the answer as an image rejection (``rejection``), the
policy decides which references it was (``policy.rejection``), records an ``attachment/rejected``
for this upstream's format, durably and once (``policy.projection.reject``), and the call is
built again from the log (the refused images now placeholders) and sent once more, before any
byte reached the client. Both calls are recorded. When nothing can be attributed, or recording
fails, the provider's own error goes back unchanged; a second refusal too.

What an upstream accepted before comes from the session's records (``Acceptances``, folded
incrementally per session and format). Records are written in batches: attribution first waits
for this session's queued records and for one batch window of the other replicas'
(``2 × [record] batch_wait``), so calls that finished before the refusal count.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from projectionist.adapters.base import WireFormat
from projectionist.adapters.registry import ADAPTERS
from projectionist.adapters.responses import documents
from projectionist.policy import rejection as attribution
from projectionist.policy.decide import names_of
from projectionist.policy.errors import ProjectionistError
from projectionist.policy.model import ImageRef
from projectionist.policy.ports import SessionLog
from projectionist.policy.profile import Rejection
from projectionist.policy.projection import reject
from projectionist.proxy.http.bodies import inflate
from projectionist.proxy.observe.logger import get_logger
from projectionist.proxy.upstream.prepare import Built, carried, foreign
from projectionist.proxy.upstream.recording import Recorder
from projectionist.proxy.upstream.relay import SCREEN_MAX, Observer

if TYPE_CHECKING:
    from projectionist.proxy.http.services import Services

#: Builds the call again from the log: the new body, and the recorder of the new call (if any).
Rebuild = Callable[[], Awaitable[tuple[bytes, Recorder | None]]]
#: The longest attribution waits for this session's records to be written.
SETTLE_MAX: Final = 2.0


def _format_of(adapter: str) -> str | None:
    found = ADAPTERS.get(adapter)
    return found.FORMAT if found is not None else None


class Acceptances:
    """What each upstream format accepted in each session, folded incrementally from the log
    (``policy.rejection.Acceptance``); at most ``size`` sessions kept, least recently used out."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._folds: OrderedDict[tuple[str, str], attribution.Acceptance] = OrderedDict()

    async def of(self, log: SessionLog, session_id: str, upstream_format: str) -> set[str]:
        key = (session_id, upstream_format)
        fold = self._folds.get(key)
        if fold is None:
            fold = self._folds[key] = attribution.Acceptance(upstream_format, _format_of)
        self._folds.move_to_end(key)
        while len(self._folds) > self.size:
            self._folds.popitem(last=False)
        fold.add(await log.read(session_id, fold.last_seq))
        return fold.accepted


def _decoded(body: bytes, encoding: str) -> bytes | None:
    """The answer's bytes without their content coding (gzip, deflate: ``bodies.inflate``, at
    most ``SCREEN_MAX`` of them); None for a coding not read here or a body that does not inflate."""
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    try:
        return inflate(body, coding, SCREEN_MAX)
    except ProjectionistError:
        return None


class Resend:
    """The one re-send of a call whose upstream refused an image (a relay ``Screen``)."""

    def __init__(self, services: Services, fmt: WireFormat, session_id: str, built: Built, refs: list[ImageRef],
                 recorder: Recorder | None, rebuild: Rebuild, fields: dict[str, object]) -> None:
        self.services = services
        self.fmt = fmt
        self.session_id = session_id
        self.built = built
        self.refs = refs
        self.recorder = recorder
        self.rebuild = rebuild
        self.fields = fields
        self.used = False

    def _read(self, status: int, content_type: str, encoding: str, body: bytes) -> Rejection | None:
        plain = _decoded(body, encoding)
        if plain is None:
            return None
        try:
            return self.fmt.rejection(status, documents(plain, content_type))
        except Exception as exc:  # an adapter's reading must never turn a provider's 400 into a 500
            get_logger().warning("rejection_unreadable", error=type(exc).__name__, adapter=self.fmt.NAME)
            return None

    async def __call__(self, status: int, content_type: str, body: bytes, encoding: str = "") -> bytes | None:
        if self.used:
            return None
        self.used = True
        found = self._read(status, content_type, encoding, body)
        if found is None:
            return None
        if found.site is None and foreign(self.fmt, self.built):
            # the client inlined images of its own: an unnamed refusal may be about one of those
            self._unattributed()
            return None
        services = self.services
        try:
            await services.recording.settle(self.session_id, SETTLE_MAX)
            await asyncio.sleep(2 * services.config.record.batch_wait)  # the other replicas' last batch
            accepted = await services.acceptances.of(services.log, self.session_id, self.fmt.FORMAT)
            ids = attribution.suspects(found, carried(self.built), accepted)
            if not ids:
                self._unattributed()
                return None
            wanted = attribution.quarantines(found, ids, self.fmt.FORMAT, names_of(self.refs))
            _, new = await reject(wanted, log=services.log, session_id=self.session_id,
                                  lock=services.log.lock(self.session_id), state=services.log.state(self.session_id))
        except asyncio.CancelledError:
            raise
        except ProjectionistError as error:
            services.metrics.rejections["failed"] += 1
            self.fields.update(rejection="failed")
            get_logger().warning("rejection_not_recorded", code=error.code, session=self.session_id)
            return None
        services.metrics.rejections["resent"] += 1
        services.metrics.quarantines["rejected"] += len(new)
        self.fields.update(rejection="resent", suspects=len(ids), rejected=len(new))
        await self._close_first(status, content_type, body)
        again, self.recorder = await self.rebuild()
        return again

    @property
    def observer(self) -> Observer | None:
        """The relay's observer of the call in flight: its recorder."""
        return self.recorder

    def _unattributed(self) -> None:
        self.services.metrics.rejections["unattributed"] += 1
        self.fields.update(rejection="unattributed")

    async def _close_first(self, status: int, content_type: str, body: bytes) -> None:
        """The refused call's record ends here: its whole answer, before the next call starts."""
        first = self.recorder
        if first is None:
            return
        first.begin(content_type)
        first.chunk(body)
        await first.body_complete(status)
        await first.finished(status)
