"""Outgoing URLs: a configured base plus a validated path, nothing else (proxy layer).

The rule: the scheme, host and port of every upstream request are those of a configured upstream.
``Base`` keeps a configured URL parsed once (``config.base_url``); ``Base.join`` builds the
outgoing URL from its parts and a path the client sent, and ``check_path`` refuses any path that
starts without ``/``, holds a ``.`` or ``..`` segment in any decoding of it (encoded,
double-encoded, backslash-separated, ``..;``), an IIS-style ``%u`` escape, a control character,
bytes that are not UTF-8 (overlong forms included), or raw non-ASCII. A refused path is the
client's error (400 ``INVALID_PATH``), never forwarded.
"""

from __future__ import annotations

import functools

import re
from typing import Final
from urllib.parse import unquote_to_bytes

from yarl import URL

from ...policy.errors import Code, InvalidRequest
from ..config import base_url

_SEPARATORS: Final = re.compile(r"[/\\]")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
#: Decoding rounds looked through for a hidden ``..`` (``%252e%252e`` needs two).
_ROUNDS: Final = 4


def _bad_path(why: str) -> InvalidRequest:
    return InvalidRequest(f"path refused: {why}", code=Code.INVALID_PATH)


def _dot_segment(path: str) -> bool:
    return any(s.split(";", 1)[0] in (".", "..") for s in _SEPARATORS.split(path))


def check_path(raw: str) -> str:
    """``raw`` (the path as the client sent it, still percent-encoded), if it may follow a base URL."""
    if not raw.startswith("/"):
        raise _bad_path("it must start with '/'")
    if not raw.isascii():
        raise _bad_path("raw non-ASCII characters must be percent-encoded")
    if "%" not in raw and "." not in raw and "\\" not in raw:
        return raw  # the common case: nothing to decode, no dot anywhere
    current = raw
    for _ in range(_ROUNDS):
        if _dot_segment(current):
            raise _bad_path("'.' and '..' segments are not allowed, in any encoding")
        if _CONTROL.search(current):
            raise _bad_path("control characters are not allowed")
        if "%" not in current:
            return raw
        if "%u" in current or "%U" in current:
            raise _bad_path("%u escapes are not allowed")
        try:
            decoded = unquote_to_bytes(current).decode("utf-8")
        except UnicodeDecodeError:
            raise _bad_path("percent-encoded bytes must be UTF-8") from None
        if decoded == current:
            return raw
        current = decoded
    raise _bad_path("too many layers of percent-encoding")


class Base:
    """A configured upstream base URL, parsed once; the only source of scheme, host and port."""

    __slots__ = ("url", "_path", "_parts", "_joined")

    #: Joined URLs kept per base: a proxy sends the same few paths again and again.
    JOINED_KEPT = 256

    def __init__(self, configured: str) -> None:
        url = base_url(configured)
        self.url = url
        self._path = url.raw_path.rstrip("/")
        self._parts = {"scheme": url.scheme, "user": url.raw_user, "password": url.raw_password,
                       "host": url.host_subcomponent, "port": url.explicit_port}
        #: The same inputs always give the same URL: the latest ``JOINED_KEPT`` are kept (an
        #: exception is never cached, so a refused path is refused again).
        self._joined = functools.lru_cache(maxsize=self.JOINED_KEPT)(self._join)

    @property
    def path(self) -> str:
        """The base's path, without a trailing slash ('' for none)."""
        return self._path

    @property
    def shown(self) -> str:
        """The base as an error may show it: scheme, host, port and path; never a user or password."""
        return str(self.url.with_user(None))

    def join(self, path: str, query: str = "") -> URL:
        """The outgoing URL for a client ``path`` (checked here) and raw ``query``."""
        return self._joined(path, query)

    def _join(self, path: str, query: str) -> URL:
        check_path(path)
        out = URL.build(**self._parts, path=self._path + path, query_string=query, encoded=True)  # type: ignore[arg-type]
        if out.origin() != self.url.origin():  # by construction; kept as the rule's last word
            raise _bad_path("it would leave the configured upstream")
        return out
