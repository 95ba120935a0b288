"""Who may do what: client tokens, the admin token, and what of them is never forwarded (proxy layer).

Clients present a token the way their SDK sends its key (``Authorization: Bearer``, ``x-api-key``,
``x-goog-api-key``, ``?key=``), or in ``X-Projectionist-Token`` when those carry their own
provider key. The admin token is any of the header forms (never the query). Tokens are compared
as bytes in constant time, so a header that is not UTF-8 is just a wrong token, never a crash.
``Guard`` is also the upstream side's ``Withheld``: any header holding one of the proxy's tokens
(whatever its name, anywhere in its value: in a list, quoted, in JSON, percent-encoded, inside
``Basic`` credentials), any query parameter holding one, its token header and the session
headers are never forwarded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from urllib.parse import unquote_to_bytes
from collections.abc import Iterable, Mapping
from typing import Final

from multidict import MultiMapping

from ...policy.errors import Code, ProjectionistError

#: Headers that carry a credential, by SDK: OpenAI (and most others), Anthropic, Gemini.
CREDENTIAL_HEADERS: Final = ("authorization", "x-api-key", "x-goog-api-key")
#: Tokens at least this long are withheld wherever they appear in a value; shorter ones only as
#: a word (no letter or digit beside them), lest a one-letter token withhold every header.
WHOLE_MIN: Final = 8
#: The proxy's own token header, for clients whose SDK key goes to the provider.
TOKEN_HEADER: Final = "x-projectionist-token"
#: Header values ``withheld_headers`` remembers as holding no token, at most, and the longest one.
CLEAN_KEPT: Final = 4096
CLEAN_VALUE_MAX: Final = 512
#: Headers whose values are credentials: never remembered (what another client presented is
#: nobody's business, not even by how long a check of it takes).
_NEVER_KEPT: Final = frozenset({*CREDENTIAL_HEADERS, TOKEN_HEADER, "cookie", "proxy-authorization", "api-key"})


class Forbidden(ProjectionistError):
    default_code = Code.ADMIN_REQUIRED
    default_status = 403


def client_unauthorized() -> ProjectionistError:
    return ProjectionistError("missing or wrong client token (Authorization: Bearer, x-api-key, "
                              "x-goog-api-key, ?key= or X-Projectionist-Token)",
                              code=Code.CLIENT_UNAUTHORIZED, status=401)


def _bytes(value: str) -> bytes:
    """A header value as the bytes the client sent (aiohttp keeps undecodable bytes as surrogates)."""
    return value.encode("utf-8", "surrogateescape")


def _presented_in(header: str, value: str) -> str:
    """The token a credential header presents: the rest of ``Bearer <token>``, or the value."""
    if header == "authorization":
        scheme, _, token = value.strip().partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""
    return value.strip()


class Guard:
    """The configured tokens and session headers, and the checks every route makes with them.
    ``client_tokens`` maps each client token to its tenant (``Config.tenants``); given as a
    plain set, each token is a tenant of its own."""

    def __init__(self, client_tokens: Mapping[str, str] | Iterable[str], admin_token: str,
                 session_headers: Iterable[str] = ()) -> None:
        tenants = client_tokens if isinstance(client_tokens, Mapping) else \
            {t: "key-" + hashlib.sha256(t.encode()).hexdigest()[:12] for t in client_tokens}
        pairs = [(_bytes(t), tenant) for t, tenant in tenants.items() if t]
        self.client_tokens = tuple(t for t, _ in pairs)
        self._tenants = tuple(tenant for _, tenant in pairs)
        self.admin_token = _bytes(admin_token) if admin_token else b""
        self._own = tuple(t for t in (*self.client_tokens, self.admin_token) if t)
        self._long = tuple(t for t in self._own if len(t) >= WHOLE_MIN)
        self._short = tuple(re.compile(rb"(?<![A-Za-z0-9])" + re.escape(t) + rb"(?![A-Za-z0-9])")
                            for t in self._own if len(t) < WHOLE_MIN)
        #: Never forwarded, whatever they hold: the session headers and the token header.
        self.own_headers = frozenset({*(h.lower() for h in session_headers), TOKEN_HEADER})
        #: Console cookies signed out before they expire (value -> expiry), on this process.
        self.revoked: dict[str, float] = {}
        #: Header values found to hold none of the tokens (a client sends the same few every
        #: request); a credential header's value is never kept here, nor a value that holds one.
        self._clean: set[str] = set()

    @property
    def clients_required(self) -> bool:
        return bool(self.client_tokens)

    @staticmethod
    def _matches(candidate: bytes, tokens: tuple[bytes, ...]) -> bool:
        found = False
        for token in tokens:  # no early exit: the time does not say which token was near
            found |= hmac.compare_digest(candidate, token)
        return found

    def _presented(self, headers: MultiMapping[str], query: Mapping[str, str] | None) -> list[bytes]:
        found = [_bytes(_presented_in(name, value)) for name in (TOKEN_HEADER, *CREDENTIAL_HEADERS)
                 for value in headers.getall(name, ())]
        if query is not None:
            found += [_bytes(v) for v in query.getall("key", ())]  # type: ignore[attr-defined]
        return [c for c in found if c]

    def is_admin(self, headers: MultiMapping[str]) -> bool:
        return bool(self.admin_token) and any(
            self._matches(c, (self.admin_token,)) for c in self._presented(headers, None))

    def is_client(self, headers: MultiMapping[str], query: Mapping[str, str]) -> bool:
        """A client token (or the admin token) was presented; always true when none is configured."""
        if not self.client_tokens:
            return True
        return any(self._matches(c, self._own) for c in self._presented(headers, query))

    def require_client(self, headers: MultiMapping[str], query: Mapping[str, str]) -> str | None:
        """The tenant of the client token presented, or raise ``CLIENT_UNAUTHORIZED``. None is
        every tenant: no client tokens are configured (one user), or the admin token came."""
        if not self.client_tokens:
            return None
        presented = self._presented(headers, query)
        if self.admin_token and any(self._matches(c, (self.admin_token,)) for c in presented):
            return None
        for candidate in presented:  # the token header first: it is the proxy's own (``_presented``)
            tenant = None
            for token, owner in zip(self.client_tokens, self._tenants):  # no early exit, as ``_matches``
                if hmac.compare_digest(candidate, token):
                    tenant = owner
            if tenant is not None:
                return tenant
        raise client_unauthorized()

    def require_admin(self, headers: MultiMapping[str], query: Mapping[str, str], what: str) -> None:
        """The admin token, for operations that change every session (deleting an attachment)."""
        if self.is_admin(headers):
            return
        self.require_client(headers, query)
        if not self.admin_token:
            raise Forbidden(f"{what} needs the admin token, and none is configured (PROJECTIONIST_ADMIN_TOKEN)")
        raise Forbidden(f"{what} needs the admin token")

    # -- Withheld (upstream.outgoing) ------------------------------------------------------------

    def _in(self, raw: bytes) -> bool:
        """A token of at least ``WHOLE_MIN`` bytes anywhere in ``raw``; a shorter one where no
        letter or digit touches it (so ``t`` never withholds ``Content-Type: text/plain``)."""
        return any(token in raw for token in self._long) or any(word.search(raw) for word in self._short)

    def holds_own(self, value: str) -> bool:
        """Whether one of the proxy's tokens is anywhere in ``value``: as it came, percent-decoded,
        or inside base64 ``Basic`` credentials (padded or not). Anywhere, not only as a word
        (``"tok"``, ``{"key":"tok"}``, ``x/tok``, ``x.tok``); a token shorter than ``WHOLE_MIN``
        only where no letter or digit touches it."""
        if not self._own:
            return False
        raw = _bytes(value)
        if self._in(raw):
            return True
        if b"%" in raw and self._in(unquote_to_bytes(raw)):
            return True
        scheme, _, rest = value.strip().partition(" ")
        if scheme.lower() == "basic":
            packed = rest.strip()
            try:
                decoded = base64.b64decode(packed + "=" * (-len(packed) % 4), validate=True)
            except (ValueError, binascii.Error):
                return False
            return self._in(decoded)
        return False

    def withheld_headers(self, incoming: MultiMapping[str]) -> frozenset[str]:
        """Every header that holds one of the proxy's tokens, whatever its name (``api-key``, a
        custom one) and spelling, and the proxy's own headers: never forwarded."""
        if not self._own:
            return self.own_headers
        held = []
        clean = self._clean
        for name, value in incoming.items():
            if value in clean:
                continue
            if self.holds_own(value):
                held.append(name.lower())
            elif name.lower() not in _NEVER_KEPT and len(value) <= CLEAN_VALUE_MAX:
                if len(clean) >= CLEAN_KEPT:
                    clean.clear()
                clean.add(value)
        return self.own_headers.union(held) if held else self.own_headers
