"""The one closed error hierarchy of projectionist (policy layer, pure).

Every error a client can see carries a stable ``code`` (never match on message text), an HTTP
``status`` and a ``retryable`` flag; ``CODES`` registers each code once, with its status and
whether its message may reach a client. Foreign exceptions are translated into these at one boundary
in ``proxy/``; adapters only shape them into each provider's wire format.

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
    ├── UpstreamError           502/504  UPSTREAM_UNAVAILABLE, UPSTREAM_TIMEOUT
    ├── Unavailable             503  LOG_UNAVAILABLE, STORE_UNAVAILABLE, SESSION_CONTENDED, ...
    └── InternalError           500  UNCLASSIFIED_ERROR (a bug, never a client or store fault)
"""

from __future__ import annotations

from typing import ClassVar, Final, NamedTuple

NOT_FOUND: Final = "ATTACHMENT_NOT_FOUND"
CORRUPT: Final = "ATTACHMENT_CORRUPT"
READ_FAILED: Final = "ATTACHMENT_READ_FAILED"
INVALID_REF: Final = "INVALID_ATTACHMENT_REF"


class Code(NamedTuple):
    """One stable error code: its HTTP status, and whether its message may reach a client.

    A code whose message is not ``public`` answers with ``says`` instead (its own message can
    hold a path, a driver's text or an internal name; it goes to the proxy's log). ``also`` lists
    the other statuses the code answers with in a particular context."""

    status: int
    says: str = ""
    also: tuple[int, ...] = ()

    @property
    def public(self) -> bool:
        return not self.says


#: Every code a client can see, by status. ``tests/test_errors.py`` holds the README's table to it.
CODES: Final[dict[str, Code]] = {
    # the client's request
    "INVALID_REQUEST": Code(400), "INVALID_JSON": Code(400), "INVALID_BODY": Code(400),
    "INVALID_QUERY": Code(400), "INVALID_SESSION_ID": Code(400), INVALID_REF: Code(400),
    "INVALID_IMAGE": Code(400), "MEDIA_TYPE_MISMATCH": Code(400), "EMPTY_UPLOAD": Code(400),
    "MISSING_FILE": Code(400), "INVALID_NAME": Code(400), "INVALID_MULTIPART": Code(400),
    "INVALID_CONTENT_TYPE": Code(400), "INVALID_PATH": Code(400), "INVALID_UPSTREAM_NAME": Code(400),
    "INVALID_FORK_SEQ": Code(400), "INBOUND_MISMATCH": Code(400), "UNKNOWN_ADAPTER": Code(400),
    "TOO_MANY_REFERENCES": Code(400), "INVALID_UPLOAD": Code(400), "SESSION_CONFLICT": Code(400),
    "UPGRADE_NOT_SUPPORTED": Code(400),
    "CLIENT_UNAUTHORIZED": Code(401), "ADMIN_UNAUTHORIZED": Code(401), "ADMIN_REQUIRED": Code(403),
    "CSRF_REJECTED": Code(403),
    "UNKNOWN_UPSTREAM": Code(404), "FILE_NOT_FOUND": Code(404), "ROUTE_NOT_FOUND": Code(404),
    "NOT_RECORDED": Code(404), "BLOB_NOT_FOUND": Code(404), "SESSION_NOT_FOUND": Code(404), "UPLOAD_NOT_FOUND": Code(404),
    "METHOD_NOT_ALLOWED": Code(405), "EXPECTATION_FAILED": Code(417),
    "SESSION_EXISTS": Code(409), "REPLAY_NEEDS_BODY": Code(409), "REPLAY_NOT_REBUILT": Code(409),
    "PAYLOAD_TOO_LARGE": Code(413), "IMAGE_TOO_LARGE": Code(413), "PROJECTED_TOO_LARGE": Code(413), "UNSUPPORTED_ENCODING": Code(415),
    # an unreadable attachment without a session (409: a recovery whose verification failed;
    # 404: GET /v1/attachments/{id} of an absent object)
    NOT_FOUND: Code(422, also=(409, 404)), CORRUPT: Code(422, also=(409,)), READ_FAILED: Code(503, also=(409,)),
    # the upstream, the proxy's own storage, contention
    "UPSTREAM_UNAVAILABLE": Code(502), "UPSTREAM_TIMEOUT": Code(504),
    "LOG_UNAVAILABLE": Code(503, "the session log is unavailable; retry"),
    "STORE_UNAVAILABLE": Code(503, "the attachment store is unavailable; retry"),
    "ATTACHMENT_WRITE_FAILED": Code(503, "the attachment store could not write; retry"),
    "SESSION_CONTENDED": Code(503), "STORE_BUSY": Code(503), "UPLOADS_BUSY": Code(503),
    "LOG_CORRUPT": Code(503, "the session log holds a damaged event; see the proxy log"),
    "UNCLASSIFIED_ERROR": Code(500, "internal error; see the proxy log"),
}
#: Codes of mistakes in how projectionist was started: never an HTTP answer; the CLI prints one
#: line and exits 2.
STARTUP_CODES: Final = frozenset({"INVALID_CONFIG", "EMPTY_DATA_DIR", "STARTUP_FAILED", "LISTEN_FAILED",
                                  "OPEN_PROXY_REFUSED", "MISSING_EXTRA"})


ATTACHMENT_CODES: Final = frozenset({NOT_FOUND, CORRUPT, READ_FAILED, INVALID_REF})


class ProjectionistError(Exception):
    """Base class: a stable code, an HTTP status and whether retrying may help."""

    default_code: ClassVar[str] = "UNCLASSIFIED_ERROR"
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
    default_code = "INVALID_REQUEST"
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

    default_code = "INVALID_IMAGE"
    default_status = 400


class PayloadTooLarge(ProjectionistError):
    default_code = "PAYLOAD_TOO_LARGE"
    default_status = 413


class Unauthorized(ProjectionistError):
    default_code = "ADMIN_UNAUTHORIZED"
    default_status = 401


class NotFound(ProjectionistError):
    default_code = "ROUTE_NOT_FOUND"
    default_status = 404


class Conflict(ProjectionistError):
    default_code = "SESSION_EXISTS"
    default_status = 409


class UpstreamError(ProjectionistError):
    default_code = "UPSTREAM_UNAVAILABLE"
    default_status = 502


class Unavailable(ProjectionistError):
    default_code = "LOG_UNAVAILABLE"
    default_status = 503


class LogCorrupt(Unavailable):
    """The session log holds an event that does not decode, or a gap in its seqs: that session
    cannot be decided on until an operator mends it; other sessions go on."""

    default_code = "LOG_CORRUPT"

    def __init__(self, session_id: str, seq: int, why: str) -> None:
        super().__init__(f"session {session_id!r} seq {seq}: {why}", retryable=False)
        self.session_id = session_id
        self.seq = seq


class InternalError(ProjectionistError):
    default_code = "UNCLASSIFIED_ERROR"
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
