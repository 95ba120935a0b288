"""An image the upstream refuses never bricks a session: quarantine it and send once more (proxy layer).

``Resend`` is the relay's ``Screen`` for a projected call with a session. When the upstream
refuses the call and its adapter reads the answer as an image rejection (``rejection``), the
policy decides which references it was (``policy.rejection``), records an ``attachment/rejected``
for this upstream's format, durably and once (``policy.projection.reject``), and the call is
built again from the log (the refused images now placeholders) and sent once more, before any
byte reached the client. Both calls are recorded. When nothing can be attributed, or recording
fails, the provider's own error goes back unchanged; a second refusal too.

The images of a call are the ones the proxy inlined for references and the ones the client
inlined itself (``upstream.identity``: the sha256 of their bytes), alike: a refusal that names the
place is exact whatever the image's form. What an upstream accepted before comes from the
session's records (``Acceptances``, folded incrementally per session and format), and from the
calls of this process still in flight whose upstream already answered with a success
(``InFlight``). Records are written in batches: attribution first waits for this session's
queued records and for the other replicas' last batch of records of calls with images (``2 ×
[record] image_batch_wait``: such a record waits no longer for its batch), so calls that finished
before the refusal count. The bytes of a refused image the client inlined
are admitted into the store (best effort), so an operator can look at them and recover them. A
refusal that names the part of an image the provider fetched by URL ("...image.source.url: image
exceeds 5 MB maximum") is exact too: that URL is rejected for this format, by its URL's identity.

An answer that says the provider could not fetch an image it fetches by URL (``Rejection.failure``
``not_found`` or ``read_failed``) is about one of the call's URL images (``body.linked``), and
about its URL, not its bytes: the policy picks which (``policy.rejection.unreachable``), and an
``attachment/quarantine`` (``url``) records it for every upstream, at once, with no waiting for
records (that a URL was fetched before clears nothing: presigned links expire). The call is then
built again and sent once more, as for a rejection. No URL is ever logged, nor fetched here.

A refusal about the context of the images rather than one of them (Anthropic's many-image rule, a
smaller limit than the profile knows, a model that takes no images: ``Rejection.context``)
teaches a rule for this upstream and model (``upstream/learnt``), durably; the call is built
again under it (its images fitted, or placeholders for a model that takes none) and sent once
more. No image is quarantined for it, and the images stay images for every other target. A rule
that changes nothing in the call falls back to the images themselves.

A 400 in words no table knows, while the call carries images this format never accepted, is
settled by evidence (``policy.evidence``; the relay's calls only: a WebSocket's error goes back):
the call goes again without them, and only a success records anything, exactly what it proved;
a refusal again sends the provider's first answer back as it came. At most
``policy.evidence.MAX_CALLS`` extra calls, none of them recorded but the one the client gets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Final, Protocol

import msgspec

from ...adapters.base import WireFormat, about_something_else
from ...adapters.responses import documents
from ...policy import rejection as attribution
from ...policy.decide import names_of
from ...policy.errors import ProjectionistError
from ...policy.events import Quarantine, Rejected
from ...policy.failures import FAILURES
from ...policy.fold import SessionState
from ...policy.evidence import Evidence, Probe, Settle, Unproven
from ...policy.linked import url_name
from ...policy.model import ImageRef
from ...policy.profile import Rejection, under
from ...policy.projection import learn, reject
from ..inbound.bodies import inflate
from ..observe.logger import get_logger
from ..upstream.identity import decoded_bytes
from . import refusals
from .body import Built, carried, foreign, linked
from .record import Recorder
from .relay import SCREEN_MAX, Observer, Verdict

if TYPE_CHECKING:
    from ..inbound.services import Services

class Rebuild(Protocol):
    """Builds the call again from the log (or on ``state``, the session as it was): the new body,
    and the recorder of the new call (if any; none when not ``record``), with the rejections it
    ``assume``s projected as if recorded."""

    def __call__(self, *, assume: tuple[Rejected, ...] = (), record: bool = True,
                 state: SessionState | None = None) -> Awaitable[tuple[bytes, Recorder | None]]: ...
#: The longest attribution waits for this session's records to be written.
SETTLE_MAX: Final = 2.0
#: The longest the admission of a refused image's bytes may take (it never delays the re-send).
ADMIT_TIMEOUT: Final = 10.0


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
    """What becomes of a call whose upstream refused it (a relay ``Screen``): re-sent once with
    what the refusal taught recorded (an image rejected, a rule learnt), or settled by evidence
    (``probing``: the relay's calls only), or the provider's error as it came."""

    def __init__(self, services: Services, fmt: WireFormat, session_id: str, built: Built, refs: list[ImageRef],
                 recorder: Recorder | None, rebuild: Rebuild, fields: dict[str, object],
                 tenant: str | None = None, *, upstream: str = "", model: str | None = None,
                 probing: bool = False, scope: str = "") -> None:
        self.services = services
        #: The tenant's refusals session, where an exact refusal is shared ("": none).
        self.scope = scope
        #: The client's tenant: the refused bytes it inlined are admitted for it.
        self.tenant = tenant
        self.fmt = fmt
        self.session_id = session_id
        self.built = built
        self.refs = refs
        self.recorder = recorder
        self.rebuild = rebuild
        self.fields = fields
        #: What the call goes to: the rules a refusal teaches are about them.
        self.upstream, self.model = upstream, model
        self.probing = probing
        self.used = False
        #: A refusal in unknown words being settled: its plan, the body of the call in flight and
        #: the digest of the refusal.
        self.evidence: Evidence | None = None
        self.trying: bytes = b""
        self.refusal = ""
        self.names: dict[str, str | None] = {}

    def _read(self, status: int, content_type: str, encoding: str, body: bytes) -> Rejection | None:
        plain = _decoded(body, encoding)
        if plain is None:
            return None
        try:
            return self.fmt.rejection(status, documents(plain, content_type))
        except Exception as exc:  # an adapter's reading must never turn a provider's 400 into a 500
            get_logger().warning("rejection_unreadable", error=type(exc).__name__, adapter=self.fmt.NAME)
            return None

    def _about_something_else(self, content_type: str, body: bytes, encoding: str) -> bool:
        """Whether the refusal says a cause that is no image (the context window, ...): it goes back."""
        plain = _decoded(body, encoding)
        return plain is None or about_something_else(documents(plain, content_type))

    async def __call__(self, status: int, content_type: str, body: bytes, encoding: str = "") -> bytes | None:
        if self.used:
            return None
        self.used = True
        found = self._read(status, content_type, encoding, body)
        if found is None:
            if self.probing and status == 400 and not self._about_something_else(content_type, body, encoding):
                return await self._unknown(status, content_type, body, encoding)
            return None
        if FAILURES[found.failure].fetched:  # the provider could not fetch a URL image
            return await self._unfetched(found, status, content_type, body)
        if found.context is not None:
            again = await self._learn(found, status, content_type, body)
            if again is not None:
                return again
        return await self._rejected(found, status, content_type, body)

    async def answered(self, status: int) -> Verdict | bytes:
        """The relay's call with a body this screen gave got ``status``: the client gets it, or
        (settling a refusal in unknown words) the next body goes, or the first refusal."""
        evidence = self.evidence
        if evidence is None:
            return Verdict.KEEP
        step = evidence.answered(200 <= status < 300)
        if isinstance(step, Probe):
            return await self._without(step.out)
        self.evidence = None
        self.fields.update(evidence_calls=evidence.calls)
        if isinstance(step, Unproven):
            self.services.metrics.rejections["unproven"] += 1
            self.fields.update(rejection="unproven", suspects=len(evidence.suspects))
            return Verdict.FIRST
        return await self._settle(step, len(evidence.suspects))

    async def _suspects(self, found: Rejection | None) -> tuple[list[str], dict[str, str | None]]:
        """The images a refusal may be about (``found``: a named site narrows it), in document
        order, leaving out those this upstream format accepted before; and their display names.
        Records are written in batches: this first waits for this session's queued records and
        for one batch window of the other replicas'."""
        services = self.services
        await services.recording.settle(self.session_id, SETTLE_MAX)
        await asyncio.sleep(2 * services.recording.image_wait)  # the other replicas' last batch
        accepted = await services.acceptances.of(services.log, self.session_id, self.fmt.FORMAT)
        accepted = accepted | services.inflight.accepting(self.session_id, self.fmt.FORMAT)
        images = carried(self.built)
        names = names_of(self.refs)
        if found is None or found.site is not None:  # a URL image's content may be what was refused
            urls = linked(self.built)
            images += [(path, aid) for path, aid, _ in urls]
            names.update((aid, url_name(url)) for _, aid, url in urls)
        return list(attribution.suspects(found or Rejection(""), images, accepted)), names

    async def _rejected(self, found: Rejection, status: int, content_type: str, body: bytes) -> bytes | None:
        """A refusal of images: the one it names, or the ones this format never accepted."""
        if found.site is None and foreign(self.fmt, self.built):
            # images without an identity (URLs the provider fetches, provider files, bytes that are
            # not base64): an unnamed refusal may be about one of those
            self._unattributed()
            return None
        services = self.services
        try:
            ids, names = await self._suspects(found)
            if not ids:
                self._unattributed()
                return None
            wanted = attribution.quarantines(found, ids, self.fmt.FORMAT, names, self.built.forms)
            new = await self._reject(wanted)
        except asyncio.CancelledError:
            raise
        except ProjectionistError as error:
            self._not_recorded(error)
            return None
        await self._share(new)
        services.metrics.rejections["resent"] += 1
        services.metrics.quarantines["rejected"] += len(new)
        self.fields.update(rejection="resent", suspects=len(ids), rejected=len(new))
        self._admit({q.attachment_id for q in new})
        await self._close_first(status, content_type, body)
        again, self.recorder = await self.rebuild()
        return again

    async def _learn(self, found: Rejection, status: int, content_type: str, body: bytes) -> bytes | None:
        """A refusal about the context of the images (or a limit of the target): the rule is
        learnt for this upstream and model and the call built again under it. None when the rule
        says nothing to act on, or changes nothing in this call (the images themselves, then)."""
        rule = attribution.learnt(found, self.upstream, self.model, self.built.total)
        if rule is None or (rule.rule != "no_images" and under(self.fmt.PROFILE, (rule,)) == self.fmt.PROFILE):
            return None  # nothing to act on, or no stricter than what the format's profile says already
        services = self.services
        try:
            await learn(rule, log=services.log, session_id=self.session_id, lock=services.log.lock(self.session_id),
                        state=services.log.state(self.session_id))
        except asyncio.CancelledError:
            raise
        except ProjectionistError as error:
            self._not_recorded(error)
            return None
        again, recorder = await self.rebuild()
        if again == self.built.body:  # nothing here is fitted or replaced by it
            if recorder is not None:
                recorder.discard()
            return None
        services.metrics.rejections["learnt"] += 1
        self.fields.update(rejection="learnt", rule=rule.rule)
        await self._close_first(status, content_type, body)
        self.recorder = recorder
        return again

    async def _unknown(self, status: int, content_type: str, body: bytes, encoding: str) -> bytes | None:
        """A 400 in words no table knows, while the call carries images this format never
        accepted: the call goes again without them (``policy.evidence``), and only a success
        records anything."""
        try:
            ids, self.names = await self._suspects(None)
        except ProjectionistError:
            return None
        if not ids:
            return None
        plain = _decoded(body, encoding) or body
        self.refusal = attribution.message_digest(plain[:SCREEN_MAX].decode("utf-8", "replace"))
        self.evidence = Evidence(ids)
        await self._close_first(status, content_type, body)
        self.recorder = None
        return await self._without(self.evidence.first().out)

    async def _without(self, out: tuple[str, ...]) -> bytes:
        """The call built with the images ``out`` as their placeholders (assumed, not recorded)."""
        assumed = attribution.quarantines(Rejection(""), out, self.fmt.FORMAT, self.names, self.built.forms)
        # on the session as it was when the call was refused: what another call records meanwhile
        # must not leave more out of one probe than of the next
        state = self.built.projection.state if self.built.projection is not None else None
        self.trying, _ = await self.rebuild(assume=assumed, record=False, state=state)
        self.services.metrics.evidence_calls += 1
        return self.trying

    async def _settle(self, step: Settle, suspects: int) -> Verdict | bytes:
        """Evidence proved leaving ``step.out`` out makes the call succeed: record it, then keep the
        answer of the call that proved it (or send that call once more)."""
        services = self.services
        wanted = tuple(msgspec.structs.replace(q, message_digest=self.refusal) for q in attribution.quarantines(
            Rejection(""), step.out, self.fmt.FORMAT, self.names, self.built.forms))
        try:
            new = await self._reject(wanted)
        except asyncio.CancelledError:
            raise
        except ProjectionistError as error:
            self._not_recorded(error)
            return Verdict.FIRST if step.again else Verdict.KEEP
        services.metrics.rejections["proven"] += 1
        services.metrics.quarantines["rejected"] += len(new)
        self.fields.update(rejection="proven", suspects=suspects, rejected=len(new))
        self._admit({q.attachment_id for q in new})
        again, self.recorder = await self.rebuild()
        if not step.again and again == self.trying:
            return Verdict.KEEP
        return again

    async def _reject(self, wanted: tuple[Quarantine | Rejected, ...]) -> tuple[Quarantine | Rejected, ...]:
        """Record ``wanted`` in the session's log, durably and once (``policy.projection.reject``):
        what this call appended."""
        log = self.services.log
        _, new = await reject(wanted, log=log, session_id=self.session_id, lock=log.lock(self.session_id),
                              state=log.state(self.session_id))
        return new

    async def _share(self, new: tuple[Quarantine | Rejected, ...]) -> None:
        """An exact refusal of bytes, for every session of this tenant (``refusals.share``); best
        effort: this session's own record stands whatever becomes of it."""
        exact = [q for q in new if isinstance(q, Rejected)]
        if not exact or not self.scope:
            return
        try:
            shared = await refusals.share(self.services.log, self.scope, exact,
                                          reprobe_after=self.services.config.policy.refusal_reprobe_after)
        except ProjectionistError as error:
            get_logger().warning("refusal_not_shared", code=error.code, session=self.session_id)
            return
        if shared:
            self.fields["shared"] = shared

    def _not_recorded(self, error: ProjectionistError) -> None:
        self.services.metrics.rejections["failed"] += 1
        self.fields.update(rejection="failed")
        get_logger().warning("rejection_not_recorded", code=error.code, session=self.session_id)

    async def _unfetched(self, found: Rejection, status: int, content_type: str, body: bytes) -> bytes | None:
        """An answer that could not fetch one of the call's URL images: record it for the URLs it
        is about (``attachment/quarantine``, ``url``) and build the call again, or, with none to
        put it down to or when recording fails, let the provider's answer go back."""
        services = self.services
        urls = linked(self.built)
        ids = attribution.unreachable(found, urls)
        if not ids:
            services.metrics.unfetched["unattributed"] += 1
            self.fields.update(unfetched="unattributed")
            return None
        names = {aid: url_name(url) for _, aid, url in urls}
        try:
            new = await self._reject(attribution.unfetched(found, ids, names))
        except asyncio.CancelledError:
            raise
        except ProjectionistError as error:
            services.metrics.unfetched["failed"] += 1
            self.fields.update(unfetched="failed")
            get_logger().warning("unfetched_not_recorded", code=error.code, session=self.session_id)
            return None
        services.metrics.unfetched["resent"] += 1
        services.metrics.quarantines.update(q.failure for q in new)
        self.fields.update(unfetched="resent", url_suspects=len(ids), unfetched_recorded=len(new))
        await self._close_first(status, content_type, body)
        again, self.recorder = await self.rebuild()
        return again

    @property
    def observer(self) -> Observer | None:
        """The relay's observer of the call in flight: its recorder."""
        return self.recorder

    def _admit(self, ids: set[str]) -> None:
        """Admit the bytes of the refused images the client inlined itself (each once), in the
        background: the inspector shows them and a recovery can verify them. A failure (bytes
        that are no image, a full or hung store) only means the store holds nothing for them."""
        lookup = self.built.payload
        if lookup is None:
            return
        for aid in sorted(ids & set(self.built.client)):
            payload = lookup(aid)
            data = decoded_bytes(payload) if payload is not None else None
            if data is not None:
                self.services.background(self._admit_one(aid, data))

    async def _admit_one(self, aid: str, data: bytes) -> None:
        try:
            async with asyncio.timeout(ADMIT_TIMEOUT):
                await self.services.visible.admit(self.tenant, data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            get_logger().info("refused_image_not_admitted", attachment=aid[:15], error=getattr(exc, "code", type(exc).__name__))

    def _unattributed(self) -> None:
        self.services.metrics.rejections["unattributed"] += 1
        self.fields.update(rejection="unattributed")

    async def _close_first(self, status: int, content_type: str, body: bytes) -> None:
        """The refused call's record ends here: its whole answer, before the next call starts."""
        first = self.recorder
        if first is None:
            return
        first.whole(content_type, body, status)
        first.finished(status)
