"""Why an image is unavailable: the one table of failure kinds and their facts (policy layer, pure).

Each kind an image can fail with is one row of ``FAILURES``, and every place that acts on a
failure reads its row rather than a list of its own. A row says:

- ``name``: the stable value. An ``attachment/quarantine`` event's ``failure``, the word the
  placeholder shows (``[image unavailable: not_found; "shot.png" (sha256:1a2b3c4d)]``), a
  request record's ``failure`` and the metrics' label all spell it so.
- ``code``: the error code of a store read that fails so (``ATTACHMENT_NOT_FOUND``, ...); None
  for a kind no store read raises.
- ``retryable``: a later read may succeed. A store read that fails so is retried once at once,
  its quarantine says ``retryable`` and its code answers 503; every other kind is final.
- ``probed``: a standing quarantine of it is read again once its probe is due (``[policy]
  retryable_probe_after``) and lifted when that read verifies. Any other is lifted only by an
  operator's verified recovery.
- ``holds``: what it holds for. ``session``: the image, for every upstream of the session (the
  store could not give it, a provider could not fetch its URL, its bytes are no image);
  ``format``: the image, on upstreams of the format that refused it; ``model``: every image, on
  the upstream and model a rule was learnt for; ``request``: this request alone, decided anew
  each time.
- ``event``: the event type that records it: an ``attachment/quarantine``, an
  ``attachment/rejected``, or None (derived from the state and the request, never recorded).
- ``fetched``: a provider's "could not fetch" answer about an image it fetches by URL may say
  it (``Unfetched``).
- ``inline``: the kind bytes a client inlined that decode as no image are quarantined as.

The Literals below name the same kinds for the type checker; the import checks that they, the
attachment codes of ``errors.CODES`` and the table agree (``tests/policy/test_failures.py`` too).

A newer version may know a kind this one does not (a rolling deploy, a rollback), and an
``attachment/quarantine`` event is decoded with ``failure`` as a plain string for that reason:
a value not in the table makes no log corrupt. It is kept as written (a checkpoint this version
writes restates it unchanged) and read as ``unavailable`` (``of``): it holds for the session,
is never retried or probed (only an operator's recovery lifts it), and its placeholder is
``[image unavailable: unavailable (sha256:1a2b3c4d)]``, a function of the log like every other.
This version never records ``unavailable`` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, NamedTuple, get_args

from .errors import ATTACHMENT_CODES, CODES, CORRUPT, INVALID_REF, NOT_FOUND, READ_FAILED, Code

#: Every kind, as ``FAILURES`` lists them: what a placeholder can say.
Failure = Literal["not_found", "corrupt", "read_failed", "rejected", "unsupported", "over_limit", "unavailable"]
#: The kinds a store read fails with (a row with a ``code``): what this version writes in an
#: ``attachment/quarantine`` event.
StoreFailure = Literal["not_found", "corrupt", "read_failed"]
#: What a provider's "could not fetch" answer says of a URL (a ``fetched`` row): gone for good
#: (404, expired, access denied, a URL it will not fetch) or not read this time (a timeout, a
#: transient fault).
Unfetched = Literal["not_found", "read_failed"]
#: What a failure holds for (see the module docstring).
Holds = Literal["session", "format", "model", "request"]

QUARANTINE_EVENT: Final = "attachment/quarantine"
REJECTED_EVENT: Final = "attachment/rejected"


class Kind(NamedTuple):
    """One row of ``FAILURES``: one kind of failure and its facts (see the module docstring)."""

    name: Failure
    code: Code | None
    retryable: bool
    probed: bool
    holds: Holds
    event: str | None
    fetched: bool = False
    inline: bool = False


_ROWS: Final = (
    #    name           code         retryable probed holds     event             fetched inline
    Kind("not_found",   NOT_FOUND,   False,    False, "session", QUARANTINE_EVENT, True),
    Kind("corrupt",     CORRUPT,     False,    False, "session", QUARANTINE_EVENT, False,  True),
    Kind("read_failed", READ_FAILED, True,     True,  "session", QUARANTINE_EVENT, True),
    Kind("rejected",    None,        False,    False, "format",  REJECTED_EVENT),
    Kind("unsupported", None,        False,    False, "model",   None),
    Kind("over_limit",  None,        False,    False, "request", None),
    Kind("unavailable", None,        False,    False, "session", QUARANTINE_EVENT),
)
#: The table: each kind's row, by its name.
FAILURES: Final[Mapping[str, Kind]] = MappingProxyType({row.name: row for row in _ROWS})
#: The row of a quarantine whose ``failure`` this version does not know.
UNAVAILABLE: Final = FAILURES["unavailable"]
#: The row of each store failure, by its error code.
BY_CODE: Final[Mapping[str, Kind]] = MappingProxyType({row.code: row for row in _ROWS if row.code is not None})
#: The store failures no later read can mend: a store boundary may raise them only for an object
#: that is not there (``proxy.faults``), and a pinned variant that fails so is made again.
LASTING: Final = frozenset(code for code, row in BY_CODE.items() if not row.retryable)
#: The kind bytes a client inlined that decode as no image are quarantined as.
NO_IMAGE: Final = next(row for row in _ROWS if row.inline)


def of(failure: str) -> Kind:
    """The row of ``failure`` as an event or a placeholder spells it; ``unavailable``'s for a
    value this version does not know (a newer version's)."""
    return FAILURES.get(failure, UNAVAILABLE)


def by_code(code: str) -> Kind | None:
    """The row of the store failure an ``AttachmentError`` of ``code`` is (None: no store failure,
    e.g. ``INVALID_ATTACHMENT_REF``)."""
    return BY_CODE.get(code)


def retried(code: str) -> bool:
    """Whether a store read that failed with ``code`` gets one immediate retry (a retryable kind)."""
    row = BY_CODE.get(code)
    return row is not None and row.retryable


def _literals_disagree() -> list[str]:
    """Each Literal against the rows it names."""
    named = ((Failure, _ROWS), (StoreFailure, [row for row in _ROWS if row.code is not None]),
             (Unfetched, [row for row in _ROWS if row.fetched]))
    return [f"{sorted(get_args(literal))} against {sorted(row.name for row in rows)}"
            for literal, rows in named if set(get_args(literal)) != {row.name for row in rows}]


def _codes_disagree() -> list[str]:
    """The store failures against the attachment codes: the same codes, each answering 503 exactly
    when its kind is retryable."""
    wrong = [f"{row.name}: retryable {row.retryable}, status {CODES[code].status}"
             for code, row in BY_CODE.items() if row.retryable != (CODES[code].status >= 500)]
    if set(BY_CODE) != ATTACHMENT_CODES - {INVALID_REF}:
        wrong.append(f"store failures' codes {sorted(BY_CODE)} against {sorted(ATTACHMENT_CODES)}")
    return wrong


def _rows_disagree() -> list[str]:
    """A probed kind is retryable; one kind is for bytes that are no image; ``unavailable`` is
    neither retried nor probed."""
    wrong = [f"{row.name}: probed but not retryable" for row in _ROWS if row.probed and not row.retryable]
    if sum(row.inline for row in _ROWS) != 1:
        wrong.append("not exactly one kind for bytes that are no image")
    if UNAVAILABLE.retryable or UNAVAILABLE.probed or UNAVAILABLE.code is not None:
        wrong.append("unavailable is retried, probed or a store failure")
    return wrong


def _table_agrees() -> None:
    """The Literals, the attachment codes and the table cannot drift (see the module docstring)."""
    wrong = _literals_disagree() + _codes_disagree() + _rows_disagree()
    if wrong:
        raise AssertionError("the failure table disagrees: " + "; ".join(wrong))


_table_agrees()
