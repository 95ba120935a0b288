"""Value types of the projection domain: references, stored images, outcomes (policy layer, pure).

A reference's lifecycle is a type: an ``ImageRef`` found in a request becomes either ``Resolved``
(verified bytes to inline) or ``Placeholder`` (text derived from the log). ``HttpRefs`` says which
http(s) URLs are references too: data the proxy hands in, never read from configuration here.
"""

from __future__ import annotations

import builtins
import re
from typing import Final
from urllib.parse import parse_qsl

import msgspec

from .errors import INVALID_REF, AttachmentError, Code, InvalidRequest
# Why an image is unavailable (``Failure``): a store failure (``StoreFailure``), ``rejected`` (an
# upstream refused it), ``unsupported`` (the model it goes to takes no images: a rule learnt for
# that upstream and model), ``over_limit`` (the request would pass its provider's images or bytes
# per request; the oldest images the client inlined give way) or ``unavailable`` (a kind a newer
# version recorded). Each is a row of ``failures.FAILURES``, which says what each does.
from .failures import Failure as Failure, StoreFailure as StoreFailure

ID_PREFIX: Final = "sha256:"
URL_SCHEME: Final = "attachment:"
#: Where the HTTP form of a reference lives under a public URL: ``{public_url}/v1/attachments/<id>``.
ATTACHMENTS_PATH: Final = "/v1/attachments/"
#: The file extension of each admitted media type, which the HTTP form of a reference may carry.
EXTENSION_OF: Final = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}
EXTENSIONS: Final = frozenset({*EXTENSION_OF.values(), "jpeg"})
MEDIA_TYPES: Final = ("image/png", "image/jpeg", "image/gif", "image/webp")

_ID_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")
#: A session id: 1-256 visible ASCII characters, but not ``.`` or ``..`` (no URL could name it).
_SESSION_RE: Final = re.compile(r"(?!\.\.?\Z)[\x21-\x7e]{1,256}")
#: A tenant's name (``[server] tenant_tokens_env``, or ``key-`` and a token's digest).
_TENANT_RE: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
#: Between a tenant and the session its client named, in the session's id in the log.
TENANT_MARK: Final = "~"
#: A session id as the log holds it: a client's id behind its tenant's name and ``~``.
_SCOPED_RE: Final = re.compile(r"(?!\.\.?\Z)[\x21-\x7e]{1,321}")
#: ``/s/{session}/v1/attachments/`` after a public URL: the session one literal path segment of
#: visible ASCII (no ``/``, ``?``, ``#``, ``%``; not ``.`` or ``..``).
_SESSION_PATH: Final = re.compile(r"/s/(?!\.\.?/)[\x21\x22\x24\x26-\x2e\x30-\x3e\x40-\x7e]{1,256}/v1/attachments/")


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


class ImageFacts(msgspec.Struct, frozen=True, gc=False):
    """What an image's bytes are, read from them: the media type their magic bytes and header
    name (None: they decode as no image at all, or are cut short), their size and dimensions."""

    media_type: str | None
    bytes: int
    width: int = 0
    height: int = 0


class Inlined(msgspec.Struct, frozen=True, gc=False):
    """An image the client inlined itself, as the policy sees it: its identity (the sha256 of its
    bytes), what those bytes are, and ``form``: how the client spelled it when that is not the
    canonical spelling ("" when it is: the true media type, canonical base64), e.g.
    ``labelled image/jpeg``. A refusal is about the bytes in the form they were sent."""

    id: str
    facts: ImageFacts
    form: str = ""


class Respelled(msgspec.Struct, frozen=True, tag="respelled"):
    """An image the client inlined that fits as its bytes are, but was spelled otherwise: it goes
    with the same bytes under their true ``media_type``, in canonical base64."""

    media_type: str


#: What an image the client inlined becomes: None (sent as it came), respelled, a variant
#: (``Resolved``), or its placeholder.
InlineOutcome = Resolved | Placeholder | Respelled | None


def is_valid_id(attachment_id: str) -> bool:
    """True for a canonical ``sha256:<64 lowercase hex>`` id; nothing else may reach a store."""
    return _ID_RE.fullmatch(attachment_id) is not None


def short_id(attachment_id: str) -> str:
    """An id as placeholders, logs and tables name it: ``sha256:`` + 8 hex."""
    return attachment_id[:len(ID_PREFIX) + 8]


def check_id(attachment_id: str) -> str:
    """Return the id unchanged, or raise ``INVALID_ATTACHMENT_REF``."""
    if not is_valid_id(attachment_id):
        raise AttachmentError(INVALID_REF, "attachment id must be sha256:<64 lowercase hex>")
    return attachment_id


def is_session_id(value: str) -> bool:
    """1-256 visible ASCII characters, not ``.`` or ``..``."""
    return _SESSION_RE.fullmatch(value) is not None


def check_session_id(value: str) -> str:
    """A session id is 1-256 visible ASCII characters, not ``.`` or ``..``; anything else is the
    client's error."""
    if _SESSION_RE.fullmatch(value) is None:
        raise InvalidRequest("session id must be 1-256 visible ASCII characters", code=Code.INVALID_SESSION_ID)
    return value


def is_tenant(value: str) -> bool:
    """1-64 of lowercase letters, digits, ``_`` and ``-``, starting with a letter or digit."""
    return _TENANT_RE.fullmatch(value) is not None


def check_tenant(value: str) -> str:
    """Return the tenant name unchanged, or raise ``ValueError``: a tenant names a folder or a key,
    and names come only from the configuration (a bad one here is a bug, never a client's input)."""
    if not is_tenant(value):
        raise ValueError(f"invalid tenant name {value[:80]!r}")
    return value


def scoped_session(tenant: str | None, session: str) -> str:
    """The log's id of the session ``session`` of ``tenant``: ``<tenant>~<session>``; the id as
    it is for no tenant (no client tokens, or the admin token). Two tenants naming the same id
    name two sessions; no tenant's name can reach into another's."""
    return session if tenant is None else tenant + TENANT_MARK + session


def check_scoped_session(value: str) -> str:
    """A session id as the log holds it (what the admin API and the CLI name): a client's id,
    behind a tenant's name and ``~`` when it has one (up to 321 characters)."""
    if _SCOPED_RE.fullmatch(value) is None:
        raise InvalidRequest("session id must be 1-321 visible ASCII characters", code=Code.INVALID_SESSION_ID)
    return value


class HttpRefs(msgspec.Struct, frozen=True):
    """The http(s) URLs that are references: ``{base}/v1/attachments/sha256:<hex>[?name=]`` (and
    ``{base}/s/{session}/v1/attachments/...``) for each ``base`` of this proxy's public URLs.

    A URL counts only when it starts with a base exactly (scheme, host, port and path prefix as
    spelled, no trailing slash): a lookalike host, another port, a ``..`` or percent-encoded
    spelling of the path is an ordinary URL. What follows the attachments path must be a reference
    exactly as in the ``attachment:`` form, or it is ``INVALID_ATTACHMENT_REF``."""

    bases: tuple[str, ...] = ()

    @classmethod
    def of(cls, *public_urls: str | None) -> HttpRefs:
        return cls(tuple(base for u in public_urls if u and (base := u.rstrip("/"))))

    def rest(self, url: str) -> str | None:
        """What follows the attachments path of ``url`` if ``url`` lies under one of the bases."""
        for base in self.bases:
            if not url.startswith(base):
                continue
            if url.startswith(ATTACHMENTS_PATH, len(base)):
                return url[len(base) + len(ATTACHMENTS_PATH):]
            if (session := _SESSION_PATH.match(url, len(base))) is not None:
                return url[session.end():]
        return None


#: No http(s) URL is a reference (replay of a call that had none, pure callers).
NO_HTTP: Final = HttpRefs()


def split_extension(ident: str) -> str:
    """An id without the image file extension the HTTP form may carry (``sha256:<hex>.png``): URL
    helpers that guess a type from the path's extension (``instructor``'s ``Image.from_url``)
    take such a URL without fetching it. Anything else is returned unchanged, for ``check_id``."""
    stem, dot, extension = ident.rpartition(".")
    return stem if dot and extension in EXTENSIONS and len(stem) == len(ID_PREFIX) + 64 else ident


def _reference(rest: str, http: bool = False) -> ImageRef:
    """``sha256:<hex>[?name=<url-encoded>]``, the part of a reference after its scheme or path
    (the HTTP form may add an image extension to the id)."""
    ident, sep, query = rest.partition("?")
    ident = split_extension(ident) if http else ident
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


def parse_url_ref(url: str, http: HttpRefs = NO_HTTP) -> ImageRef | None:
    """Parse the URL form ``attachment:sha256:<hex>[?name=<url-encoded>]``, or its HTTP form
    under one of ``http``'s bases.

    Returns None for anything else (it passes through untouched); raises
    ``INVALID_ATTACHMENT_REF`` for a malformed reference, which is the client's error (its
    message names the value; ``AttachmentError.value`` holds it, for the caller to name its place).
    """
    try:
        if url.startswith(URL_SCHEME):
            return _reference(url[len(URL_SCHEME):])
        if http.bases and (rest := http.rest(url)) is not None:
            return _reference(rest, http=True)
    except AttachmentError as error:
        shown = msgspec.json.encode(url[:120] + ("..." if len(url) > 120 else "")).decode()
        raise AttachmentError(INVALID_REF, f"{error.message}: {shown}", value=url) from None
    return None


def parse_file_id(file_id: str) -> ImageRef | None:
    """Parse the file-id form ``sha256:<hex>``; None for other (provider) file ids."""
    if not file_id.startswith(ID_PREFIX):
        return None
    return ImageRef(check_id(file_id))
