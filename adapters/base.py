"""Shared pieces of the adapters: reference sites, in-place patching, the adapter shape, reading
image rejections (adapters layer).

An image slot is one image part inside a decoded body (the list or object that holds it and its
index or key), so rendering replaces exactly that part and every other field survives unchanged.
A slot is one of three kinds (``Slot``, a union tagged by ``KIND``): a ``Site`` carries a
reference, a ``Carried`` an image the client inlined itself, a ``Linked`` one the provider fetches
by URL. Each adapter has one finder of them, ``find_slots``; ``refs``, ``inlined`` and ``links``
pick one kind.
"""

from __future__ import annotations

import pybase64
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal, Protocol

from .facts import CallFacts, FormatFacts
from ..policy.linked import Unfetched
from ..policy.model import HttpRefs, ImageRef, Outcome, Resolved, StoredImage
from ..policy.profile import Context, Profile, Rejection

Json = Any


class Inline(Protocol):
    """One verified image ready to inline: its media type, and its base64 as a JSON value for a
    data-URL slot or for a bare base64 slot. The default builds strings; the proxy may hand
    pre-encoded forms from its verified-object cache (any value its JSON encoder accepts)."""

    @property
    def media_type(self) -> str: ...
    def data_url(self) -> Json: ...
    def base64(self) -> Json: ...


class PlainInline:
    """Strings computed from the image's bytes (once per image)."""

    __slots__ = ("media_type", "_b64")

    def __init__(self, image: StoredImage) -> None:
        self.media_type = image.media_type
        self._b64 = pybase64.b64encode(image.data).decode("ascii")

    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{self._b64}"

    def base64(self) -> str:
        return self._b64


Inliner = Callable[[StoredImage], Inline]
ImagePart = Callable[[dict[str, Any], Inline], dict[str, Any]]
TextPart = Callable[[dict[str, Any], str], dict[str, Any]]


Host = tuple[list[Json], int]


@dataclass(frozen=True, slots=True)
class Site:
    """One image slot: ``parent[index]`` (a list index or a dict key) is the part that carries
    ``ref``. ``host`` is set when the slot is nested inside an element of an enclosing list (that
    list and the element's index), for formats whose nested slots cannot hold text."""

    KIND: ClassVar[Literal["referenced"]] = "referenced"
    parent: Any
    index: int | str
    ref: ImageRef
    host: Host | None = None


@dataclass(frozen=True, slots=True)
class Carried:
    """An image the client inlined itself: ``parent[index]`` is its part (where a placeholder
    goes, as for a ``Site``), ``value`` the JSON string in the body that carries its bytes (a
    ``data:`` URL or bare base64; ``holder[key]``), ``data`` their base64. Its identity (the
    sha256 of the decoded bytes) is the proxy's to compute. ``declared`` is the media type the
    client labelled it with (None: it said none)."""

    KIND: ClassVar[Literal["inlined"]] = "inlined"
    parent: Any
    index: int | str
    holder: Any
    key: str
    value: str
    data: str
    host: Host | None = None
    declared: str | None = None

    def site(self, ref: ImageRef) -> Site:
        """This part as a ``Site`` carrying ``ref`` (its identity), for ``render``."""
        return Site(self.parent, self.index, ref, self.host)


@dataclass(frozen=True, slots=True)
class Linked:
    """An image the provider fetches itself: ``parent[index]`` is its part (where a placeholder
    goes, as for a ``Site``), ``url`` the ``http(s)`` URL the part names. Its identity
    (``policy.linked.url_id``) is the proxy's to compute."""

    KIND: ClassVar[Literal["linked"]] = "linked"
    parent: Any
    index: int | str
    url: str
    host: Host | None = None

    def site(self, ref: ImageRef) -> Site:
        """This part as a ``Site`` carrying ``ref`` (its identity), for ``render``."""
        return Site(self.parent, self.index, ref, self.host)


#: One image slot of a body, of any kind.
Slot = Site | Carried | Linked


def refs(slots: Sequence[Slot]) -> list[Site]:
    """The slots that carry a reference, in document order."""
    return [slot for slot in slots if isinstance(slot, Site)]


def inlined(slots: Sequence[Slot]) -> list[Carried]:
    """The slots that carry an image the client inlined itself, in document order."""
    return [slot for slot in slots if isinstance(slot, Carried)]


def links(slots: Sequence[Slot]) -> list[Linked]:
    """The slots that carry an image the provider fetches by URL, in document order."""
    return [slot for slot in slots if isinstance(slot, Linked)]


#: What opens the base64 of a ``data:`` URL, after its media type.
_DATA_URL: Final = re.compile(r"data:([\w.+-]+/[\w.+-]+)?(?:;[\w-]+=[^;,]*)*;base64,", re.ASCII)


def data_url_base64(url: str) -> str | None:
    """The base64 of a ``data:...;base64,`` URL, or None for any other string."""
    if not url.startswith("data:"):
        return None
    found = _DATA_URL.match(url, 0, 256)
    return url[found.end():] if found is not None else None


def data_url_type(url: str) -> str | None:
    """The media type a ``data:`` URL names (``data:image/png;base64,...``), or None."""
    found = _DATA_URL.match(url, 0, 256) if url.startswith("data:") else None
    return found[1] if found is not None else None


class WireFormat(Protocol):
    """What every adapter module provides (modules satisfy this Protocol structurally): its facts
    as data (``facts``) and the functions that read and write its bodies."""

    @property
    def NAME(self) -> str: ...
    @property
    def FORMAT(self) -> str: ...
    @property
    def AUTH_HEADERS(self) -> tuple[str, ...]: ...
    @property
    def AUTH_QUERY(self) -> tuple[str, ...]: ...
    @property
    def PATHS(self) -> re.Pattern[str]: ...
    @property
    def INLINE_MARKERS(self) -> tuple[bytes, ...]: ...
    @property
    def URL_MARKERS(self) -> tuple[bytes, ...]: ...
    @property
    def VOLATILE(self) -> frozenset[str]: ...
    @property
    def PROFILE(self) -> Profile: ...
    @property
    def FACTS(self) -> FormatFacts: ...
    @property
    def CALLS(self) -> CallFacts: ...

    def find_slots(self, body: Json, http: HttpRefs = ...) -> list[Slot]: ...
    def session_hint(self, body: Json) -> tuple[str, str] | None: ...
    def opening(self, body: Json) -> Json: ...
    def messages(self, body: Json) -> Json: ...
    def system(self, body: Json) -> Json: ...
    def render(self, sites: list[Site], outcomes: tuple[Outcome, ...], inline: Inliner = ...) -> None: ...
    def error_body(self, code: str, message: str, status: int) -> dict[str, Any]: ...
    def sign(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
             credential: str) -> dict[str, str]: ...
    def usage(self, doc: Json) -> dict[str, Any] | None: ...
    def rejection(self, status: int, doc: Json) -> Rejection | None: ...
    def count_images(self, body: Json, http: HttpRefs = ...) -> int: ...


class FilesFormat(Protocol):
    """A format with a Files API of its own (OpenAI, Anthropic): the shapes its SDK parses."""

    def file_object(self, file_id: str, filename: str, media_type: str, size: int, created_at: int
                    ) -> dict[str, Any]: ...
    def file_deleted(self, file_id: str) -> dict[str, Any]: ...


def inliner(inline: Inliner) -> Inliner:
    """``inline`` memoized per image id, for one render."""
    made: dict[str, Inline] = {}

    def get(image: StoredImage) -> Inline:
        found = made.get(image.id)
        if found is None:
            found = made[image.id] = inline(image)
        return found

    return get


def patch(
    sites: Sequence[Site],
    outcomes: Sequence[Outcome],
    image_part: ImagePart,
    text_part: TextPart,
    inline: Inliner = PlainInline,
) -> None:
    """Replace each site's part with the rendered image or placeholder text, in place.

    ``image_part(part, inline)`` and ``text_part(part, text)`` build the provider's shapes.
    """
    if len(sites) != len(outcomes):
        raise ValueError("one outcome per site")
    get = inliner(inline)
    for site, outcome in zip(sites, outcomes):
        part = site.parent[site.index]
        if isinstance(outcome, Resolved):
            site.parent[site.index] = image_part(part, get(outcome.image))
        else:
            site.parent[site.index] = text_part(part, outcome.text)


def insert_after(placements: Sequence[tuple[Host, Json]]) -> None:
    """Insert each element right after its host element; several after one host keep their
    order. Indexes stay valid because hosts are processed from the back of each list."""
    lists: dict[int, tuple[list[Json], dict[int, list[Json]]]] = {}
    for (host_list, host_index), element in placements:
        lists.setdefault(id(host_list), (host_list, {}))[1].setdefault(host_index, []).append(element)
    for host_list, after in lists.values():
        for host_index in sorted(after, reverse=True):
            host_list[host_index + 1:host_index + 1] = after[host_index]


#: The tags of the blocks clients put in a conversation for their own bookkeeping, not the user's
#: words, and rewrite between turns: Claude Code's and Qwen Code's ``<system-reminder>`` (today's
#: date, the tools at hand), Gemini CLI's ``<session_context>`` (today's date, the folder tree,
#: its memory: a resumed conversation gets a new one).
BOOKKEEPING: Final = ("system-reminder", "session_context")
#: Keys of a content part that say nothing of its meaning (its kind, a prompt-cache mark).
_PART_KEYS: Final = frozenset({"type", "text", "cache_control"})


def bookkeeping(node: Json) -> bool:
    """Whether ``node`` is a content part that is one bookkeeping block (``BOOKKEEPING``) and
    nothing else. A part that holds words around the block, two blocks, or keys beyond its kind
    and text is the conversation's; so is a bare string (a system prompt, an input)."""
    if not isinstance(node, dict) or not node.keys() <= _PART_KEYS:
        return False
    return _one_block(node.get("text"))


def _one_block(value: Json) -> bool:
    """Whether ``value`` is a string that is one bookkeeping block, whitespace around it aside."""
    if not isinstance(value, str):
        return False
    text: str = value.strip()
    for tag in BOOKKEEPING:
        start, end = f"<{tag}>", f"</{tag}>"
        if text.startswith(start) and text.endswith(end):
            return text.count(start) == 1 and text.count(end) == 1
    return False


#: Keys of a message that say nothing but who sent it and what it holds.
_MESSAGE_KEYS: Final = frozenset({"role", "content", "parts", "type"})


def _role(message: dict[str, Json], untagged: str | None) -> Json:
    """A message's role; a blank or missing one is ``untagged`` (Gemini: the user's)."""
    return message.get("role") or untagged


def _bookkeeping_alone(message: Json, first: str, untagged: str | None) -> bool:
    """Whether ``message`` is a message of role ``first`` that holds bookkeeping and nothing else:
    no key beyond its role and content, and a content (``content``, Gemini's ``parts``) of
    bookkeeping parts only, or one bookkeeping block as a string. Any other message (a system
    prompt, a tool call, a named author) is the conversation's."""
    if not isinstance(message, dict) or not message.keys() <= _MESSAGE_KEYS or _role(message, untagged) != first:
        return False
    content = message.get("content", message.get("parts"))
    if isinstance(content, list):
        return bool(content) and all(bookkeeping(part) for part in content)
    return _one_block(content)


def opening_messages(messages: Json, first: str = "user", *, untagged: str | None = None) -> list[Json] | None:
    """The messages of a conversation up to and including the first one of role ``first`` that
    holds more than bookkeeping (system prompts before it), the user messages of bookkeeping
    alone left out (``_bookkeeping_alone``): what every later turn re-sends, whether or not the
    client still sends its bookkeeping. A message without a role, or a blank one, has role
    ``untagged`` (Gemini: a content's role defaults to the user). None without one."""
    if not isinstance(messages, list):
        return None
    opening = []
    for message in messages:
        if _bookkeeping_alone(message, first, untagged):
            continue
        opening.append(message)
        if isinstance(message, dict) and _role(message, untagged) == first:
            return opening
    return None


def opening_message(messages: Json, *, untagged: str | None = None) -> Json:
    """The opening of the formats whose opening was always their first message (Anthropic,
    Gemini): that message; when it is a user message of bookkeeping alone (Gemini CLI's
    ``<session_context>``), ``opening_messages`` instead. A body that does not open with
    bookkeeping keeps the value its derived session was always named by."""
    if not isinstance(messages, list) or not messages:
        return None
    if not _bookkeeping_alone(messages[0], "user", untagged):
        return messages[0]
    return opening_messages(messages, untagged=untagged)


def listed(body: Json, key: str) -> list[Json] | None:
    """``body[key]`` when ``body`` is an object and that member a list (a conversation's
    messages, contents or input items), else None."""
    found = body.get(key) if isinstance(body, dict) else None
    return found if isinstance(found, list) else None


def content_lists(messages: Json) -> list[list[Json]]:
    """The list-valued ``content`` of every message (string content carries no images)."""
    if not isinstance(messages, list):
        return []
    return [m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)]


#: One image-rejection answer a provider is known to give: a regular expression searched in its
#: error message, and the public report or page where that answer was seen.
Known = tuple[str, str]


#: How much of a provider's error message the patterns read: the known answers name their part
#: and their cause near the start, and a bound keeps a hostile upstream's megabyte message cheap.
SCAN_CHARS: Final = 4096


def known_pattern(known: Sequence[Known]) -> re.Pattern[str]:
    """One case-insensitive pattern that finds any of ``known`` in a message."""
    return re.compile("|".join(f"(?:{pattern})" for pattern, _ in known), re.IGNORECASE)


#: One "could not fetch the image" answer a provider is known to give for an image it fetches by
#: URL: a regular expression searched in its error message, what it says of the URL, and the
#: public report or page where that answer was seen.
KnownFetch = tuple[str, Unfetched, str]


class FetchAnswers:
    """A provider's known "could not fetch" answers (``KnownFetch``), searched as one
    case-insensitive pattern: ``failure`` names what the first one found says."""

    def __init__(self, known: Sequence[KnownFetch]) -> None:
        self._pattern = re.compile("|".join(f"(?P<k{i}>{pattern})" for i, (pattern, _, _) in enumerate(known)),
                                   re.IGNORECASE)
        self._failures = tuple(failure for _, failure, _ in known)

    def failure(self, message: str, start: int = 0, end: int = SCAN_CHARS) -> Unfetched | None:
        """What the answer in ``message[start:end]`` says of the URL, or None: no known answer."""
        found = self._pattern.search(message, start, end)
        if found is None:
            return None
        index = next(int(name[1:]) for name, value in found.groupdict().items() if value is not None)
        return self._failures[index]


#: One answer a provider is known to give about the context of the images (its many-image rule, a
#: limit smaller than its documented one, a model that takes no images): a regular expression
#: searched in its error message (the named group ``side`` gives pixels, ``bytes`` decoded bytes,
#: ``base64`` bytes of base64 text), the rule, the statuses it comes with, and where it was seen.
KnownContext = tuple[str, Context, frozenset[int], str]


class ContextAnswers:
    """A provider's known answers about the context of the images (``KnownContext``)."""

    def __init__(self, known: Sequence[KnownContext]) -> None:
        self._known = tuple((re.compile(pattern, re.IGNORECASE), rule, statuses) for pattern, rule, statuses, _ in known)

    def read(self, status: int, message: str, start: int = 0, end: int = SCAN_CHARS) -> Rejection | None:
        """The rule the answer in ``message[start:end]`` states (as a ``Rejection`` with its
        ``context``), or None: no known answer."""
        for pattern, rule, statuses in self._known:
            if status not in statuses:
                continue
            found = pattern.search(message, start, end)
            if found is None:
                continue
            numbers = {k: int(v) for k, v in found.groupdict().items() if v is not None and _is_index(v)}
            decoded = numbers.get("bytes", numbers.get("base64", 0) * 3 // 4)
            return Rejection(message, context=rule, side=numbers.get("side", 0), bytes=decoded)
        return None


#: The statuses a model that takes no images is answered with: 400, 422, and also 404 (OpenRouter:
#: no endpoint of the model takes them) or 500 (llama.cpp's server, Ollama).
NO_IMAGES_STATUSES: Final = frozenset({400, 404, 422, 500})


#: Refusals that say what was wrong, and it was not an image: the context window, the output
#: tokens asked for. Leaving images out may well cure them (fewer tokens), so they are never
#: settled by evidence (the client must see them: Claude Code compacts its history on "prompt is
#: too long"), whatever format says them.
NOT_ABOUT_IMAGES: Final[tuple[Known, ...]] = (
    (r"prompt is too long", "https://github.com/anthropics/claude-code/issues/7866"),
    (r"input length and max_tokens exceed context limit", "https://github.com/anymorph-ai/Claudable/issues/3"),
    (r"max_tokens: \d+ > \d+, which is the maximum allowed number of output tokens",
     "https://github.com/anthropics/claude-code/issues/24451"),
    (r"maximum context length is \d+ tokens", "https://github.com/rahul2002m/ChatPDF/issues/6"),
    (r"context_length_exceeded", "https://github.com/rahul2002m/ChatPDF/issues/6"),
    (r"The input token count \(\d+\) exceeds the maximum number of tokens",
     "https://github.com/google-gemini/gemini-cli/issues/6678"),
    (r"exceeded model token limit", "https://github.com/multica-ai/multica/issues/4130"),
)
_NOT_ABOUT_IMAGES: Final = re.compile("|".join(f"(?:{p})" for p, _ in NOT_ABOUT_IMAGES), re.IGNORECASE)


def about_something_else(doc: Json) -> bool:
    """Whether an error answer says a cause that is no image (``NOT_ABOUT_IMAGES``), in its message,
    its code, or its text, in the first ``SCAN_CHARS`` of each."""
    error = error_object(doc)
    texts = [doc] if isinstance(doc, str) else []
    if error is not None:
        texts += [value for key in ("message", "code", "type") if isinstance(value := error.get(key), str)]
    elif isinstance(doc, dict) and isinstance(flat := doc.get("error"), str):
        texts.append(flat)
    return any(_NOT_ABOUT_IMAGES.search(text, 0, SCAN_CHARS) for text in texts)


def error_object(doc: Json) -> dict[str, Any] | None:
    """The ``error`` object of a decoded error body (``{"error": {...}}``); a stream's error may
    come wrapped in a list (Gemini's ``[{"error": {...}}]``)."""
    if isinstance(doc, list) and doc:
        doc = doc[0]
    found = doc.get("error") if isinstance(doc, dict) else None
    return found if isinstance(found, dict) else None


_PATH_SYNTAX = re.compile(r"[A-Za-z_][\w.\[\]]*")


def _is_index(token: str) -> bool:
    """An index ``int()`` reads safely: ASCII digits (``str.isdigit`` also takes ``²``), at most 9."""
    return token.isascii() and token.isdigit() and len(token) <= 9


def part_pointer(path: str, roots: frozenset[str], keys: frozenset[str], tags: frozenset[str] = frozenset()) -> str | None:
    """The JSON pointer of the request part a provider's error path names, or None.

    The path (``messages.11.content.8.image.source.base64.data``,
    ``messages[0].content[1].image_url.url``, ``contents[2].parts[0].inline_data.data``) must
    open with ``root.index`` and go on in ``key.index`` steps (a block-type tag in ``tags`` may sit
    between two steps, as in ``content.0.tool_result.content.1``); the pointer is those steps,
    cut where the path enters the part. A path that names one step only (a message, not a part)
    or goes on into another list after the cut names no part that can be trusted: None."""
    tokens = _path_tokens(path)
    if tokens is None:
        return None
    steps, at = _pointer_steps(tokens, roots, keys, tags)
    if len(steps) < 4 or any(isinstance(t, int) for t in tokens[at:]):
        return None
    return "/" + "/".join(steps)


def _path_tokens(path: str) -> list[str | int] | None:
    """The path's names and indexes in order (``a[0].b`` and ``a.0.b`` alike), or None for a path
    too long, of another syntax, or with an index no body we sent can have."""
    if len(path) > SCAN_CHARS or not _PATH_SYNTAX.fullmatch(path):
        return None
    raw = [t for t in path.replace("[", ".").replace("]", "").split(".") if t]
    if any(t.isdigit() and not _is_index(t) for t in raw):
        return None  # a superscript or an absurd index: no part of any body we sent
    return [int(t) if _is_index(t) else t for t in raw]


def _pointer_steps(tokens: list[str | int], roots: frozenset[str], keys: frozenset[str],
                   tags: frozenset[str]) -> tuple[list[str], int]:
    """The ``key.index`` steps the tokens open with (the first under a root, a tag skipped between
    two), and where they stop."""
    steps: list[str] = []
    at = 0
    while at + 1 < len(tokens):
        key, index = tokens[at], tokens[at + 1]
        if isinstance(key, str) and isinstance(index, int) and key in (keys if steps else roots):
            steps += [key, str(index)]
            at += 2
        elif steps and key in tags and isinstance(index, str) and index in keys:
            at += 1
        else:
            break
    return steps, at
