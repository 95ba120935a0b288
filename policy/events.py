"""Durable session-log events: frozen msgspec Structs in one tagged union (policy layer, pure).

The envelope is ``{type, seq, time, data}``; ``type`` is the union tag. Each event is a whole
value, never a delta, so any persisted prefix of a log is meaningful on its own. New fields get
defaults (msgspec schema evolution); an event type this version does not know decodes to
``UnknownEvent`` and is ignored by the fold, so an older replica can read a newer log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

import msgspec

from .failures import FAILURES, Failure, of

QUARANTINE: Final = "attachment/quarantine"
RECOVERED: Final = "attachment/recovered"
FORKED: Final = "session/forked"
REQUEST: Final = "request/recorded"
RESPONSE: Final = "response/recorded"
CHECKPOINT: Final = "session/checkpoint"
VARIANT: Final = "attachment/variant"
REJECTED: Final = "attachment/rejected"
LEARNT: Final = "upstream/learnt"
LINKED: Final = "conversation/linked"


class Quarantine(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """An image the store could not give: it holds for every upstream. With ``url``, an image the
    provider fetches by URL that a provider could not fetch (``not_found`` or ``read_failed``, as
    its answer said): its id is the URL's (``policy.linked.url_id``), no store holds it and no
    probe reads it; ``suspects`` is how many URL images that answer was put down to. With
    ``inline``, bytes a client inlined that decode as no image (``corrupt``, found before any
    upstream saw them): they are no image wherever they come from, so it holds for a reference
    to them too.

    ``failure`` is a row of the failure table (``failures.StoreFailure`` when this version wrote
    it), decoded as a plain string: a kind a newer version wrote is kept as written and read as
    ``unavailable`` (``kind``), never as a corrupt log."""

    attachment_id: str
    failure: str
    retryable: bool
    name: str | None = None
    url: bool = False
    suspects: int = 0
    inline: bool = False

    @property
    def kind(self) -> Failure:
        """``failure`` as this version reads it: itself, or ``unavailable`` for a kind it does not know."""
        return of(self.failure).name

    @property
    def probed(self) -> bool:
        """Whether a due probe reads the image again: its kind is probed, the event says it is
        retryable, and it is no URL image (the provider fetches that, never the proxy)."""
        return self.retryable and of(self.failure).probed and not self.url


class Rejected(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """An image an upstream refused: it holds only for upstreams of that ``format``; ``suspects``
    is how many images the refusal was put down to, ``message_digest`` the sha256 of the
    provider's message. An event type of its own (not a quarantine ``failure``), so a replica
    of an older version, which cannot know it, skips it rather than finding the log corrupt.
    ``form`` is how the refused image was spelled when that was not its canonical form
    (``labelled image/jpeg``, ``non-canonical base64``): the refusal then holds for that form
    only, never for the same bytes sent as they are ("": for every form)."""

    attachment_id: str
    format: str
    suspects: int
    message_digest: str
    name: str | None = None
    form: str = ""

    @property
    def failure(self) -> Literal["rejected"]:
        return "rejected"

    @property
    def kind(self) -> Literal["rejected"]:
        return "rejected"

    @property
    def retryable(self) -> bool:
        return FAILURES["rejected"].retryable


class Recovered(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A lifted quarantine, with what the verified read found; ``automatic`` when a retryable
    quarantine was lifted by a probe rather than by an operator."""

    attachment_id: str
    bytes: int
    media_type: str
    width: int
    height: int
    automatic: bool = False


class Variant(msgspec.Struct, frozen=True, gc=False):
    """The variant of an image this session sends to upstreams of one ``target`` (a profile and
    its side limit, ``anthropic@2000``): which stored object, what it is, and the ``recipe`` that
    made it. Pinned in the log, so a restart, a fork or a replay sends the same bytes whatever the
    image library would make today."""

    attachment_id: str
    target: str
    variant_id: str
    media_type: str
    bytes: int
    width: int
    height: int
    recipe: str


class Learnt(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A rule about the requests of one ``upstream`` (its configured name) and ``model`` ("" when
    the request named none) that a refusal taught: about the context of the images or a limit of
    that target, never about one image's bytes. ``many_images``: from ``images`` images in one
    request on, no side over ``side`` pixels; ``image_side``: no side over ``side``;
    ``image_bytes``: no image over ``bytes`` bytes (decoded); ``no_images``: the model takes no
    images. Images are fitted to it (or, for ``no_images``, replaced) there only: they stay as
    they are for every other upstream and model. ``rule`` is a plain string, so a rule a newer
    version learnt is skipped by an older one, never read as a corrupt log."""

    upstream: str
    model: str
    rule: str
    images: int = 0
    side: int = 0
    bytes: int = 0
    message_digest: str = ""


class Linked(msgspec.Struct, frozen=True, gc=False):
    """An image a conversation sent, and the session of the first request that sent it: an entry
    of a credential's conversations index (``proxy.call.conversations``), never of a client's
    session. ``key`` is a digest of the image's identity with the system prompt it was sent
    under, its format and credential, ``session`` the session id as its request found it, before
    the tenant scoped it. The first link of a key holds: a later one is never written."""

    key: str
    session: str


class Forked(msgspec.Struct, frozen=True, gc=False):
    parent: str
    at_seq: int


class Held(msgspec.Struct, frozen=True, gc=False):
    """One standing quarantine of a checkpoint, with the time of the event behind it."""

    quarantine: Quarantine
    since: str


class Checkpoint(msgspec.Struct, frozen=True, gc=False):
    """The whole folded state at this event's seq: the standing quarantines in fold order.

    Derived, never a decision: the fold takes it as the state (so a cold fold can start at the
    latest one), it is appended conditionally on the state it summarises (``state_seq``; only
    records or other checkpoints may lie between), and it never makes anyone's conditional
    append conflict (``PASSIVE_TYPES``). Replay and an older version simply skip it.
    """

    state_seq: int
    quarantined: tuple[Held, ...] = ()
    variants: tuple[Variant, ...] = ()
    rejected: tuple[Rejected, ...] = ()
    learnt: tuple[Learnt, ...] = ()


class RefRecord(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """What one image of a recorded request became: a reference ``inlined`` (as the stored
    ``variant`` when one was sent instead of the original) or ``placeholder``; an image the client
    inlined itself (``attachment_id``: the sha256 of its bytes) ``client``, sent as it came, or
    ``placeholder`` (``failure``: ``rejected``)."""

    path: str
    attachment_id: str
    outcome: str
    failure: str | None = None
    variant: str | None = None


class ResponseRecorded(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """The outcome of one proxied call (whole-value: it names its request by id and seq, or by id
    alone with ``request_seq = 0`` when both records were written in one append, the request first,
    or when it is carried in its request's own record)."""

    request_id: str
    request_seq: int
    status: int | None
    latency_ms: float
    usage: dict[str, object] | None = None
    error_code: str | None = None
    response_blob: str | None = None
    response_truncated: bool = False


class RequestRecorded(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """The request part of one proxied call, appended before the upstream call.

    ``log_seq`` is the last seq of the log state the projection used (replay folds up to it);
    ``shape`` holds short digests of the projected body with images reduced to their ids, per
    top-level member and per item of top-level lists, so a reconstruction that no longer matches
    can name the first differing path; a call sent unchanged (no references, the projected digest
    is the inbound one) records none, as its upstream body is the inbound body a replay holds.
    ``inbound_blob`` is set in ``full`` recording mode.
    ``public_urls`` are the proxy's public URLs when some reference of the call was an HTTP URL
    under one of them (replay recognises exactly those, whatever the configuration says since).
    ``response`` is the call's outcome when the writer had it by the time it wrote the request:
    one row per call, the common case; otherwise a ``response/recorded`` event follows
    (``answer`` reads either).
    """

    request_id: str
    route: str
    adapter: str
    upstream: str
    method: str
    path: str
    log_seq: int
    inbound_digest: str
    projected_digest: str
    refs: tuple[RefRecord, ...] = ()
    shape: tuple[tuple[str, str], ...] = ()
    inbound_blob: str | None = None
    public_urls: tuple[str, ...] = ()
    response: ResponseRecorded | None = None
    #: The headers the call went upstream with, in order, credentials left out (replay sends them).
    headers: tuple[tuple[str, str], ...] = ()


#: What the calls of one ``CallRecords`` share, written once: route, adapter, upstream, method,
#: path, headers and public URLs, as in their ``RequestRecorded``.
Common = tuple[str, str, str, str, str, tuple[tuple[str, str], ...], tuple[str, ...]]
#: One call of a ``CallRecords``: the index of its ``Common``, then request id, log seq, inbound
#: digest, projected digest ("" when it is the inbound one), refs, shape, and its outcome: status,
#: latency (ms), usage, error code, whether the body was truncated.
CallRow = tuple[int, str, int, str, str, tuple[RefRecord, ...], tuple[tuple[str, str], ...], int | None, float,
                dict[str, object] | None, str | None, bool]


class CallRecords(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The ``request/recorded`` events of whole calls of one session, in order, each with its
    outcome in it and no blob (``metadata`` recording): what they repeat (``common``) written
    once, so a row of them is a third of their size as events. ``records`` gives the events'
    data back, equal to what each call's own ``RequestRecorded`` would be."""

    common: tuple[Common, ...]
    calls: list[CallRow]

    def records(self) -> list[RequestRecorded]:
        common = self.common
        out: list[RequestRecorded] = []
        for (at, request_id, log_seq, inbound, projected, refs, shape, status, latency, usage, error_code,
             truncated) in self.calls:
            route, adapter, upstream, method, path, headers, public_urls = common[at]
            response = ResponseRecorded(request_id, 0, status, latency, usage, error_code, None, truncated)
            out.append(RequestRecorded(request_id, route, adapter, upstream, method, path, log_seq, inbound,
                                       projected or inbound, refs, shape, None, public_urls, response, headers))
        return out


class _StoredCalls(msgspec.Struct, frozen=True, array_like=True, gc=False, tag="calls"):
    """A row of ``CallRecords`` as a log stores it: ``["calls", first, time, common, calls]``, the
    first event's seq and the time of every one (they are appended at once)."""

    first: int
    time: str
    common: tuple[Common, ...]
    calls: list[CallRow]


class _Envelope(msgspec.Struct, frozen=True, tag_field="type", gc=False):
    seq: int
    time: str


class QuarantineEvent(_Envelope, frozen=True, tag=QUARANTINE):
    data: Quarantine


class RecoveredEvent(_Envelope, frozen=True, tag=RECOVERED):
    data: Recovered


class ForkedEvent(_Envelope, frozen=True, tag=FORKED):
    data: Forked


class RequestEvent(_Envelope, frozen=True, tag=REQUEST):
    data: RequestRecorded


class ResponseEvent(_Envelope, frozen=True, tag=RESPONSE):
    data: ResponseRecorded


class CheckpointEvent(_Envelope, frozen=True, tag=CHECKPOINT):
    data: Checkpoint


class VariantEvent(_Envelope, frozen=True, tag=VARIANT):
    data: Variant


class RejectedEvent(_Envelope, frozen=True, tag=REJECTED):
    data: Rejected


class LearntEvent(_Envelope, frozen=True, tag=LEARNT):
    data: Learnt


class LinkedEvent(_Envelope, frozen=True, tag=LINKED):
    data: Linked


class UnknownEvent(msgspec.Struct, frozen=True, gc=False):
    """An event of a type this version does not know; kept verbatim, ignored by the fold."""

    seq: int
    type: str
    time: str
    data: msgspec.Raw


KnownEvent = (QuarantineEvent | RecoveredEvent | ForkedEvent | RequestEvent | ResponseEvent | CheckpointEvent
              | VariantEvent | RejectedEvent | LearntEvent | LinkedEvent)
Event = KnownEvent | UnknownEvent
EventData = (Quarantine | Recovered | Forked | RequestRecorded | ResponseRecorded | Checkpoint | Variant | Rejected
             | Learnt | Linked)

#: Evidence, not state: these types never change a decision and the fold never needs them, so a
#: state read (``ports.SessionLog.read_state``) leaves them out.
RECORD_TYPES: Final = frozenset({REQUEST, RESPONSE})
#: Types that never make a conditional append conflict (``ports.SessionLog.append``): the
#: records, and checkpoints, which restate the fold and so cannot change what anyone decided.
PASSIVE_TYPES: Final = RECORD_TYPES | {CHECKPOINT}

#: What a record becomes once retention prunes it: its seq, its time and the type it was, nothing
#: of the call. Its row keeps the record's type (so it stays out of state reads and never makes an
#: append conflict); what it decodes to is an event of a type the fold does not know, which it
#: ignores, in this version and in older ones alike. Every seq stays, so no read sees a gap.
PRUNED: Final = "record/pruned"
#: How a pruned record's bytes begin (``pruned_record``): a body that begins so is pruned already.
PRUNED_PREFIX: Final = b'{"type":"record/pruned"'
_text: Final = msgspec.json.Encoder()


def pruned_record(seq: int, time: str, was: str) -> bytes:
    """The bytes of record ``seq`` once pruned (``PRUNED``): ``{"type", "seq", "time", "data": {"was"}}``."""
    return b"%s,\"seq\":%d,\"time\":%s,\"data\":{\"was\":%s}}" % (PRUNED_PREFIX, seq, _text.encode(time),
                                                               _text.encode(was))

_ENVELOPES: Final[dict[type, type[KnownEvent]]] = {
    Quarantine: QuarantineEvent,
    Recovered: RecoveredEvent,
    Forked: ForkedEvent,
    RequestRecorded: RequestEvent,
    ResponseRecorded: ResponseEvent,
    Checkpoint: CheckpointEvent,
    Variant: VariantEvent,
    Rejected: RejectedEvent,
    Learnt: LearntEvent,
    Linked: LinkedEvent,
}
#: The type each kind of event data is stored as.
_TAGS: Final[dict[type, str]] = {kind: str(envelope.__struct_config__.tag) for kind, envelope in _ENVELOPES.items()}
_KNOWN_TYPES: Final = frozenset(envelope.__struct_config__.tag for envelope in _ENVELOPES.values())
_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(KnownEvent)
_unknown_decoder: Final = msgspec.json.Decoder(UnknownEvent)


def envelope(seq: int, time: str, data: EventData) -> KnownEvent:
    """Wrap event data in its envelope; the log assigns ``seq`` and ``time``."""
    return _ENVELOPES[type(data)](seq=seq, time=time, data=data)  # type: ignore[arg-type]


def type_of(event: Event) -> str:
    """An event's type as stored, whether this version knows it or not."""
    return event.type if isinstance(event, UnknownEvent) else str(type(event).__struct_config__.tag)


def event_type(data: EventData) -> str:
    return _TAGS[type(data)]


def event_types(items: Iterable[EventData]) -> list[str]:
    """``event_type`` of each of ``items`` (a batch of records: one call, not one a record);
    ``KeyError`` for anything that is not event data."""
    return [_TAGS[type(item)] for item in items]


def envelopes(after_seq: int, time: str, items: Iterable[EventData]) -> list[Event]:
    """``envelope`` of each of ``items``, numbered from ``after_seq + 1`` (a batch: one call)."""
    # positional: every envelope is ``(seq, time, data)`` (a test holds it), and a batch of records
    # makes one per record
    return [_ENVELOPES[type(item)](seq, time, item)  # type: ignore[arg-type]
            for seq, item in enumerate(items, after_seq + 1)]


def encode_event(event: Event) -> bytes:
    return _encoder.encode(event)


def encode_events(events: Sequence[Event]) -> bytes:
    """``events`` as one JSON array, each as ``encode_event`` writes it alone (one call for many:
    a third of the cost of encoding each)."""
    return _encoder.encode(events)


def encode_calls(first: int, time: str, calls: CallRecords) -> bytes:
    """``calls`` as a log stores them, numbered from ``first`` (``calls_events`` reads them back)."""
    return _encoder.encode(_StoredCalls(first, time, calls.common, calls.calls))


#: How the bytes of ``encode_calls`` begin (a row of events, ``encode_events``, begins ``[{``).
CALLS_PREFIX: Final = b'["calls",'
_calls_decoder: Final = msgspec.json.Decoder(_StoredCalls)


def calls_events(raw: bytes) -> list[Event]:
    """The ``request/recorded`` events of ``encode_calls``' bytes, each as it would be stored
    alone; ``msgspec.DecodeError`` (``ValidationError``) for bytes that are not such a row, or
    name a ``Common`` it does not hold."""
    stored = _calls_decoder.decode(raw)
    if any(not 0 <= call[0] < len(stored.common) for call in stored.calls):
        raise msgspec.ValidationError("a call names a common part the row does not hold")
    records = CallRecords(stored.common, stored.calls).records()
    return [RequestEvent(seq, stored.time, record) for seq, record in enumerate(records, stored.first)]


def decode_event(raw: bytes | str) -> Event:
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError:
        unknown = _unknown_decoder.decode(raw)
        if unknown.type in _KNOWN_TYPES:
            raise  # a known type with a bad body is corruption, not evolution
        return unknown


def answers(events: Iterable[Event]) -> dict[int | str, ResponseRecorded]:
    """Every call's outcome among ``events``, by the seq of its request record and, for an
    outcome that names its request by id alone (written in one append with it), by request id.
    An outcome carried in its request's own record is found under that record's seq."""
    found: dict[int | str, ResponseRecorded] = {}
    for event in events:
        if isinstance(event, RequestEvent):
            if event.data.response is not None:
                found[event.seq] = event.data.response
        elif isinstance(event, ResponseEvent):
            found[event.data.request_seq or event.data.request_id] = event.data
    return found


def answer(request: RequestEvent, found: Mapping[int | str, ResponseRecorded]) -> ResponseRecorded | None:
    """The outcome of the call ``request`` records, from ``answers`` (None: not recorded, or not yet)."""
    return request.data.response or found.get(request.seq) or found.get(request.data.request_id)
