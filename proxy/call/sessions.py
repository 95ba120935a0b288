"""Which session a request belongs to, also when its client named none (proxy layer).

Agents send no ``X-Session-Id``, but most already say which conversation a call belongs to. The
first that applies wins:

1. **named**: the ``/s/{session}/`` path prefix or the session header (``[server] session_header``);
   the two must agree (else 400 ``SESSION_CONFLICT``). The session is the value as given.
2. **a configured alias** (``[server] session_header_aliases``): the value as given, never a conflict.
3. **the client's own session**, from what it sends anyway (``CLIENT_HEADERS``: Claude Code's
   ``X-Claude-Code-Session-Id``, Codex's ``session-id``, gateway session headers; then the body,
   read only when the proxy decodes it anyway: Claude Code's ``metadata.user_id``, a Responses
   ``conversation`` or ``prompt_cache_key``). The session is ``<source>:<value>``.
4. **derived**, only for a request that carries images it inlined itself (a request of
   ``attachment:`` references alone keeps ``[server] sessionless``): ``derived:`` and a digest of the client's
   credential, the wire format and the conversation's first messages (``adapters.<fmt>.opening``),
   with every inlined image counted by its identity and content parts that are a client's
   bookkeeping block alone (``adapters.base.bookkeeping``: a ``<system-reminder>``, a
   ``<session_context>``) left out, and a user message of such parts alone skipped for the next.
   Two conversations that open alike, sent with the same credential, share a derived session.
   A derived session is continued by what the conversation kept (``conversations``): a request
   that carries an image an earlier answered call of the credential sent under the same system prompt
   is that request's session, so a compaction that rewrote the opening keeps its session.

A value that is no valid session id (too long, not visible ASCII) stands as its digest. A
client's own or a derived session never turns a request into an error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import msgspec
from multidict import MultiMapping

from ...adapters.base import WireFormat, bookkeeping
from ...policy.errors import Code, InvalidRequest
from ...policy.model import TENANT_MARK, check_session_id, is_session_id
from .outgoing import CREDENTIAL_QUERY

#: Headers in which clients name their own session, and the source each one's session is named by.
CLIENT_HEADERS: Final = (
    ("x-claude-code-session-id", "claude-code"),  # Claude Code 1.0.x and later
    ("session-id", "codex"),  # the Codex CLI 0.17x (``thread-id`` carries the same value)
    ("session_id", "codex"),  # older Codex CLIs
    ("conversation_id", "codex"),
    ("x-litellm-session-id", "litellm"),  # LiteLLM proxy clients
    ("helicone-session-id", "helicone"),  # Helicone gateway clients
    ("langfuse-session-id", "langfuse"),
)
#: The sources whose values apps set themselves and often share between their users (one
#: ``prompt_cache_key`` for a whole app): their sessions are scoped by the request's credentials,
#: so another key naming the same value never lands in the same session. The agents' own ids
#: (Claude Code's, Codex's, a Responses ``conversation``) are random per conversation.
SHARED: Final = frozenset({"cache-key", "litellm", "helicone", "langfuse"})
#: The credential headers whose value scopes a derived or shared session (hashed, never kept).
_CREDENTIALS: Final = ("authorization", "x-api-key", "x-goog-api-key", "api-key", "x-projectionist-token")
#: The longest client value kept as it is in a session id; a longer one stands as its digest.
_VALUE_MAX: Final = 200
_encoder: Final = msgspec.json.Encoder(order="sorted")


class Found(NamedTuple):
    """A request's session and where it came from (the log line's ``session_source``)."""

    id: str
    source: str


def named(headers: MultiMapping[str], header: str, aliases: tuple[str, ...], in_path: str | None) -> Found | None:
    """Rules 1 and 2: the session the client named on purpose (a header's value not yet
    ``checked``: a header that disagrees with the path is a conflict, whatever it holds)."""
    value = headers.get(header)
    if value is None:
        return Found(in_path, "path") if in_path is not None else _alias(headers, aliases)
    if in_path is not None and value != in_path:
        raise InvalidRequest(f"the {header} header and the /s/{{session}}/ path name different sessions",
                             code=Code.SESSION_CONFLICT)
    return Found(value, "header")  # checked (``checked``) where the session is scoped


def _alias(headers: MultiMapping[str], aliases: tuple[str, ...]) -> Found | None:
    """Rule 2: the first configured alias header the request carries, not empty."""
    for alias in aliases:
        value = headers.get(alias)
        if value:
            return Found(_scoped("", value, headers), "alias")
    return None


def from_headers(headers: MultiMapping[str]) -> Found | None:
    """Rule 3, the headers: a client's own session header."""
    for name, source in CLIENT_HEADERS:
        value = headers.get(name)
        if value:
            return Found(_scoped(source + ":", value, headers), source)
    return None


def from_body(fmt: WireFormat, body: Any, headers: MultiMapping[str]) -> Found | None:
    """Rule 3, the body: the session a client names in its decoded body (``adapters``' hint)."""
    hint = fmt.session_hint(body)
    if hint is None:
        return None
    source, value = hint
    return Found(_scoped(source + ":", value, headers), source)


def derived(fmt: WireFormat, headers: MultiMapping[str], body: Any, images: Mapping[int, str],
            query: MultiMapping[str] | None = None) -> Found | None:
    """Rule 4: a session derived from the conversation's opening (None: the format has none).
    ``images`` maps the id of each inlined image's JSON string in ``body`` to its identity;
    ``query`` the request's query, whose credential parameters scope it too."""
    opening = fmt.opening(body)
    if opening is None:
        return None
    digest = hashlib.sha256()
    digest.update(fmt.FORMAT.encode() + b"\0" + credentials(headers, query).encode())
    digest.update(b"\0\0" + _encoder.encode(_standing(opening, images)))
    return Found("derived:" + digest.hexdigest()[:32], "derived")


def image_keys(fmt: WireFormat, headers: MultiMapping[str], body: Any, images: Mapping[int, str],
               query: MultiMapping[str] | None = None) -> tuple[str, ...]:
    """A digest of each image its client inlined in ``body`` (``images``, as for ``derived``, in
    the body's order), each once: its identity, with the system prompt it was sent under, scoped
    by the format and the credential as a derived session is. What a conversations index
    (``conversations``) knows a conversation by when its opening changed: a compaction keeps the
    latest turns as they were (Gemini CLI) or attaches their images anew (Qwen Code); a side call
    with a prompt of its own, or another bot of the same key, is another conversation."""
    if not images:
        return ()
    scope = hashlib.sha256(fmt.FORMAT.encode() + b"\0" + credentials(headers, query).encode() + b"\0\0")
    scope.update(_encoder.encode(_standing(fmt.system(body), images)) + b"\0\0")
    keys = []
    for identity in dict.fromkeys(images.values()):
        digest = scope.copy()
        digest.update(identity.encode())
        keys.append(digest.hexdigest()[:32])
    return tuple(keys)


def credentials(headers: MultiMapping[str], query: MultiMapping[str] | None = None) -> str:
    """A short digest of the credentials a request carries (never the credentials): its
    credential headers and, given ``query``, the credential parameters of its query (Gemini's
    ``?key=``)."""
    digest = hashlib.sha256()
    for name in _CREDENTIALS:
        for value in headers.getall(name, ()):
            digest.update(b"\0" + name.encode() + b"\0" + value.encode("utf-8", "surrogateescape"))
    if query:
        for name in sorted(CREDENTIAL_QUERY):
            for value in query.getall(name, ()):
                digest.update(b"\0?" + name.encode() + b"\0" + value.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:12]


def _standing(node: Any, images: Mapping[int, str]) -> Any:
    """``node`` with every inlined image's base64 replaced by its identity, prompt-cache marks
    dropped (clients move them from turn to turn) and the clients' bookkeeping parts left out
    (``adapters.base.bookkeeping``: a ``<system-reminder>``, Gemini CLI's ``<session_context>``):
    what stays the same on every turn."""
    if isinstance(node, dict):
        return {k: _standing(v, images) for k, v in node.items() if k != "cache_control"}
    if isinstance(node, list):
        return [_standing(v, images) for v in node if not bookkeeping(v)]
    if isinstance(node, str):
        return images.get(id(node), node)
    return node


def _scoped(prefix: str, value: str, headers: MultiMapping[str]) -> str:
    """``prefix`` + ``value`` when that is a valid session id, else ``prefix`` + its digest. A
    value apps commonly share between users (``SHARED``: a cache key, a gateway's session) is
    scoped by the request's credentials too (``@`` + their short digest)."""
    session = prefix + value
    if not (len(value) <= _VALUE_MAX and is_session_id(session)):
        session = prefix + "sha256-" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    if prefix[:-1] in SHARED:
        session += "@" + credentials(headers)
    return session


def session_of(headers: MultiMapping[str], names: tuple[str, ...], in_path: str | None = None) -> str | None:
    """The session the client named on purpose (``named``): its header (``names[0]``, which must
    agree with a path that names one), the path, or a configured alias."""
    found = named(headers, names[0], names[1:], in_path)
    return checked(found).id if found is not None else None


#: Session ids the proxy keeps for itself (a tenant's refusals: ``call.refusals``), never a client's.
RESERVED: Final = "~refusals"
#: The same for the conversations indexes (``call.conversations``).
INDEXES: Final = "~conversations"


def is_own(session_id: str) -> bool:
    """Whether ``session_id`` (as the log holds it, behind a tenant's name or not) is one the
    proxy keeps for itself (``RESERVED``, ``INDEXES``)."""
    if session_id.startswith((RESERVED, INDEXES)):
        return True
    _, mark, rest = session_id.partition(TENANT_MARK)
    return bool(mark) and rest.startswith((RESERVED, INDEXES))


def checked(found: Found) -> Found:
    """``found``, whose id is a valid session id (a header's value is checked: 400
    ``INVALID_SESSION_ID``; every other source makes valid ids) and none the proxy keeps for
    itself (``RESERVED``, ``INDEXES``: a client naming one would write into its tenant's refusals
    or conversations)."""
    if found.source == "header":
        check_session_id(found.id)
    if found.id.startswith((RESERVED, INDEXES)):
        raise InvalidRequest(f"session ids starting with {RESERVED} or {INDEXES} are the proxy's own",
                             code=Code.INVALID_SESSION_ID)
    return found
