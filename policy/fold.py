"""The quarantine fold and the placeholder text (policy layer, pure).

``fold`` turns a session's events into ``SessionState``: which attachments are quarantined, by
which event (a store failure for every upstream, a rejection for the one upstream format that
refused the image), and which variant of an image each target gets. A later
``attachment/recovered`` lifts an image's quarantines; a ``session/checkpoint``
restates the whole state, so ``fold_states`` can start at the latest one and skip the records.
The placeholder is a pure function of the reference as written and the quarantine event, never
of current store state, so the same log and the same request always project to the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

import msgspec

from .events import (
    PRUNED,
    RECORD_TYPES,
    Checkpoint,
    CheckpointEvent,
    Event,
    Held,
    Learnt,
    LearntEvent,
    LinkedEvent,
    Quarantine,
    QuarantineEvent,
    RecoveredEvent,
    Rejected,
    RejectedEvent,
    RequestEvent,
    ResponseEvent,
    Variant,
    VariantEvent,
    type_of,
)
from .model import Failure, ImageRef, short_id


class SessionState(msgspec.Struct, frozen=True):
    """Folded view of one session's log up to ``last_seq``; ``since`` holds the time of the event
    behind each store quarantine (what a retryable quarantine's probe waits on); ``rejected``
    holds the rejections by (upstream format, attachment id); ``variants`` the pinned variants by
    (attachment id, target); ``learnt`` the rules refusals taught about requests, by (upstream,
    model, rule); ``unsaved`` counts the state events folded since the latest checkpoint (or the
    start), which decides when the next checkpoint is due."""

    last_seq: int = 0
    quarantined: Mapping[str, Quarantine] = MappingProxyType({})
    since: Mapping[str, str] = MappingProxyType({})
    unsaved: int = 0
    rejected: Mapping[tuple[str, str], Rejected] = MappingProxyType({})
    variants: Mapping[tuple[str, str], Variant] = MappingProxyType({})
    learnt: Mapping[tuple[str, str, str], Learnt] = MappingProxyType({})

    def standing(self, attachment_id: str, upstream_format: str | None) -> Quarantine | Rejected | None:
        """The quarantine that holds for this image on an upstream of ``upstream_format``: a
        store failure first, else that format's rejection."""
        found = self.quarantined.get(attachment_id)
        if found is None and upstream_format is not None and self.rejected:
            return self.rejected.get((upstream_format, attachment_id))
        return found

    def held_inline(self, attachment_id: str, upstream_format: str, form: str = "") -> Quarantine | Rejected | None:
        """The quarantine that holds for an image a client inlined in ``form`` ("": canonically)
        on an upstream of ``upstream_format``: its bytes found no image (``inline``), else that
        format's rejection of those bytes in any form, or in this one. Store failures never hold
        for it: its bytes are in the request, not in the store."""
        found = self.quarantined.get(attachment_id) if self.quarantined else None
        if found is not None and found.inline:
            return found
        rejected = self.rejected.get((upstream_format, attachment_id)) if self.rejected else None
        if rejected is not None and rejected.form in ("", form):
            return rejected
        return None

    def rules(self, upstream: str | None, model: str | None) -> tuple[Learnt, ...]:
        """The rules learnt for requests to ``upstream`` naming ``model``."""
        if not self.learnt or upstream is None:
            return ()
        model = model or ""
        return tuple(rule for (u, m, _), rule in self.learnt.items() if u == upstream and m == model)

    @property
    def size(self) -> int:
        """How many entries a checkpoint of this state holds."""
        return len(self.quarantined) + len(self.rejected) + len(self.variants) + len(self.learnt)


EMPTY = SessionState()
#: The records' event classes: ``_Folding.step`` passes over them first.
_RECORDS: Final = frozenset({RequestEvent, ResponseEvent})

#: A checkpoint is due once this many state events were folded since the last one (and at least
#: a quarter as many as the quarantines it would hold: see ``checkpoint_due``). A cold fold then
#: reads one checkpoint and fewer than max(CHECKPOINT_EVERY, standing quarantines / 4) state
#: events, each a row of its own among the records (one page read each, cold): 32 keep that
#: under a millisecond beside a request's few, while a checkpoint every 32 state events costs one
#: small non-durable append per 32 decisions.
CHECKPOINT_EVERY: Final = 32
#: Checkpoints hold every standing quarantine: one is due no sooner than after a quarter as many
#: state events, so all of a log's checkpoints together hold at most about four entries per state
#: event (rather than growing with the square of the state events when quarantines pile up).
CHECKPOINT_SPREAD: Final = 4


class _Folding:
    """The mutable state of one fold run; ``step`` is the one place that says what an event does."""

    def __init__(self, state: SessionState) -> None:
        self.quarantined = dict(state.quarantined)
        self.since = dict(state.since)
        self.unsaved = state.unsaved
        self.rejected = dict(state.rejected)
        self.variants = dict(state.variants)
        self.learnt = dict(state.learnt)

    def step(self, event: Event) -> None:
        if type(event) in _RECORDS:  # most of a log, and they change nothing
            return
        if isinstance(event, QuarantineEvent):
            self.quarantined[event.data.attachment_id] = event.data
            self.since[event.data.attachment_id] = event.time
        elif isinstance(event, RejectedEvent):
            self.rejected[(event.data.format, event.data.attachment_id)] = event.data
        elif isinstance(event, RecoveredEvent):  # lifts the image's quarantines, rejections too
            self._lift(event.data.attachment_id)
        elif isinstance(event, VariantEvent):
            self.variants[(event.data.attachment_id, event.data.target)] = event.data
        elif isinstance(event, LearntEvent):
            rule = event.data
            self.learnt[(rule.upstream, rule.model, rule.rule)] = rule
        elif isinstance(event, CheckpointEvent):  # the whole state, restated: start again from it
            self._restate(event.data)
            return
        elif isinstance(event, LinkedEvent):  # a conversations index's link: none of a session's state
            return
        # a state event (a fork, an unknown type); a record of a type not known here, or one
        # retention pruned, counts for nothing
        kind = type_of(event)
        if kind not in RECORD_TYPES and kind != PRUNED:
            self.unsaved += 1

    def _lift(self, aid: str) -> None:
        self.quarantined.pop(aid, None)
        self.since.pop(aid, None)
        for key in [key for key in self.rejected if key[1] == aid]:
            del self.rejected[key]

    def _restate(self, checkpoint: Checkpoint) -> None:
        self.quarantined = {held.quarantine.attachment_id: held.quarantine for held in checkpoint.quarantined}
        self.since = {held.quarantine.attachment_id: held.since for held in checkpoint.quarantined}
        self.rejected = {(r.format, r.attachment_id): r for r in checkpoint.rejected}
        self.variants = {(v.attachment_id, v.target): v for v in checkpoint.variants}
        self.learnt = {(r.upstream, r.model, r.rule): r for r in checkpoint.learnt}
        self.unsaved = 0

    def state(self, last_seq: int) -> SessionState:
        return SessionState(last_seq, MappingProxyType(self.quarantined), MappingProxyType(self.since), self.unsaved,
                            MappingProxyType(self.rejected), MappingProxyType(self.variants),
                            MappingProxyType(self.learnt))


def fold(events: Iterable[Event], state: SessionState = EMPTY) -> SessionState:
    """Apply ``events`` (in seq order, all after ``state.last_seq``) to ``state``.

    Promises: folding a log in one go or in any split of consecutive chunks gives equal states;
    event types the fold does not know only advance ``last_seq``; a checkpoint replaces the state
    with the one it restates.
    """
    folding = _Folding(state)
    last = state.last_seq
    for event in events:
        if event.seq != last + 1:
            raise ValueError(f"event seq {event.seq} does not follow {last}")
        last = event.seq
        if type(event) not in _RECORDS:  # most of a log, and they change nothing (``step`` says so too)
            folding.step(event)
    return folding.state(last)


def fold_states(events: Iterable[Event], last_seq: int, state: SessionState = EMPTY) -> SessionState:
    """Apply the *state* events of a log up to ``last_seq`` (records left out, so seqs may skip)
    to ``state``: what ``SessionLog.read_state`` returns.

    Promises: equal to ``fold`` of every event after ``state.last_seq`` up to ``last_seq`` when
    ``events`` are exactly its non-record events, or the latest checkpoint among them and the
    non-record events after it (the records and the skipped prefix change nothing that the
    checkpoint does not restate). A ``last_seq`` behind ``state`` keeps ``state.last_seq``.
    """
    folding = _Folding(state)
    last = state.last_seq
    for event in events:
        if not last < event.seq <= last_seq:
            raise ValueError(f"state event seq {event.seq} is not in ({last}, {last_seq}]")
        last = event.seq
        folding.step(event)
    return folding.state(max(last_seq, state.last_seq))


def assuming(state: SessionState, rejected: Iterable[Rejected]) -> SessionState:
    """``state`` as if ``rejected`` had been recorded (never written): what a call that tries
    whether leaving some images out helps is built from."""
    extra = {(r.format, r.attachment_id): r for r in rejected}
    if not extra:
        return state
    return msgspec.structs.replace(state, rejected=MappingProxyType({**state.rejected, **extra}))


def checkpoint_due(state: SessionState, every: int = CHECKPOINT_EVERY) -> bool:
    """Whether ``state`` should be restated in a checkpoint: ``every`` state events since the last
    one, and at least a quarter as many as the checkpoint would hold (``CHECKPOINT_SPREAD``), so
    that checkpoints never cost the log more than about four entries per state event however
    many quarantines stand."""
    return state.unsaved >= max(every, state.size // CHECKPOINT_SPREAD)


def checkpoint_of(state: SessionState) -> Checkpoint:
    """The checkpoint that restates ``state`` (each kind in fold order); folding it gives back
    ``state``'s quarantines, since-times, rejections and variants."""
    held = tuple(Held(q, state.since[aid]) for aid, q in state.quarantined.items())
    return Checkpoint(state.last_seq, held, tuple(state.variants.values()), tuple(state.rejected.values()),
                      tuple(state.learnt.values()))


def placeholder(ref: ImageRef, quarantine: Quarantine | Rejected) -> str:
    """The text that stands in for an unavailable image.

    Names the failure class (its row's name in the failure table: ``unavailable`` for a kind this
    version does not know), the display name when known (the reference's own name first, else
    the one recorded with the quarantine; JSON-quoted) and the id prefix ``sha256:`` + 8 hex.
    Example: ``[image unavailable: not_found; "shot.png" (sha256:1a2b3c4d)]``.
    """
    return placeholder_text(ref, quarantine.kind, quarantine.name)


def placeholder_text(ref: ImageRef, failure: Failure, recorded_name: str | None = None) -> str:
    """``placeholder``'s text for ``failure`` (``unsupported``: a learnt rule, no event of the image's own)."""
    name = ref.name if ref.name is not None else recorded_name
    short = short_id(ref.id)
    if name:
        quoted = msgspec.json.encode(name).decode()
        return f"[image unavailable: {failure}; {quoted} ({short})]"
    return f"[image unavailable: {failure} ({short})]"
