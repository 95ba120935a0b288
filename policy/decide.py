"""What a projection does next, from what it knows: a pure decision table (policy layer, pure).

``decide`` looks at the request's references, the folded session state and the reads so far,
and names the next step: read these ids, record these quarantines, lift these retryable
quarantines whose probe verified, fail the request, or done with every outcome. It touches no
store and no log, so it is tested as a table (``tests/policy/test_decide.py``); ``project`` is
the short loop that carries the steps out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from projectionist.policy.errors import CORRUPT, INVALID_REF, NOT_FOUND, READ_FAILED, AttachmentError
from projectionist.policy.events import Quarantine
from projectionist.policy.fold import SessionState, placeholder
from projectionist.policy.model import Failure, ImageRef, Outcome, Placeholder, Resolved, StoredImage

Sessionless = Literal["fail", "placeholder"]
FAILURE: Final[dict[str, Failure]] = {NOT_FOUND: "not_found", CORRUPT: "corrupt", READ_FAILED: "read_failed"}


def _quarantine_for(error: AttachmentError, attachment_id: str, name: str | None) -> Quarantine:
    return Quarantine(attachment_id, FAILURE[error.code], retryable=error.code == READ_FAILED, name=name)


class Read(msgspec.Struct, frozen=True):
    """Next: read these ids (none of them quarantined, none read yet)."""

    ids: tuple[str, ...]


class Record(msgspec.Struct, frozen=True):
    """Next: append these quarantines (the session's log decides them, once)."""

    quarantines: tuple[Quarantine, ...]


class Lift(msgspec.Struct, frozen=True):
    """Next: lift these retryable quarantines, whose probe read verified (``attachment/recovered``,
    ``automatic``)."""

    images: tuple[StoredImage, ...]


class Fail(msgspec.Struct, frozen=True):
    """Next: fail the request with this error (a bad reference, or a sessionless failure)."""

    error: Any


class Done(msgspec.Struct, frozen=True):
    """The outcome of every reference, aligned with the request's references."""

    outcomes: tuple[Outcome, ...]


Step = Read | Record | Lift | Fail | Done


def decide(
    refs: Sequence[ImageRef],
    state: SessionState,
    results: Mapping[str, StoredImage | AttachmentError],
    *,
    recording: bool,
    sessionless: Sessionless = "fail",
    due: frozenset[str] = frozenset(),
) -> Step:
    """The next step of a projection, from what is known so far (pure; see ``project``).

    ``results`` holds the verified read (or its failure) of each id read so far; ``recording``
    says whether there is a session log to record quarantines in; ``due`` names the retryable
    quarantines whose probe is due (``Prober``): they are read, and lifted if the read verifies."""
    names = names_of(refs)
    pending = tuple(aid for aid in names
                    if (aid not in state.quarantined or aid in due) and aid not in results)
    if pending:
        return Read(pending)
    lifts = tuple(image for aid in names if aid in due and aid in state.quarantined
                  and isinstance(image := results[aid], StoredImage))
    if lifts and recording:
        return Lift(lifts)
    failures = {aid: result for aid in names
                if aid not in state.quarantined and isinstance(result := results[aid], AttachmentError)}
    for error in failures.values():
        if error.code == INVALID_REF:
            return Fail(error)
    wanted = tuple(_quarantine_for(error, aid, names[aid]) for aid, error in failures.items())
    if wanted and recording:
        return Record(wanted)
    if wanted and sessionless == "fail":
        return Fail(next(iter(failures.values())))
    unrecorded = {q.attachment_id: q for q in wanted}
    outcomes: list[Outcome] = []
    for ref in refs:
        quarantine = state.quarantined.get(ref.id) or unrecorded.get(ref.id)
        if quarantine is not None:
            outcomes.append(Placeholder(quarantine.failure, placeholder(ref, quarantine)))
        else:
            image = results[ref.id]
            assert isinstance(image, StoredImage)
            outcomes.append(Resolved(image))
    return Done(tuple(outcomes))


def names_of(refs: Sequence[ImageRef]) -> dict[str, str | None]:
    """Each referenced id once, in order, with the first display name any reference gave it."""
    names: dict[str, str | None] = {}
    for ref in refs:
        if names.get(ref.id) is None:
            names[ref.id] = ref.name
    return names
