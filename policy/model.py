"""Value types of the projection domain: references, stored images, outcomes (policy layer, pure).

A reference's lifecycle is a type: an ``ImageRef`` found in a request becomes either ``Resolved``
(verified bytes to inline) or ``Placeholder`` (text derived from the log).
"""

from __future__ import annotations

import builtins
import re
from typing import Final, Literal
from urllib.parse import parse_qsl

import msgspec

from projectionist.policy.errors import INVALID_REF, AttachmentError, InvalidRequest

#: The store's three failures: what an ``attachment/quarantine`` event can say.
StoreFailure = Literal["not_found", "corrupt", "read_failed"]
#: Why an image is unavailable: a store failure, or ``rejected`` (an upstream refused it).
Failure = Literal["not_found", "corrupt", "read_failed", "rejected"]

ID_PREFIX: Final = "sha256:"
URL_SCHEME: Final = "attachment:"
MEDIA_TYPES: Final = ("image/png", "image/jpeg", "image/gif", "image/webp")

_ID_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")
_SESSION_RE: Final = re.compile(r"[\x21-\x7e]{1,256}")


class ImageRef(msgspec.Struct, frozen=True):
    """One reference as written in a request: canonical id plus an optional display name."""

    id: str
    name: str | None = None

    @property
    def hex(self) -> str:
        return self.id[len(ID_PREFIX):]


class StoredImage(msgspec.Struct, frozen=True):
    """A verified image: ``data`` hashes to ``id`` and agrees with the admission record."""

    id: str
    media_type: str
    bytes: int
    width: int
    height: int
    data: builtins.bytes


class Resolved(msgspec.Struct, frozen=True, tag="resolved"):
    image: StoredImage


class Placeholder(msgspec.Struct, frozen=True, tag="placeholder"):
    failure: Failure
    text: str


Outcome = Resolved | Placeholder


def is_valid_id(attachment_id: str) -> bool:
    """True for a canonical ``sha256:<64 lowercase hex>`` id; nothing else may reach a store."""
    return _ID_RE.fullmatch(attachment_id) is not None


def check_id(attachment_id: str) -> str:
    """Return the id unchanged, or raise ``INVALID_ATTACHMENT_REF``."""
    if not is_valid_id(attachment_id):
        raise AttachmentError(INVALID_REF, "attachment id must be sha256:<64 lowercase hex>")
    return attachment_id


def check_session_id(value: str) -> str:
    """A session id is 1-256 visible ASCII characters; anything else is the client's error."""
    if _SESSION_RE.fullmatch(value) is None:
        raise InvalidRequest("session id must be 1-256 visible ASCII characters", code="INVALID_SESSION_ID")
    return value


def parse_url_ref(url: str) -> ImageRef | None:
    """Parse the URL form ``attachment:sha256:<hex>[?name=<url-encoded>]``.

    Returns None for anything that is not an ``attachment:`` URL (it passes through untouched);
    raises ``INVALID_ATTACHMENT_REF`` for a malformed one, which is the client's error.
    """
    if not url.startswith(URL_SCHEME):
        return None
    rest = url[len(URL_SCHEME):]
    ident, sep, query = rest.partition("?")
    check_id(ident)
    name: str | None = None
    if sep:
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            raise AttachmentError(INVALID_REF, "malformed attachment reference query") from None
        for key, value in pairs:
            if key != "name" or name is not None:
                raise AttachmentError(INVALID_REF, "attachment reference takes only one 'name' parameter")
            name = value
    return ImageRef(ident, name or None)


def parse_file_id(file_id: str) -> ImageRef | None:
    """Parse the file-id form ``sha256:<hex>``; None for other (provider) file ids."""
    if not file_id.startswith(ID_PREFIX):
        return None
    return ImageRef(check_id(file_id))
