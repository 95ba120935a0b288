"""An image the upstream refuses never bricks a session: quarantine it and send once more (proxy layer).

``Resend`` is the relay's ``Screen`` for a projected call with a session. When the upstream
refuses the call and its adapter reads the answer as an image rejection (``rejection``), the
policy decides which references it was (``policy.rejection``), records a ``rejected`` quarantine
for this upstream's format, durably and once (``policy.projection.reject``), and the call is
built again from the log (the refused images now placeholders) and sent once more, before any
byte reached the client. Both calls are recorded. When nothing can be attributed, or recording
the quarantine fails, the provider's own error goes back unchanged; a second refusal too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from projectionist.adapters.base import WireFormat
from projectionist.adapters.registry import ADAPTERS
from projectionist.adapters.responses import documents
from projectionist.policy import rejection as attribution
from projectionist.policy.decide import names_of
from projectionist.policy.errors import ProjectionistError
from projectionist.policy.model import ImageRef
from projectionist.policy.projection import reject
from projectionist.proxy.http.services import Services
from projectionist.proxy.observe.logger import get_logger
from projectionist.proxy.upstream.prepare import Built, carried
from projectionist.proxy.upstream.recording import Recorder
from projectionist.proxy.upstream.relay import Observer

#: Builds the call again from the log: the new body, and the recorder of the new call (if any).
Rebuild = Callable[[], Awaitable[tuple[bytes, Recorder | None]]]


def _format_of(adapter: str) -> str | None:
    found = ADAPTERS.get(adapter)
    return found.FORMAT if found is not None else None


class Resend:
    """The one re-send of a call whose upstream refused an image (a relay ``Screen``)."""

    def __init__(self, services: Services, fmt: WireFormat, session_id: str, built: Built, refs: list[ImageRef],
                 recorder: Recorder | None, rebuild: Rebuild, fields: dict[str, object]) -> None:
        self.services = services
        self.fmt = fmt
        self.session_id = session_id
        self.built = built
        self.refs = refs
        self.observer: Observer | None = recorder
        self.recorder = recorder
        self.rebuild = rebuild
        self.fields = fields
        self.used = False

    async def __call__(self, status: int, content_type: str, body: bytes) -> bytes | None:
        if self.used:
            return None
        self.used = True
        found = self.fmt.rejection(status, documents(body, content_type))
        if found is None:
            return None
        metrics = self.services.metrics
        images = carried(self.built)
        try:
            await self.services.recording.drain()  # this replica's records of earlier calls, in the log
            events = await self.services.log.read(self.session_id)
            accepted = attribution.accepted(events, self.fmt.FORMAT, _format_of)
            ids = attribution.suspects(found, images, accepted)
            if not ids:
                metrics.rejections["unattributed"] += 1
                self.fields.update(rejection="unattributed")
                return None
            wanted = attribution.quarantines(found, ids, self.fmt.FORMAT, names_of(self.refs))
            _, new = await reject(wanted, log=self.services.log, session_id=self.session_id,
                                      lock=self.services.log.lock(self.session_id),
                                      state=self.services.log.state(self.session_id))
        except asyncio.CancelledError:
            raise
        except ProjectionistError as error:
            metrics.rejections["failed"] += 1
            self.fields.update(rejection="failed")
            get_logger().warning("rejection_not_recorded", code=error.code, session=self.session_id)
            return None
        metrics.rejections["resent"] += 1
        metrics.quarantines["rejected"] += len(new)
        self.fields.update(rejection="resent", suspects=len(ids), rejected=len(new))
        await self._close_first(status, content_type, body)
        again, recorder = await self.rebuild()
        self.observer = recorder
        self.recorder = recorder
        return again

    async def _close_first(self, status: int, content_type: str, body: bytes) -> None:
        """The refused call's record ends here: its whole answer, before the next call starts."""
        first = self.recorder
        if first is None:
            return
        first.begin(content_type)
        first.chunk(body)
        await first.body_complete(status)
        await first.finished(status)
