"""Foreign exceptions become projectionist errors once, at each operation's boundary (proxy layer).

A leaf: the standard library and ``policy.errors``, nothing else. As httpx's ``map_exceptions``
does for httpcore, each foreign library gets one ``Table``, kept beside the backend that calls it
(``OS_ERRORS`` here, for the filesystem store; ``S3_ERRORS`` in ``stores.s3``, ``SQLITE_ERRORS`` in
``sessionlog.sqlite``, ``PG_ERRORS`` in ``sessionlog.postgres``). A row names one of the library's
exception classes and the *fault* it is, or a function of the exception that says which (None: not
the backend's). One fault means different codes to different operations (a missing data file is
NOT_FOUND, a missing record CORRUPT, a failed write ATTACHMENT_WRITE_FAILED), so the operation names
its codes where it applies the table:

    fault    what the backend said                   becomes
    MISSING  the object or key is not there          ``missing`` (else ``code``)
    TIMEOUT  no answer in time                       ``timeout`` (else ``code``)
    FAILED   it failed: an I/O fault, refused, down  ``code``
    LOST     a conditional write lost its race       nothing: it passes as it is, for the operation
                                                     that made its write conditional to read

API:

    Table(library, {ForeignError: fault | (exc -> fault | None), ...}, detail=describe)
    map_exceptions(table, code, what, *, missing=None, timeout=None, attachment_id=None) -> Boundary
    classify(table, exc) -> fault | None     Table.types: its classes, for an ``except`` clause
    OS_FAULTS: rows for TimeoutError and OSError, for a library's table to add; describe(exc)

Once per operation, around everything it does, ``await`` included (a ``Boundary`` is a plain
context manager; built once, it may be entered again and again):

    with map_exceptions(OS_ERRORS, READ_FAILED, short_id(aid), missing=NOT_FOUND, attachment_id=aid):
        return await self.reads.run(read)

An upstream client's table, beside its transport (rows match by MRO, and aiohttp's timeout is a
``ClientError`` before it is a ``TimeoutError``, hence its own row):

    AIOHTTP_ERRORS = Table("aiohttp", {aiohttp.ServerTimeoutError: TIMEOUT, aiohttp.ClientError: FAILED, **OS_FAULTS})
    with map_exceptions(AIOHTTP_ERRORS, "UPSTREAM_UNAVAILABLE", name, timeout="UPSTREAM_TIMEOUT"): ...

Raised: ``AttachmentError`` for an attachment code (with ``attachment_id``), ``Unavailable`` for a
503 code, ``UpstreamError`` for a 502 or 504 one; the message is ``"<code>: <what> (<detail>)"``,
``detail`` the table's short, byte-free name of the exception (an errno name, an S3 error code,
``timed out``, a class name), and ``__cause__`` the foreign exception. The rules, each of which
``tests/proxy/test_faults.py`` holds:

- the most specific row wins, whatever the rows' order (the exception's MRO decides);
- only an ``Exception`` is looked at: cancellation (``asyncio.CancelledError``), ``KeyboardInterrupt``
  and ``SystemExit`` pass untouched, and no table may hold a row for them;
- our own errors pass untouched, and so does an exception no row matches (a bug, a misuse): it is
  never made a store or log fault, never anything the policy could quarantine;
- a quarantining code (``ATTACHMENT_NOT_FOUND``, ``ATTACHMENT_CORRUPT``) is accepted only as
  ``missing``: a backend that failed or did not answer is at most ``ATTACHMENT_READ_FAILED`` (one
  retry, then a retryable quarantine). A code no boundary may raise is refused when the boundary is
  built (``ValueError``), not when a fault first happens.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Final

from ..policy.errors import (
    ATTACHMENT_CODES,
    CODES,
    CORRUPT,
    NOT_FOUND,
    READ_FAILED,
    AppendConflict,
    AttachmentError,
    ProjectionistError,
    Unavailable,
    UpstreamError,
)

MISSING: Final = "missing"
TIMEOUT: Final = "timeout"
FAILED: Final = "failed"
LOST: Final = "lost"
FAULTS: Final = frozenset({MISSING, TIMEOUT, FAILED, LOST})

#: A row's value: the fault, or a function of the exception that says which (None: not a fault).
Row = str | Callable[[BaseException], str | None]
#: Codes a boundary may raise for every fault, and those only a MISSING one may become.
_QUARANTINING: Final = frozenset({NOT_FOUND, CORRUPT})


def describe(exc: BaseException) -> str:
    """A short, byte-free name of a foreign exception: ``timed out``, an errno name, else its class."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    name = errno.errorcode.get(exc.errno) if isinstance(exc, OSError) and exc.errno is not None else None
    return name or type(exc).__name__


class Table:
    """One foreign library's exceptions and the fault each is (see the module docstring)."""

    __slots__ = ("library", "rows", "detail")

    def __init__(self, library: str, rows: Mapping[type[BaseException], Row],
                 detail: Callable[[BaseException], str] = describe) -> None:
        for cls, row in rows.items():
            if not issubclass(cls, Exception):
                raise ValueError(f"{library}: {cls.__name__} is no Exception (cancellation is never a fault)")
            if issubclass(cls, (ProjectionistError, AppendConflict)):
                raise ValueError(f"{library}: {cls.__name__} is ours, never foreign")
            if isinstance(row, str) and row not in FAULTS:
                raise ValueError(f"{library}: {cls.__name__} -> {row!r} is not a fault")
        self.library = library
        self.rows = dict(rows)
        self.detail = detail

    @property
    def types(self) -> tuple[type[BaseException], ...]:
        return tuple(self.rows)

    def classify(self, exc: BaseException) -> str | None:
        """The fault ``exc`` is: its most specific class's row; None when no row says one."""
        if not isinstance(exc, Exception) or isinstance(exc, (ProjectionistError, AppendConflict)):
            return None
        for cls in type(exc).__mro__:
            row = self.rows.get(cls)
            if row is not None:
                fault = row if isinstance(row, str) else row(exc)
                if fault is not None and fault not in FAULTS:
                    raise ValueError(f"{self.library}: {cls.__name__} -> {fault!r} is not a fault")
                return fault
        return None


#: The standard library's faults where no file is the object itself (sockets, a database's file):
#: ``TimeoutError`` (which the lanes and ``asyncio.timeout`` raise too) and every other OSError.
#: A file or socket that is not there is a failure here, never a missing object. Tables of other
#: libraries add these rows to their own.
OS_FAULTS: Final[Mapping[type[BaseException], Row]] = {TimeoutError: TIMEOUT, OSError: FAILED}
#: Files that are the objects (the filesystem store): one that is not there is MISSING.
OS_ERRORS: Final = Table("os", {FileNotFoundError: MISSING, **OS_FAULTS})


def classify(table: Table, exc: BaseException) -> str | None:
    """The fault ``exc`` is by ``table`` (``MISSING``, ``TIMEOUT``, ``FAILED``, ``LOST``), or None."""
    return table.classify(exc)


def _check(code: str, *, quarantining: bool = False) -> str:
    if code in _QUARANTINING and quarantining:
        return code
    if code in ATTACHMENT_CODES:
        if code == READ_FAILED:
            return code
        why = "only a missing object may become" if code in _QUARANTINING else "a boundary never raises"
        raise ValueError(f"{why} {code}")
    known = CODES.get(code)
    if known is None or known.status not in (502, 503, 504):
        raise ValueError(f"{code} is not a fault's code (an attachment code, or a 502/503/504 one)")
    return code


class Boundary:
    """The boundary of one operation (``map_exceptions``): a context manager, sync, and around
    ``await`` in async code; built once, it may be entered again and again."""

    __slots__ = ("table", "codes", "what", "attachment_id")

    def __init__(self, table: Table, code: str, what: str, *, missing: str | None = None,
                 timeout: str | None = None, attachment_id: str | None = None) -> None:
        self.table = table
        self.codes: dict[str | None, str] = {
            FAILED: _check(code),
            TIMEOUT: _check(timeout or code),
            MISSING: _check(missing or code, quarantining=True),
        }
        self.what = what
        self.attachment_id = attachment_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if exc is None:
            return
        code = self.codes.get(self.table.classify(exc))
        if code is None:
            return  # not the backend's (or a lost race): it goes on as it is
        # Never bound to a name here: this frame is in the new error's traceback, and a local
        # holding the error would make a cycle that keeps it (and the bytes its cause's frames
        # hold) until the cyclic GC runs.
        raise _error(code, f"{code}: {self.what} ({self.table.detail(exc)})", self.attachment_id) from exc


def _error(code: str, message: str, attachment_id: str | None) -> ProjectionistError:
    if code in ATTACHMENT_CODES:
        return AttachmentError(code, message, attachment_id=attachment_id)
    if CODES[code].status == 503:
        return Unavailable(message, code=code)
    return UpstreamError(message, code=code)


def map_exceptions(table: Table, code: str, what: str, *, missing: str | None = None,
                   timeout: str | None = None, attachment_id: str | None = None) -> Boundary:
    """Raise the projectionist error of any foreign exception ``table`` classifies, from it.

    ``code`` is what FAILED becomes, and TIMEOUT and MISSING unless ``timeout`` or ``missing`` say
    otherwise; ``what`` names the object or the operation in the message; ``attachment_id`` goes on
    an ``AttachmentError``. Raises ``ValueError`` at once for a code the boundary may not raise."""
    return Boundary(table, code, what, missing=missing, timeout=timeout, attachment_id=attachment_id)
