"""The one closed error hierarchy of projectionist (policy layer, pure).

Every error a client can see carries a stable ``code`` (never match on message text), an HTTP
``status`` and a ``retryable`` flag. ``Code`` names every code (the package refers to a code by
name, never by string); ``CODES`` registers each code once, with its status and whether its message
may reach a client, and ``STARTUP_CODES`` the start-up ones. Foreign exceptions are translated into
these at one boundary in ``proxy/``; adapters only shape them into each provider's wire format.

    ProjectionistError
    ├── InvalidRequest          400  INVALID_REQUEST, INVALID_JSON, INVALID_SESSION_ID, ...
    ├── AttachmentError         400/422/503  INVALID_ATTACHMENT_REF, ATTACHMENT_NOT_FOUND,
    │                                         ATTACHMENT_CORRUPT, ATTACHMENT_READ_FAILED
    ├── ImageRejected           400/413  INVALID_IMAGE, MEDIA_TYPE_MISMATCH, IMAGE_TOO_LARGE
    ├── PayloadTooLarge         413  PAYLOAD_TOO_LARGE
    ├── Unauthorized            401  ADMIN_UNAUTHORIZED, CLIENT_UNAUTHORIZED
    ├── Forbidden (proxy.http)  403  ADMIN_REQUIRED
    ├── NotFound                404  ROUTE_NOT_FOUND, UNKNOWN_UPSTREAM, FILE_NOT_FOUND, ...
    ├── Conflict                409  SESSION_EXISTS, a refused recovery (its failure code), ...
    ├── UpstreamError           502/503/504  UPSTREAM_UNAVAILABLE, UPSTREAM_BUSY, UPSTREAM_TIMEOUT
    ├── Unavailable             503  LOG_UNAVAILABLE, STORE_UNAVAILABLE, SESSION_CONTENDED, ...
    └── InternalError           500  UNCLASSIFIED_ERROR (a bug, never a client or store fault)
"""

from __future__ import annotations

from enum import StrEnum, auto
from typing import ClassVar, Final, NamedTuple


class Code(StrEnum):
    """Every error code, by name: ``code=Code.INVALID_CONFIG``, never the string, so that a typo is
    an ``AttributeError`` at import (and a mypy error), not a new code no registry knows.

    A member is its string: equal to it, with its hash (``CODES.get("LOG_UNAVAILABLE")`` finds it,
    as codes arrive as plain strings from the log and from tests), and the same text in ``str``,
    formatting, ``repr``, JSON (msgspec's and the standard library's) and headers. Each member is in
    ``CODES`` or in ``STARTUP_CODES``, exactly once; the import checks it."""

    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list[str]) -> str:
        return name

    def __repr__(self) -> str:  # a code in a repr (an error's, a log's key=value) reads as the string did
        return str.__repr__(self)

    # the client's request
    INVALID_REQUEST = auto()
    INVALID_JSON = auto()
    INVALID_BODY = auto()
    INVALID_QUERY = auto()
    INVALID_SESSION_ID = auto()
    INVALID_ATTACHMENT_REF = auto()
    INVALID_IMAGE = auto()
    MEDIA_TYPE_MISMATCH = auto()
    EMPTY_UPLOAD = auto()
    MISSING_FILE = auto()
    INVALID_NAME = auto()
    INVALID_MULTIPART = auto()
    INVALID_CONTENT_TYPE = auto()
    INVALID_PATH = auto()
    INVALID_UPSTREAM_NAME = auto()
    INVALID_FORK_SEQ = auto()
    INBOUND_MISMATCH = auto()
    UNKNOWN_ADAPTER = auto()
    TOO_MANY_REFERENCES = auto()
    INVALID_UPLOAD = auto()
    SESSION_CONFLICT = auto()
    UPGRADE_NOT_SUPPORTED = auto()
    INVALID_MESSAGE = auto()
    TOO_MANY_IN_FLIGHT = auto()
    CLIENT_UNAUTHORIZED = auto()
    ADMIN_UNAUTHORIZED = auto()
    ADMIN_REQUIRED = auto()
    CSRF_REJECTED = auto()
    UNKNOWN_UPSTREAM = auto()
    FILE_NOT_FOUND = auto()
    ROUTE_NOT_FOUND = auto()
    BASE_URL_MISMATCH = auto()
    NOT_RECORDED = auto()
    BLOB_NOT_FOUND = auto()
    SESSION_NOT_FOUND = auto()
    CONSOLE_NOT_HERE = auto()
    SESSION_AMBIGUOUS = auto()
    UPLOAD_NOT_FOUND = auto()
    METHOD_NOT_ALLOWED = auto()
    EXPECTATION_FAILED = auto()
    SESSION_EXISTS = auto()
    REPLAY_NEEDS_BODY = auto()
    REPLAY_NOT_REBUILT = auto()
    PAYLOAD_TOO_LARGE = auto()
    IMAGE_TOO_LARGE = auto()
    PROJECTED_TOO_LARGE = auto()
    UNSUPPORTED_ENCODING = auto()
    # an unreadable attachment
    ATTACHMENT_NOT_FOUND = auto()
    ATTACHMENT_CORRUPT = auto()
    ATTACHMENT_READ_FAILED = auto()
    # the upstream, the proxy's own storage, contention
    UPSTREAM_UNAVAILABLE = auto()
    UPSTREAM_TIMEOUT = auto()
    UPSTREAM_BUSY = auto()
    UPGRADE_REFUSED = auto()
    LOG_UNAVAILABLE = auto()
    STORE_UNAVAILABLE = auto()
    ATTACHMENT_WRITE_FAILED = auto()
    SESSION_CONTENDED = auto()
    STORE_BUSY = auto()
    UPLOADS_BUSY = auto()
    MEMORY_BUSY = auto()
    BODY_TIMEOUT = auto()
    LOG_CORRUPT = auto()
    UNCLASSIFIED_ERROR = auto()
    # how projectionist was started (STARTUP_CODES)
    INVALID_CONFIG = auto()
    EMPTY_DATA_DIR = auto()
    STARTUP_FAILED = auto()
    LISTEN_FAILED = auto()
    OPEN_PROXY_REFUSED = auto()
    MISSING_EXTRA = auto()


NOT_FOUND: Final = Code.ATTACHMENT_NOT_FOUND
CORRUPT: Final = Code.ATTACHMENT_CORRUPT
READ_FAILED: Final = Code.ATTACHMENT_READ_FAILED
INVALID_REF: Final = Code.INVALID_ATTACHMENT_REF


class Entry(NamedTuple):
    """What the registry says of one code: its HTTP status, and whether its message may reach a client.

    A code whose message is not ``public`` answers with ``says`` instead (its own message can
    hold a path, a driver's text or an internal name; it goes to the proxy's log). ``also`` lists
    the other statuses the code answers with in a particular context."""

    status: int
    says: str = ""
    also: tuple[int, ...] = ()

    @property
    def public(self) -> bool:
        return not self.says


#: Every code a client can see, by status. ``tests/test_errors.py`` holds the docs' table to it.
#: Keyed by ``Code`` members, so a lookup by the plain string finds the same entry.
CODES: Final[dict[str, Entry]] = {
    # the client's request
    Code.INVALID_REQUEST: Entry(400), Code.INVALID_JSON: Entry(400), Code.INVALID_BODY: Entry(400),
    Code.INVALID_QUERY: Entry(400), Code.INVALID_SESSION_ID: Entry(400), INVALID_REF: Entry(400),
    Code.INVALID_IMAGE: Entry(400), Code.MEDIA_TYPE_MISMATCH: Entry(400), Code.EMPTY_UPLOAD: Entry(400),
    Code.MISSING_FILE: Entry(400), Code.INVALID_NAME: Entry(400), Code.INVALID_MULTIPART: Entry(400),
    Code.INVALID_CONTENT_TYPE: Entry(400), Code.INVALID_PATH: Entry(400), Code.INVALID_UPSTREAM_NAME: Entry(400),
    Code.INVALID_FORK_SEQ: Entry(400), Code.INBOUND_MISMATCH: Entry(400), Code.UNKNOWN_ADAPTER: Entry(400),
    Code.TOO_MANY_REFERENCES: Entry(400), Code.INVALID_UPLOAD: Entry(400), Code.SESSION_CONFLICT: Entry(400),
    Code.UPGRADE_NOT_SUPPORTED: Entry(400),
    # a WebSocket message that is not a JSON object in a text frame (an error event, never an HTTP answer)
    Code.INVALID_MESSAGE: Entry(400), Code.TOO_MANY_IN_FLIGHT: Entry(429),
    Code.CLIENT_UNAUTHORIZED: Entry(401), Code.ADMIN_UNAUTHORIZED: Entry(401), Code.ADMIN_REQUIRED: Entry(403),
    Code.CSRF_REJECTED: Entry(403),
    Code.UNKNOWN_UPSTREAM: Entry(404), Code.FILE_NOT_FOUND: Entry(404), Code.ROUTE_NOT_FOUND: Entry(404),
    # the upstream answered 404 to a path one /v1 off: the client's base URL or the upstream's url
    Code.BASE_URL_MISMATCH: Entry(404),
    Code.NOT_RECORDED: Entry(404), Code.BLOB_NOT_FOUND: Entry(404), Code.SESSION_NOT_FOUND: Entry(404),
    Code.CONSOLE_NOT_HERE: Entry(404), Code.SESSION_AMBIGUOUS: Entry(409),
    Code.UPLOAD_NOT_FOUND: Entry(404),
    Code.METHOD_NOT_ALLOWED: Entry(405), Code.EXPECTATION_FAILED: Entry(417),
    Code.SESSION_EXISTS: Entry(409), Code.REPLAY_NEEDS_BODY: Entry(409), Code.REPLAY_NOT_REBUILT: Entry(409),
    Code.PAYLOAD_TOO_LARGE: Entry(413), Code.IMAGE_TOO_LARGE: Entry(413), Code.PROJECTED_TOO_LARGE: Entry(413),
    Code.UNSUPPORTED_ENCODING: Entry(415),
    # an unreadable attachment without a session (409: a recovery whose verification failed;
    # 404: GET /v1/attachments/{id} of an absent object)
    NOT_FOUND: Entry(422, also=(409, 404)), CORRUPT: Entry(422, also=(409,)), READ_FAILED: Entry(503, also=(409,)),
    # the upstream, the proxy's own storage, contention
    Code.UPSTREAM_UNAVAILABLE: Entry(502), Code.UPSTREAM_TIMEOUT: Entry(504),
    # every connection to the upstream's origin stayed in use: the proxy's own capacity, not the upstream's
    Code.UPSTREAM_BUSY: Entry(503),
    # the upstream answered a WebSocket upgrade with no 101: its own status when a client acts on it
    # (credentials, no such route, no WebSocket there, rate limit), else 502
    Code.UPGRADE_REFUSED: Entry(502, also=(401, 403, 404, 426, 429)),
    Code.LOG_UNAVAILABLE: Entry(503, "the session log is unavailable; retry"),
    Code.STORE_UNAVAILABLE: Entry(503, "the attachment store is unavailable; retry"),
    Code.ATTACHMENT_WRITE_FAILED: Entry(503, "the attachment store could not write; retry"),
    Code.SESSION_CONTENDED: Entry(503), Code.STORE_BUSY: Entry(503), Code.UPLOADS_BUSY: Entry(503),
    # the requests under way hold as many bytes as the proxy's memory budget allows
    Code.MEMORY_BUSY: Entry(503),
    # the client sent no byte of the body the proxy reads for [server] body_timeout
    Code.BODY_TIMEOUT: Entry(408),
    Code.LOG_CORRUPT: Entry(503, "the session log holds a damaged event; see the proxy log"),
    Code.UNCLASSIFIED_ERROR: Entry(500, "internal error; see the proxy log"),
}
#: Codes of mistakes in how projectionist was started: never an HTTP answer; the CLI prints one
#: line and exits 2.
STARTUP_CODES: Final[frozenset[str]] = frozenset({Code.INVALID_CONFIG, Code.EMPTY_DATA_DIR, Code.STARTUP_FAILED,
                                                  Code.LISTEN_FAILED, Code.OPEN_PROXY_REFUSED, Code.MISSING_EXTRA})


def _each_code_registered_once() -> None:
    """The names and the registry cannot drift: every ``Code`` is in exactly one of the two, and
    neither holds anything else."""
    placed = CODES.keys() | STARTUP_CODES
    twice, never, strays = CODES.keys() & STARTUP_CODES, set(Code) - placed, placed - set(Code)
    if twice or never or strays:
        raise AssertionError(f"error codes registered twice {sorted(twice)}, never {sorted(never)}, "
                             f"without a name {sorted(strays)}")


_each_code_registered_once()

ATTACHMENT_CODES: Final = frozenset({NOT_FOUND, CORRUPT, READ_FAILED, INVALID_REF})


class ProjectionistError(Exception):
    """Base class: a stable code, an HTTP status and whether retrying may help."""

    default_code: ClassVar[str] = Code.UNCLASSIFIED_ERROR
    default_status: ClassVar[int] = 500

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        known = CODES.get(self.code)
        self.status = status if status is not None else known.status if known else self.default_status
        self.retryable = retryable if retryable is not None else self.status >= 500

    @property
    def public_message(self) -> str:
        """What a client may read: the message, unless its code keeps it in the proxy's log."""
        known = CODES.get(self.code)
        return known.says if known is not None and not known.public else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status})"


class InvalidRequest(ProjectionistError):
    default_code = Code.INVALID_REQUEST
    default_status = 400


class AttachmentError(ProjectionistError):
    """A store could not deliver a verified image. ``code`` is one of the four attachment codes."""


    def __init__(self, code: str, message: str = "", *, attachment_id: str | None = None,
                 value: str | None = None) -> None:
        if code not in ATTACHMENT_CODES:
            raise ValueError(f"not an attachment code: {code}")
        super().__init__(message or code.lower(), code=code)
        self.attachment_id = attachment_id
        #: The malformed reference as the client wrote it (``INVALID_ATTACHMENT_REF``).
        self.value = value


class ImageRejected(ProjectionistError):
    """Admission refused the bytes (not an image, type disagreement, over a limit)."""

    default_code = Code.INVALID_IMAGE
    default_status = 400


class PayloadTooLarge(ProjectionistError):
    default_code = Code.PAYLOAD_TOO_LARGE
    default_status = 413


class Unauthorized(ProjectionistError):
    default_code = Code.ADMIN_UNAUTHORIZED
    default_status = 401


class NotFound(ProjectionistError):
    default_code = Code.ROUTE_NOT_FOUND
    default_status = 404


class Conflict(ProjectionistError):
    default_code = Code.SESSION_EXISTS
    default_status = 409


class UpstreamError(ProjectionistError):
    default_code = Code.UPSTREAM_UNAVAILABLE
    default_status = 502


class Unavailable(ProjectionistError):
    default_code = Code.LOG_UNAVAILABLE
    default_status = 503


class LogCorrupt(Unavailable):
    """The session log holds an event that does not decode, or a gap in its seqs: that session
    cannot be decided on until an operator mends it; other sessions go on."""

    default_code = Code.LOG_CORRUPT

    def __init__(self, session_id: str, seq: int, why: str) -> None:
        super().__init__(f"session {session_id!r} seq {seq}: {why}", retryable=False)
        self.session_id = session_id
        self.seq = seq


class InternalError(ProjectionistError):
    default_code = Code.UNCLASSIFIED_ERROR
    default_status = 500


class AppendConflict(Exception):
    """A conditional append lost the race: the log's last seq was not the expected one.

    Not a client-visible error: the policy re-reads, re-folds and decides again.
    """

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(f"session {session_id!r}: expected last seq {expected}, found {actual}")
        self.session_id = session_id
        self.expected = expected
        self.actual = actual
