"""Images the provider fetches itself, by URL: their identity and display name (policy layer, pure).

An ``https://`` image (an OpenAI ``image_url`` URL, an Anthropic ``url`` source, a Gemini
``file_uri`` outside Google) is fetched by the provider, never by the proxy. When the provider
says it could not fetch one, that URL is the session's unreadable image: it is quarantined by its
identity, ``url_id``, and every later request that still carries the URL gets the placeholder.

``url_id`` is the sha256 of a fixed prefix and the URL exactly as the client wrote it:
deterministic (the same text is the same id on every replica, after a restart, in a fork and in a
replay), one-way (the log holds the id, never the URL, so a presigned URL's signature never
reaches it), and never the id of an admitted image (no image starts with the prefix's bytes). A
client that re-signs the URL sends another text, so another id: the fresh link is tried anew.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final
from urllib.parse import unquote, urlsplit

# What a provider's "could not fetch" answer says of a URL: the ``fetched`` rows of the failure table.
from .failures import Unfetched as Unfetched

#: Separates URL identities from content identities (the sha256 of an image's bytes).
_PREFIX: Final = b"projectionist image url v1\0"
_SCHEMES: Final = ("http://", "https://")
#: A display name: a last path segment that names an image file (so an opaque token in a path,
#: which may be a secret, is never shown or recorded).
_NAME: Final = re.compile(r"[^\x00-\x1f\x7f/\\]{1,100}\.(?:png|jpe?g|gif|webp|heic|heif|avif|bmp|tiff?)", re.IGNORECASE)


def is_web_url(value: str) -> bool:
    """An ``http://`` or ``https://`` URL (the scheme in any case): one a provider fetches."""
    return value[:8].lower().startswith(_SCHEMES)


def url_id(url: str) -> str:
    """The identity of the image at ``url``: ``sha256:`` and the hex digest of the prefix and the
    URL's exact text (any string: lone surrogates are hashed as they are)."""
    return "sha256:" + hashlib.sha256(_PREFIX + url.encode("utf-8", "surrogatepass")).hexdigest()


def url_name(url: str) -> str | None:
    """The name the placeholder shows for ``url``: its last path segment, decoded, when that is an
    image's file name (``cat.png``); None otherwise. Never the host, the query or the fragment."""
    try:
        segment = unquote(urlsplit(url).path.rpartition("/")[2], errors="strict")
    except ValueError:  # a malformed URL, or a %-escape that is no UTF-8
        return None
    return segment if _NAME.fullmatch(segment) else None
