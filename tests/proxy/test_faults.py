"""proxy.faults: each backend's table maps its library's exceptions as it says, at one boundary; the
cause is kept; cancellation, our own errors, a lost race and anything no row names pass untouched;
and only a missing object can become a code the policy quarantines."""

from __future__ import annotations

import asyncio
import errno
import gc
import sqlite3
import sys

import aiohttp
import asyncpg
import botocore.exceptions
import pytest

from projectionist.policy.errors import (
    CORRUPT,
    INVALID_REF,
    NOT_FOUND,
    READ_FAILED,
    AppendConflict,
    AttachmentError,
    ProjectionistError,
    Unavailable,
    UpstreamError,
)
from projectionist.proxy.faults import (
    FAILED,
    FAULTS,
    LOST,
    MISSING,
    OS_ERRORS,
    TIMEOUT,
    Table,
    classify,
    map_exceptions,
)
from projectionist.proxy.sessionlog.postgres import PG_ERRORS
from projectionist.proxy.sessionlog.sqlite import SQLITE_ERRORS
from projectionist.proxy.stores.s3 import S3_ERRORS
from tests.test_layering import ROOT, imported

AID = "sha256:" + "1a2b3c4d" * 8
TABLES = {"os": OS_ERRORS, "sqlite3": SQLITE_ERRORS, "asyncpg": PG_ERRORS, "botocore": S3_ERRORS}


def s3_error(code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "said by S3"}}, "GetObject")


def os_error(number: int) -> OSError:
    return OSError(number, "said by the OS")


#: (table, a foreign exception, the fault its table says it is)
ROWS: list[tuple[str, Exception, str]] = [
    ("os", FileNotFoundError(errno.ENOENT, "gone"), MISSING),
    ("os", PermissionError(errno.EACCES, "no"), FAILED),
    ("os", IsADirectoryError(errno.EISDIR, "dir"), FAILED),
    ("os", NotADirectoryError(errno.ENOTDIR, "file"), FAILED),
    ("os", os_error(errno.EIO), FAILED),
    ("os", os_error(errno.ESTALE), FAILED),
    ("os", os_error(errno.ENOSPC), FAILED),
    ("os", TimeoutError(), TIMEOUT),
    ("sqlite3", sqlite3.OperationalError("database is locked"), FAILED),
    ("sqlite3", sqlite3.OperationalError("disk I/O error"), FAILED),
    ("sqlite3", sqlite3.DatabaseError("file is not a database"), FAILED),
    ("sqlite3", sqlite3.IntegrityError("UNIQUE constraint failed: events.session, events.seq"), FAILED),
    ("sqlite3", os_error(errno.EIO), FAILED),
    ("sqlite3", TimeoutError(), TIMEOUT),
    ("asyncpg", asyncpg.UniqueViolationError("duplicate key"), LOST),
    ("asyncpg", asyncpg.exceptions.ReadOnlySQLTransactionError("read-only after a failover"), FAILED),
    ("asyncpg", asyncpg.exceptions.DiskFullError("out of space"), FAILED),
    ("asyncpg", asyncpg.exceptions.ConnectionDoesNotExistError("connection closed"), FAILED),
    ("asyncpg", asyncpg.InterfaceError("pool is closing"), FAILED),
    ("asyncpg", ConnectionRefusedError(errno.ECONNREFUSED, "refused"), FAILED),
    ("asyncpg", TimeoutError(), TIMEOUT),
    ("botocore", s3_error("NoSuchKey"), MISSING),
    ("botocore", s3_error("404"), MISSING),
    ("botocore", s3_error("NotFound"), MISSING),
    ("botocore", s3_error("PreconditionFailed"), LOST),
    ("botocore", s3_error("412"), LOST),
    ("botocore", s3_error("ConditionalRequestConflict"), LOST),
    ("botocore", s3_error("AccessDenied"), FAILED),
    ("botocore", s3_error("SlowDown"), FAILED),
    ("botocore", s3_error("500"), FAILED),
    ("botocore", s3_error(""), FAILED),
    ("botocore", botocore.exceptions.EndpointConnectionError(endpoint_url="http://s3"), FAILED),
    ("botocore", botocore.exceptions.ConnectTimeoutError(endpoint_url="http://s3"), TIMEOUT),
    ("botocore", botocore.exceptions.ReadTimeoutError(endpoint_url="http://s3"), TIMEOUT),
    ("botocore", aiohttp.ServerDisconnectedError(), FAILED),
    ("botocore", aiohttp.ClientPayloadError("body cut"), FAILED),
    ("botocore", os_error(errno.ECONNRESET), FAILED),
    ("botocore", FileNotFoundError(errno.ENOENT, "no CA bundle"), FAILED),  # only S3 says a key is missing
    ("sqlite3", FileNotFoundError(errno.ENOENT, "no directory"), FAILED),
    ("botocore", TimeoutError(), TIMEOUT),
]
#: Not any backend's: a bug, a misuse, or something a table must never claim.
UNMAPPED: list[Exception] = [ValueError("bug"), KeyError("bug"), RuntimeError("lane is closed"),
                             AttributeError("bug"), TypeError("bug"), ZeroDivisionError()]


@pytest.mark.parametrize(("table", "exc", "fault"), ROWS, ids=lambda v: v if isinstance(v, str) else repr(v)[:40])
def test_each_table_maps_as_stated(table: str, exc: Exception, fault: str) -> None:
    assert classify(TABLES[table], exc) == fault


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_row_of_every_table_is_a_fault_or_says_which(table: str) -> None:
    for cls, row in TABLES[table].rows.items():
        assert issubclass(cls, Exception) and not issubclass(cls, ProjectionistError)
        assert row in FAULTS if isinstance(row, str) else callable(row)


@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("exc", UNMAPPED, ids=lambda e: type(e).__name__)
def test_no_table_claims_an_unknown_error(table: str, exc: Exception) -> None:
    assert classify(TABLES[table], exc) is None


# -- the boundary -----------------------------------------------------------------------------------


#: (table, exception, boundary's code, its ``missing``, its ``timeout``) -> (error class, code, in message)
BOUNDARIES = [
    ("os", FileNotFoundError(errno.ENOENT, "gone"), READ_FAILED, NOT_FOUND, None, AttachmentError, NOT_FOUND, "ENOENT"),
    ("os", FileNotFoundError(errno.ENOENT, "gone"), READ_FAILED, CORRUPT, None, AttachmentError, CORRUPT, "ENOENT"),
    ("os", os_error(errno.EIO), READ_FAILED, NOT_FOUND, None, AttachmentError, READ_FAILED, "EIO"),
    ("os", PermissionError(errno.EACCES, "no"), READ_FAILED, NOT_FOUND, None, AttachmentError, READ_FAILED, "EACCES"),
    ("os", TimeoutError(), READ_FAILED, NOT_FOUND, None, AttachmentError, READ_FAILED, "timed out"),
    ("os", os_error(errno.ENOSPC), "ATTACHMENT_WRITE_FAILED", None, None, Unavailable, "ATTACHMENT_WRITE_FAILED",
     "ENOSPC"),
    ("os", FileNotFoundError(errno.ENOENT, "gone"), "STORE_UNAVAILABLE", None, None, Unavailable, "STORE_UNAVAILABLE",
     "ENOENT"),
    ("sqlite3", sqlite3.OperationalError("database is locked"), "LOG_UNAVAILABLE", None, None, Unavailable,
     "LOG_UNAVAILABLE", "OperationalError: database is locked"),
    ("sqlite3", TimeoutError(), "LOG_UNAVAILABLE", None, None, Unavailable, "LOG_UNAVAILABLE", "timed out"),
    ("asyncpg", asyncpg.exceptions.ConnectionDoesNotExistError("closed"), "LOG_UNAVAILABLE", None, None, Unavailable,
     "LOG_UNAVAILABLE", "ConnectionDoesNotExistError"),
    ("botocore", s3_error("NoSuchKey"), READ_FAILED, NOT_FOUND, None, AttachmentError, NOT_FOUND, "NoSuchKey"),
    ("botocore", s3_error("AccessDenied"), READ_FAILED, NOT_FOUND, None, AttachmentError, READ_FAILED, "AccessDenied"),
    ("botocore", botocore.exceptions.ReadTimeoutError(endpoint_url="http://s3"), READ_FAILED, NOT_FOUND, None,
     AttachmentError, READ_FAILED, "ReadTimeoutError"),
    ("botocore", s3_error("SlowDown"), "ATTACHMENT_WRITE_FAILED", None, None, Unavailable, "ATTACHMENT_WRITE_FAILED",
     "SlowDown"),
    ("botocore", aiohttp.ServerDisconnectedError(), "STORE_UNAVAILABLE", None, None, Unavailable, "STORE_UNAVAILABLE",
     "ServerDisconnectedError"),
    # as an upstream client's table would: connection faults 502, a timeout 504
    ("botocore", aiohttp.ServerDisconnectedError(), "UPSTREAM_UNAVAILABLE", None, "UPSTREAM_TIMEOUT", UpstreamError,
     "UPSTREAM_UNAVAILABLE", "ServerDisconnectedError"),
    ("os", TimeoutError(), "UPSTREAM_UNAVAILABLE", None, "UPSTREAM_TIMEOUT", UpstreamError, "UPSTREAM_TIMEOUT",
     "timed out"),
]


@pytest.mark.parametrize(("table", "exc", "code", "missing", "timeout", "kind", "expected", "detail"), BOUNDARIES,
                         ids=lambda v: v if isinstance(v, str) else None)
def test_a_boundary_raises_its_code_for_the_fault_from_the_foreign_exception(
        table: str, exc: Exception, code: str, missing: str | None, timeout: str | None,
        kind: type[ProjectionistError], expected: str, detail: str) -> None:
    with pytest.raises(kind) as caught:
        with map_exceptions(TABLES[table], code, "sha256:1a2b3c4d read", missing=missing, timeout=timeout,
                            attachment_id=AID):
            raise exc
    error = caught.value
    assert error.code == expected
    assert error.__cause__ is exc  # chained, never swallowed
    assert error.message == f"{expected}: sha256:1a2b3c4d read ({detail})"
    assert error.retryable == (expected not in (NOT_FOUND, CORRUPT))
    if isinstance(error, AttachmentError):
        assert error.attachment_id == AID


async def test_the_boundary_works_around_await_and_is_entered_again_and_again() -> None:
    boundary = map_exceptions(OS_ERRORS, READ_FAILED, "sha256:1a2b3c4d", missing=NOT_FOUND, attachment_id=AID)

    async def read(exc: Exception) -> None:
        await asyncio.sleep(0)
        raise exc

    for exc, code in [(FileNotFoundError(errno.ENOENT, "x"), NOT_FOUND), (os_error(errno.EIO), READ_FAILED)]:
        with pytest.raises(AttachmentError) as caught:
            with boundary:
                await read(exc)
        assert (caught.value.code, caught.value.__cause__) == (code, exc)
    with boundary:
        await asyncio.sleep(0)  # nothing raised: nothing to map


# -- what passes untouched --------------------------------------------------------------------------


@pytest.mark.parametrize("table", sorted(TABLES))
async def test_cancellation_passes_untouched(table: str) -> None:
    started = asyncio.Event()

    async def read() -> None:
        with map_exceptions(TABLES[table], READ_FAILED, "sha256:1a2b3c4d", missing=NOT_FOUND, attachment_id=AID):
            started.set()
            await asyncio.sleep(30)

    task = asyncio.get_running_loop().create_task(read())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as caught:
        await task
    assert task.cancelled()
    assert caught.value.__cause__ is None and not isinstance(caught.value, ProjectionistError)
    cancelled = asyncio.CancelledError()
    with pytest.raises(asyncio.CancelledError) as raised:
        with map_exceptions(TABLES[table], READ_FAILED, "x", missing=NOT_FOUND):
            raise cancelled
    assert raised.value is cancelled


@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("exc", [*UNMAPPED, KeyboardInterrupt()], ids=lambda e: type(e).__name__)
def test_an_unmapped_error_passes_untouched_never_as_a_quarantining_code(table: str, exc: BaseException) -> None:
    with pytest.raises(type(exc)) as caught:
        with map_exceptions(TABLES[table], READ_FAILED, "sha256:1a2b3c4d", missing=NOT_FOUND, attachment_id=AID):
            raise exc
    assert caught.value is exc
    assert exc.__cause__ is None and not isinstance(exc, ProjectionistError)


@pytest.mark.parametrize("ours", [AttachmentError(CORRUPT, "damaged"), Unavailable("busy", code="STORE_BUSY"),
                                  AppendConflict("s", 1, 2)], ids=lambda e: type(e).__name__)
def test_our_own_errors_pass_untouched(ours: Exception) -> None:
    with pytest.raises(type(ours)) as caught:
        with map_exceptions(OS_ERRORS, READ_FAILED, "x", missing=NOT_FOUND):
            raise ours
    assert caught.value is ours and ours.__cause__ is None


@pytest.mark.parametrize(("table", "exc"), [("asyncpg", asyncpg.UniqueViolationError("duplicate key")),
                                            ("botocore", s3_error("PreconditionFailed"))])
def test_a_lost_race_passes_untouched_for_its_operation_to_read(table: str, exc: Exception) -> None:
    with pytest.raises(type(exc)) as caught:
        with map_exceptions(TABLES[table], "LOG_UNAVAILABLE", "session log"):
            raise exc
    assert caught.value is exc


# -- the rules a table and a boundary are held to ---------------------------------------------------


def test_the_most_specific_row_wins_whatever_the_order() -> None:
    table = Table("t", {OSError: FAILED, FileNotFoundError: MISSING, Exception: FAILED})
    assert classify(table, FileNotFoundError(errno.ENOENT, "x")) == MISSING
    assert classify(table, PermissionError(errno.EACCES, "x")) == FAILED


def test_a_row_may_say_that_an_exception_is_not_the_backends() -> None:
    table = Table("t", {ValueError: lambda exc: FAILED if "fault" in str(exc) else None})
    assert classify(table, ValueError("a fault")) == FAILED
    bug = ValueError("a bug")
    with pytest.raises(ValueError) as caught:
        with map_exceptions(table, READ_FAILED, "x"):
            raise bug
    assert caught.value is bug


@pytest.mark.parametrize(("code", "missing", "timeout"), [
    (NOT_FOUND, None, None),  # a failure of the backend is never "not found"
    (CORRUPT, None, None),
    (READ_FAILED, None, NOT_FOUND),  # nor is a timeout
    (READ_FAILED, None, CORRUPT),
    (INVALID_REF, None, None),
    (READ_FAILED, INVALID_REF, None),
    ("SESSION_EXISTS", None, None),  # a 409: no fault's code
    ("INVALID_REQUEST", None, None),
    ("UNCLASSIFIED_ERROR", None, None),
    ("NO_SUCH_CODE", None, None),
])
def test_only_a_missing_object_may_become_a_quarantining_code(code: str, missing: str | None,
                                                              timeout: str | None) -> None:
    with pytest.raises(ValueError):
        map_exceptions(OS_ERRORS, code, "x", missing=missing, timeout=timeout)


@pytest.mark.parametrize("cls", [asyncio.CancelledError, KeyboardInterrupt, SystemExit, AttachmentError,
                                 Unavailable, AppendConflict])
def test_a_table_refuses_rows_for_cancellation_and_for_our_own_errors(cls: type[BaseException]) -> None:
    with pytest.raises(ValueError):
        Table("t", {cls: FAILED})


def test_a_table_refuses_a_row_that_is_no_fault() -> None:
    with pytest.raises(ValueError):
        Table("t", {OSError: "gone"})
    table = Table("t", {OSError: lambda exc: "gone"})
    with pytest.raises(ValueError):
        classify(table, os_error(errno.EIO))


def test_a_mapped_error_leaves_no_reference_cycle() -> None:
    """The error and its cause go by reference counting, with the frames (and bytes) they hold,
    not when the cyclic GC gets round to them."""
    gc.collect()
    gc.disable()
    try:
        for exc in (os_error(errno.EIO), FileNotFoundError(errno.ENOENT, "x"), s3_error("NoSuchKey")):
            try:
                with map_exceptions(S3_ERRORS, READ_FAILED, "x", missing=NOT_FOUND, attachment_id=AID):
                    data = b"\0" * 1024  # noqa: F841 (a local the cause's frame holds)
                    raise exc
            except AttachmentError:
                pass
            del exc
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_faults_is_a_leaf() -> None:
    """The standard library and ``policy.errors``, nothing else: every backend's table and the
    upstream client's can import it, and it imports none of them."""
    names = imported(ROOT / "proxy" / "faults.py")
    ours = {name for name in names if name.startswith("projectionist")}
    assert ours == {"projectionist", "projectionist.policy", "projectionist.policy.errors"} | {
        name for name in ours if name.startswith("projectionist.policy.errors.")}
    assert {name.split(".")[0] for name in names - ours} <= set(sys.stdlib_module_names)


def test_the_boundaries_codes_are_the_failure_tables() -> None:
    """A leaf, ``faults`` keeps its own set of the codes only a missing object may become: it is
    the failure table's lasting store failures, and a retryable one is what every fault may become."""
    from projectionist.policy.failures import BY_CODE, LASTING
    from projectionist.proxy import faults

    assert faults._QUARANTINING == LASTING
    for code, row in BY_CODE.items():
        if row.retryable:
            assert faults._check(code) == code
        else:
            assert faults._check(code, quarantining=True) == code
            with pytest.raises(ValueError, match="only a missing object"):
                faults._check(code)
