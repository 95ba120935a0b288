"""The one closed error hierarchy of projectionist (policy layer, pure).

Every error a client can see carries a stable ``code`` (never match on message text), an HTTP
``status`` and a ``retryable`` flag. Foreign exceptions are translated into these at one boundary
in ``proxy/``; adapters only shape them into each provider's wire format.

    ProjectionistError
    ├── InvalidRequest          400  INVALID_REQUEST, INVALID_JSON, INVALID_SESSION_ID, ...
    ├── AttachmentError         400/422/503  INVALID_ATTACHMENT_REF, ATTACHMENT_NOT_FOUND,
    │                                         ATTACHMENT_CORRUPT, ATTACHMENT_READ_FAILED
    ├── ImageRejected           400/413  INVALID_IMAGE, MEDIA_TYPE_MISMATCH, IMAGE_TOO_LARGE
    ├── PayloadTooLarge         413  PAYLOAD_TOO_LARGE
    ├── Unauthorized            401  ADMIN_UNAUTHORIZED
    ├── NotFound                404  NOT_FOUND
    ├── Conflict                409  RECOVERY_REFUSED(+failure code), SESSION_EXISTS, ...
    ├── UpstreamError           502/504  UPSTREAM_UNAVAILABLE, UPSTREAM_TIMEOUT
    ├── Unavailable             503  LOG_UNAVAILABLE, SESSION_CONTENDED
    └── InternalError           500  UNCLASSIFIED_ERROR (a bug, never a client or store fault)
"""

from __future__ import annotations

from typing import ClassVar, Final

NOT_FOUND: Final = "ATTACHMENT_NOT_FOUND"
CORRUPT: Final = "ATTACHMENT_CORRUPT"
READ_FAILED: Final = "ATTACHMENT_READ_FAILED"
INVALID_REF: Final = "INVALID_ATTACHMENT_REF"

#: Default HTTP status per attachment code when the error reaches a client directly
#: (sessionless request): unreadable content is 422, a transient fault is 503.
_ATTACHMENT_STATUS: Final = {NOT_FOUND: 422, CORRUPT: 422, READ_FAILED: 503, INVALID_REF: 400}


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
        self.status = status if status is not None else self.default_status
        self.retryable = retryable if retryable is not None else self.status >= 500

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status})"


class InvalidRequest(ProjectionistError):
    default_code = "INVALID_REQUEST"
    default_status = 400


class AttachmentError(ProjectionistError):
    """A store could not deliver a verified image. ``code`` is one of the four attachment codes."""


    def __init__(self, code: str, message: str = "", *, attachment_id: str | None = None) -> None:
        if code not in _ATTACHMENT_STATUS:
            raise ValueError(f"not an attachment code: {code}")
        super().__init__(message or code.lower(), code=code, status=_ATTACHMENT_STATUS[code])
        self.attachment_id = attachment_id


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
    default_code = "NOT_FOUND"
    default_status = 404


class Conflict(ProjectionistError):
    default_code = "CONFLICT"
    default_status = 409


class UpstreamError(ProjectionistError):
    default_code = "UPSTREAM_UNAVAILABLE"
    default_status = 502


class Unavailable(ProjectionistError):
    default_code = "SERVICE_UNAVAILABLE"
    default_status = 503


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
