"""What goes upstream: the target URL and the end-to-end headers, with auth substituted (proxy layer).

The URL is the upstream's configured base plus the validated client path (``upstream.urls``);
the query goes as the client wrote it, pair by pair, minus what ``filter_query`` refuses. The
client's own credentials are forwarded unless the upstream has a configured key; then the
format's auth headers and query parameters (Gemini's ``?key=``) are replaced by what its
adapter's ``sign`` makes of the key: here, for a format whose ``sign`` reads the key alone; right
before each send (``upstream.signing``), for one that signs the request itself. What the
``Withheld`` says is the proxy's own (client tokens, the admin token, its session and token
headers) is never forwarded, in whatever header or query parameter it came.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Final, Protocol
from urllib.parse import unquote_plus

from multidict import CIMultiDict, MultiMapping
from yarl import URL

from ...adapters.base import WireFormat
from ...adapters.registry import FORMATS, projecting
from ...policy.errors import UpstreamError
from .relay import forward_headers
from ..upstream.target import Upstream

#: Query parameters that carry a credential (any case); removed from every recorded path.
CREDENTIAL_QUERY: Final = frozenset({"key", "api_key", "api-key", "apikey", "access_token", "token"})
#: Headers a call's record never keeps: credentials (every format's auth headers, cookies, and any
#: name that says it holds a key, token, secret or password), and the proxy's own per-call trace
#: context. Replay sends the rest as the live call sent them, and the configured key again.
CREDENTIAL_HEADERS: Final = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "x-goog-api-key",
                                       "api-key", "traceparent", "tracestate", "baggage"})
#: A name that says it holds a credential: anywhere in it auth (authorization, authentication,
#: oauth), token, secret, passw(ord), credential, cookie, an api key; or key as a word of its own.
_CREDENTIAL_NAME: Final = re.compile(r"auth|token|secret|passw|credential|cookie|api[-_]?keys?|(?:^|[-_])keys?(?:$|[-_])",
                                     re.I)
#: A value shaped like a credential whatever its name: an auth scheme's prefix, an OpenAI- or
#: Anthropic-style secret key, a Google API key.
_CREDENTIAL_VALUE: Final = re.compile(r"^\s*(?:bearer|basic|token|digest)\s|\bsk-[A-Za-z0-9_-]{8,}|\bAIza[0-9A-Za-z_-]{20,}", re.I)


def filter_query(raw: str, keep: Callable[[str, str], bool]) -> str:
    """``raw`` query string minus the pairs ``keep(name, value)`` refuses; kept pairs stay byte
    for byte as the client wrote them."""
    if not raw:
        return raw
    kept = []
    for pair in raw.split("&"):
        name, _, value = pair.partition("=")
        if keep(unquote_plus(name), unquote_plus(value)):
            kept.append(pair)
    return "&".join(kept)


def is_credential(name: str, value: str = "") -> bool:
    """Whether a header or a query parameter carries a credential, by its name or its value."""
    return (name.lower() in CREDENTIAL_HEADERS or name.lower() in CREDENTIAL_QUERY
            or _CREDENTIAL_NAME.search(name) is not None or _CREDENTIAL_VALUE.search(value) is not None)


def recordable_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The headers a call went upstream with (``items()`` of them, in order), minus every one
    that ``is_credential``: what its record keeps, so replay sends the same (and the configured
    key again)."""
    kept = []
    for pair in headers:
        known = _RECORDABLE.get(pair)  # a name is an ``istr``: it hashes and compares as its str
        if known is not None:
            kept.append(known)
        elif pair[0] in _CREDENTIAL_NAMES:  # a credential by its name, whatever its value
            continue
        elif not is_credential(*pair):
            known = (str(pair[0]), str(pair[1]))
            if not (_is_text(known[0]) and _is_text(known[1])):  # no record can hold it (below)
                continue
            kept.append(known)
            if len(_RECORDABLE) >= RECORDABLE_KEPT:
                _RECORDABLE.clear()
            _RECORDABLE[known] = known
        elif is_credential(pair[0]) and len(_CREDENTIAL_NAMES) < RECORDABLE_KEPT:
            _CREDENTIAL_NAMES.add(str(pair[0]))
    return tuple(kept)


def _is_text(value: str) -> bool:
    """Whether ``value`` is text a JSON record can hold: aiohttp keeps a header's bytes that are
    no UTF-8 as surrogates (``\\udcff``), which no encoder writes, so one such header would fail
    the whole group commit its record is in, other sessions' records with it."""
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


#: Headers found to be no credential, remembered as plain strs (a client sends the same few again
#: and again, and the two patterns cost ~3 µs a header); a credential is never kept here, only
#: looked at again.
_RECORDABLE: dict[tuple[str, str], tuple[str, str]] = {}
#: Header names that are a credential by the name alone (``Authorization``, ``x-api-key``): every
#: call carries one, and its value need not be looked at to leave it out. Names only, never a value.
_CREDENTIAL_NAMES: set[str] = set()
RECORDABLE_KEPT: Final = 4096


class Withheld(Protocol):
    """The proxy's own credentials and headers, which never travel upstream."""

    def withheld_headers(self, incoming: MultiMapping[str]) -> frozenset[str]:
        """Lowercase names of the headers of ``incoming`` that must not be forwarded."""
        ...

    def holds_own(self, value: str) -> bool:
        """Whether one of the proxy's own tokens is anywhere in ``value``."""
        ...


def upstream_query(raw_query: str, fmt: WireFormat, upstream: Upstream, withheld: Withheld) -> str:
    """The incoming raw query, byte for byte, minus auth parameters the upstream's own key
    replaces and any parameter, whatever its name, whose name or value holds one of the proxy's
    own tokens."""
    if not raw_query:
        return raw_query
    replaced = frozenset(fmt.AUTH_QUERY) if upstream.api_key else frozenset()

    def keep(name: str, value: str) -> bool:
        lowered = name.lower()
        return lowered not in replaced and not (withheld.holds_own(value) or withheld.holds_own(name))

    return filter_query(raw_query, keep)


def recorded_path(raw_path: str, raw_query: str, withheld: Withheld) -> str:
    """The path and query as the session log keeps them: no parameter that ``is_credential``, and
    none holding one of the proxy's own tokens, on any format."""
    if not raw_query:  # nearly every call: no filter to build
        return raw_path
    query = filter_query(raw_query, lambda k, v: not (is_credential(k, v) or withheld.holds_own(v)
                                                      or withheld.holds_own(k)))
    return raw_path + (f"?{query}" if query else "")


def target_url(raw_path: str, raw_query: str, fmt: WireFormat, upstream: Upstream, withheld: Withheld) -> URL:
    """The configured base + the checked ``raw_path`` + ``upstream_query``."""
    return upstream.base.join(raw_path, upstream_query(raw_query, fmt, upstream, withheld))


def outgoing_headers(incoming: MultiMapping[str], fmt: WireFormat, upstream: Upstream,
                     withheld: Withheld) -> CIMultiDict[str]:
    drop = withheld.withheld_headers(incoming)
    if upstream.api_key:
        signed = None if fmt.FACTS.signs_request else fmt.sign("", "", incoming, None, upstream.api_key)
        return forward_headers(incoming, drop=drop | frozenset(fmt.AUTH_HEADERS), replace=signed)
    return forward_headers(incoming, drop=drop)


#: The content codings the proxy can read back (``bodies.inflate``): what a projected call may
#: ask its upstream for, so that a refusal is always readable.
READABLE_CODINGS: Final = frozenset({"gzip", "deflate", "identity"})


def readable_codings(headers: CIMultiDict[str]) -> None:
    """Narrow ``Accept-Encoding`` to the codings the proxy reads, in place: clients offer ``br``
    and ``zstd`` (Codex: ``zstd,gzip``), which a refusal could come back in unread. What the
    client offered among the readable ones stays, in its order and weights; none left means
    ``identity`` (a coding offered with ``q=0`` is refused, not offered). Every client that offers
    ``br`` or ``zstd`` also reads ``gzip`` or plain bytes."""
    offered = headers.getall("Accept-Encoding", ())
    if not offered:
        return
    kept = [token.strip() for value in offered for token in value.split(",")
            if token.split(";", 1)[0].strip().lower() in READABLE_CODINGS and not _refused(token)]
    headers["Accept-Encoding"] = ", ".join(kept) if kept else "identity"  # in its place: a replay sends the same order


def _refused(token: str) -> bool:
    """A coding offered with ``q=0`` (refused, RFC 9110 §12.5.3)."""
    for parameter in token.split(";")[1:]:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value.strip()) == 0.0
            except ValueError:
                return False
    return False


def naming(error: UpstreamError, upstream: Upstream) -> UpstreamError:
    """``error`` saying which upstream it is about: its name and base URL (never a credential)."""
    return UpstreamError(f"{error.message} (upstream {upstream.name!r} at {upstream.base.shown})", code=error.code,
                         status=error.status, retryable=error.retryable)


#: Path prefixes of the routes whose version is not /v1 (Gemini's, uploads): never one /v1 off.
_OTHER_VERSIONS: Final = ("/v1beta", "/v1alpha", "/upload/")


def base_url_mistake(method: str, raw_path: str, upstream: Upstream, public_url: str) -> str | None:
    """What a 404 of the upstream to ``raw_path`` most likely means, when the path is one /v1 off
    (the upstream's url ending in /v1 and the client's path starting with it again; or a client
    whose base URL lacks /v1 calling one of the proxy's own routes, chat or messages, on an upstream
    whose format's paths sit under /v1: OpenAI's, Anthropic's), else None. Asked only of a 404.
    Any other path (Azure's deployments, a provider's own extras) keeps the upstream's 404 as it came."""
    where = f"upstream {upstream.name!r} at {upstream.base.shown}"
    if upstream.base.path.endswith("/v1") and (raw_path == "/v1" or raw_path.startswith("/v1/")):
        return (f"the {where} answered 404 to {upstream.base.path}{raw_path}: its url ends in /v1 and the "
                f"client's path starts with /v1 too; drop /v1 from [upstreams.{upstream.name}] url")
    facts = FORMATS.get(upstream.format)
    if (facts is not None and facts.v1_paths and not upstream.base.path.endswith("/v1")
            and not raw_path.startswith(("/v1/", *_OTHER_VERSIONS)) and raw_path != "/v1"
            and projecting(upstream.format, method, raw_path) is not None):
        return (f"the {where} answered 404 to {raw_path}, which has no /v1: set the client's base URL to "
                f"{public_url}/v1 (the SDKs' own bases end in /v1)")
    return None
