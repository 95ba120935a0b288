"""The upstream body of a projecting call: read it, find its image slots, run the policy, render
(proxy layer, call sublayer; the body the ``prepare`` stage sends).

A body with no reference (and no image whose placeholder a quarantine asks for: one the client
inlined, one the provider fetches by URL) is sent as the original bytes. Otherwise its image
slots are found once (the adapter's ``find_slots``: a reference, an image the client inlined, one
the provider fetches), the policy gives each an outcome, only the slots that change are patched,
and it is encoded once; the record's view of the call (``describe``) comes from the same tree. Every decision (reads, quarantines,
placeholders, errors) is made here, before the upstream call, so before the first response byte.
``build`` is shared with replay, so a replayed call is rebuilt by the very code that built it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
import re
from typing import Any, Final, NamedTuple, NoReturn

import msgspec

from ...adapters.base import Carried, Linked, Site, Slot, WireFormat
from ...adapters.base import inlined as inlined_of, links as links_of, refs as refs_of
from ...policy.errors import AttachmentError, Code, InvalidRequest, PayloadTooLarge
from ...policy.linked import url_id, url_name
from ...policy.model import NO_HTTP, HttpRefs, ImageRef, Inlined, Outcome, Placeholder, Resolved
from ...policy.projection import Projection
from ..stores.cache import inline as inline_of
from .describe import (
    UNHASHED,
    UPSTREAM,
    Described,
    client_records,
    link_records,
    of_decoded,
    of_raw,
    of_unchanged,
    of_tree,
    ref_records,
    sha256_id,
    located,
    site_paths,
    spliced_id,
)
from ..upstream.identity import Identities
from . import fit
from .scan import Scanned, scan

_decoder: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()
#: A reference's id as it appears unescaped in raw JSON (the cheap count before decoding).
_RAW_ID: Final = re.compile(rb"sha256:[0-9a-f]{64}")

class Asked(NamedTuple):
    """What the policy is asked of one body: its references, how many images it holds in all
    (what a many-image rule counts), the images its client inlined itself (aligned with the
    body's), its decoded tree (the model it names) and ``load``: the decoded bytes of one of the
    client's images by its identity (what the policy reads to vary it)."""

    refs: list[ImageRef]
    images: int
    inline: list[Inlined]
    tree: Any
    load: Callable[[str], bytes | None]
    #: The body's size as the client sent it (what a limit of bytes per request counts).
    size: int = 0
    #: The images the provider fetches by URL, each as its identity (``policy.linked.url_id``).
    links: Sequence[ImageRef] = ()


#: Runs the policy on what a body asks.
Projector = Callable[[Asked], Awaitable[Projection]]
#: The most images the client inlined in one body that get an identity; the rest go as they came.
MAX_CLIENT_IMAGES: Final = 1000


class Built(NamedTuple):
    """An upstream body and what produced it (``projection`` is None when nothing was decoded);
    ``described`` is the record's view of it, when asked for; ``tree`` is the rendered body and
    ``inlined`` the image values in it, by object id (see ``carried``): spliced in by the proxy,
    or the client's own; ``client`` the ids of the client's own images sent as they came, ``held``
    how many of its own became placeholders. ``client`` holds the ids of the client's images that
    went as images (as they came, respelled, or as their variant)."""

    body: bytes
    projection: Projection | None
    described: Described | None = None
    tree: Any = None
    inlined: dict[int, tuple[Any, str]] | None = None
    client: tuple[str, ...] = ()
    held: int = 0
    #: The base64 of one of the client's own images, by identity (admitted when one is refused):
    #: looked up only then, never on the way out.
    payload: Callable[[str], Any] | None = None
    #: Image parts the proxy filled with a blank image of its own (a screenshot's placeholder).
    blanks: int = 0
    #: The URL strings of the images the provider fetches that went upstream as URLs, by object
    #: id: (the string, the URL's identity) (see ``linked``).
    urls: dict[int, tuple[str, str]] | None = None
    #: How many images the body holds in all (what a many-image rule counted).
    total: int = 0
    #: The form of each client image sent as it came in a spelling of its own (``Inlined.form``),
    #: by identity: a refusal of it holds for that form only.
    forms: dict[str, str] | None = None

    @property
    def images(self) -> bool:
        """Whether the upstream body carries an image with an identity (one the proxy inlined, one
        the client inlined itself, one the provider fetches by URL): what a refusal can be
        attributed to."""
        return bool(self.client) or bool(self.urls) or (
            self.projection is not None and any(isinstance(o, Resolved) for o in self.projection.outcomes))


class _Tracked:
    """An image's ``Inline`` that remembers each value it hands an adapter, with the image's id,
    so the rendered tree can say where every inlined image went (``carried``)."""

    __slots__ = ("_inner", "_id", "_seen", "media_type")

    def __init__(self, inner: Any, attachment_id: str, seen: dict[int, tuple[Any, str]]) -> None:
        self._inner = inner
        self._id = attachment_id
        self._seen = seen
        self.media_type: str = inner.media_type

    def _note(self, value: Any) -> Any:
        self._seen[id(value)] = (value, self._id)  # the value is kept alive, so its id stays its own
        return value

    def data_url(self) -> Any:
        return self._note(self._inner.data_url())

    def base64(self) -> Any:
        return self._note(self._inner.base64())


def foreign(fmt: WireFormat, built: Built) -> int:
    """How many images of ``built``'s upstream body have no identity (http(s) URLs the provider
    fetches, provider file ids, base64 that does not decode): every image part but the ones
    projected, the client's own the proxy identified and the blanks the proxy put in screenshot
    slots for their placeholders."""
    if built.tree is None or built.projection is None:
        return 0
    resolved = sum(isinstance(o, Resolved) for o in built.projection.outcomes)
    return fmt.count_images(built.tree) - resolved - len(built.client) - built.blanks


def carried(built: Built) -> list[tuple[str, str]]:
    """Every image inlined in ``built``'s upstream body: (JSON pointer of its value, the id of
    the image it carries), in document order. Walks the tree: for the rare answer that refuses an
    image, never on the way out."""
    if built.tree is None or not built.inlined:
        return []
    return [(path, aid) for path, _, aid in _values(built.tree, built.inlined)]


def linked(built: Built) -> list[tuple[str, str, str]]:
    """Every image of ``built``'s upstream body that went as a URL for the provider to fetch:
    (JSON pointer of its URL string, the URL's identity, the URL), in document order. Walks the
    tree, as ``carried``: only for an answer that could not fetch one."""
    if built.tree is None or not built.urls:
        return []
    return [(path, aid, url) for path, url, aid in _values(built.tree, built.urls)]


def _values(tree: Any, wanted: dict[int, tuple[Any, str]]) -> list[tuple[str, Any, str]]:
    """The leaves of ``tree`` that ``wanted`` holds (by object id: the value itself, and its id):
    (JSON pointer, the value, its id), in document order."""
    found: list[tuple[str, Any, str]] = []
    stack: list[tuple[Any, str]] = [(tree, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            items: Any = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            hit = wanted.get(id(node))
            if hit is not None and hit[0] is node:
                found.append((path, node, hit[1]))
            continue
        children = [(value, f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}") for key, value in items]
        stack += reversed(children)
    return found


def may_hold_inline(raw: bytes) -> bool:
    """Cheap pre-check on raw bytes: an image the client inlined is base64 (a ``data:...;base64,``
    URL, or a ``base64`` source; Gemini's ``inline_data`` is base64 by definition). A client
    that escapes those words in ``\\u`` form gets no identity for its images: they go as they came."""
    return b"base64" in raw or b"nline" in raw


def may_hold_urls(fmt: WireFormat, raw: bytes) -> bool:
    """Cheap pre-check on raw bytes: an image the provider fetches by URL sits in a part that
    spells one of the format's ``URL_MARKERS``, and its URL spells ``http`` (one that escapes
    either in ``\\u`` form goes as it came)."""
    # the format's marker first: a text body spells no ``image_url`` but may well say ``http``
    return any(marker in raw for marker in fmt.URL_MARKERS) and (b"http" in raw or b"HTTP" in raw)


def fetched(fmt: WireFormat, tree: Any, http: HttpRefs = NO_HTTP) -> list[Linked]:
    """The images of ``tree`` the provider fetches by URL, at most ``MAX_CLIENT_IMAGES`` of them
    (the rest go as they came)."""
    return links_of(_slots(fmt, tree, http))[:MAX_CLIENT_IMAGES]


def may_hold_refs(raw: bytes) -> bool:
    """Cheap pre-check on raw bytes: every reference spells ``sha256:`` (and a malformed one
    ``attachment:``: the client's error) unless JSON-escaped, and a body with any ``\\u`` escape
    is decoded to be sure."""
    return b"sha256:" in raw or b"attachment:" in raw or (b"\\" in raw and b"\\u" in raw)


def _too_many(limit: int) -> NoReturn:
    raise InvalidRequest(f"more than {limit} distinct attachment references in one request", code=Code.TOO_MANY_REFERENCES)


def decode_json(raw: bytes) -> Any:
    """A client's JSON body; anything that is not JSON (nested past the parser's depth too) is
    the client's error."""
    try:
        return _decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest("request body is not valid JSON", code=Code.INVALID_JSON) from None


async def build(fmt: WireFormat, raw: bytes, run: Projector, *, describe: bool = False, shape_unchanged: bool = True,
                max_references: int | None = None, max_projected_bytes: int | None = None,
                http: HttpRefs = NO_HTTP, identities: Identities | None = None, read: Read | None = None,
                url_images: bool = False) -> Built:
    """The upstream body for ``raw``: the original bytes when nothing is to change, else projected.

    ``http`` names the http(s) URLs that are references too (this proxy's public URLs; every
    HTTP reference spells ``sha256:``, so the raw pre-check still finds it). With ``identities``,
    the images the client inlined itself get their identity (the sha256 of their bytes) and what
    their bytes are (``Inlined``); the policy says what each becomes (as it came, respelled, its
    variant, its placeholder). Such a body is first scanned (``read_images``: its structure
    without its base64; ``read``: by the caller already, for its session); it is decoded whole
    only when something in it is to change, and a body without images at most once. With
    ``url_images``, the images the provider fetches by URL (``fetched``) get the identity of
    their URL (``policy.linked.url_id``): each one a quarantine holds for becomes its
    placeholder, the others go as they came. With ``describe`` the record's view (digest,
    reference paths and outcomes, the client's images, shape, and the public URLs when an HTTP
    reference was among them) comes from the same tree. A body sent unchanged gets a shape only
    with ``shape_unchanged`` (replay); the request path records none (``describe.of_unchanged``).
    More than ``max_references`` distinct references is the client's error, refused before
    anything is read; so is a body whose inlined images would pass ``max_projected_bytes`` (one
    image referenced a thousand times is a thousand copies), refused before it is built."""
    asked = _Options(describe, shape_unchanged, max_references, http, identities, url_images)
    body = _read(fmt, raw, asked, read)
    if body is None:  # nothing in it can change
        return Built(raw, None, _unchanged(raw, None, asked))
    found = _find(fmt, body.tree, http, body.client, url_images)
    if not found.sites and not found.client and not found.links:
        return Built(raw, None, _unchanged(raw, body.tree, asked), body.tree)
    if max_references is not None and len({site.ref.id for site in found.sites}) > max_references:
        _too_many(max_references)
    decided = await _ask(fmt, raw, body, found, run, asked, max_projected_bytes)
    # the inbound digest, without hashing the base64 the client sends again every turn
    inbound = digest_of(raw, body.scanned, body.client) if describe else None
    if not found.sites and decided.unchanged:  # every image as it came
        return _as_they_came(raw, body.tree, found, decided, asked, inbound)
    tree = body.tree
    if body.complete:  # to change: the whole body, with its base64
        tree = decode_json(raw)
        found = _find(fmt, tree, http, identified(fmt, tree, identities.of) if identities is not None else [],
                      url_images)
    return _rendered(fmt, raw, tree, found, decided, asked, inbound)


class _Options(NamedTuple):
    """How ``build`` was asked to build (its keyword arguments, but the projected bytes' limit)."""

    describe: bool
    shape_unchanged: bool
    max_references: int | None
    http: HttpRefs
    identities: Identities | None
    url_images: bool


class _Body(NamedTuple):
    """A body as ``build`` reads it: its scan (None: not scanned), its structure (the scan's small
    document, or the whole body decoded) and the client's own images with their identities."""

    scanned: Scanned | None
    tree: Any
    client: list[tuple[Carried, str]]

    @property
    def complete(self) -> bool:
        """Whether the scan accounts for every run of base64 (``tree`` is its small document)."""
        return self.scanned is not None and self.scanned.complete


class _Found(NamedTuple):
    """A body's image slots by kind, in document order: the references, the client's own images
    with their identities, and the images the provider fetches with theirs (``link_refs``)."""

    sites: list[Site]
    client: list[tuple[Carried, str]]
    links: list[Linked]
    link_refs: list[ImageRef]


class _Decided(NamedTuple):
    """What the policy made of every slot: ``projection`` (the references' outcomes), ``held``
    (each client image's: None, as it came), ``held_links`` (each linked image's: None, as it
    came); ``sent`` the ids of the client images that go as images, ``forms`` the spelling of each
    sent as it came (``Built.forms``)."""

    projection: Projection
    inline: list[Inlined]
    held: tuple[Any, ...]
    held_links: tuple[Placeholder | None, ...]
    sent: tuple[str, ...]
    forms: dict[str, str]
    #: The base64 of one of the client's images by identity (``Built.payload``).
    payload: Callable[[str], Any]
    #: How many images the body holds in all (``Built.total``).
    images: int

    @property
    def unchanged(self) -> bool:
        """Whether every client image and every linked image goes as it came."""
        return all(o is None for o in self.held) and all(h is None for h in self.held_links)


def _unchanged(raw: bytes, tree: Any, asked: _Options) -> Described | None:
    """The record's view of a body sent as the original bytes (a shape only for replay)."""
    if not asked.describe:
        return None
    if not asked.shape_unchanged:  # the request path: the recorder's writer takes the digest
        return UNHASHED
    return of_raw(raw) if tree is None else of_decoded(raw, tree)


def _read(fmt: WireFormat, raw: bytes, asked: _Options, read: Read | None) -> _Body | None:
    """``raw`` read for its images: scanned when it may carry the client's own (or as the caller
    read it already, for its session), else decoded; None when the raw pre-checks find nothing
    that could change. More distinct references than allowed is refused before decoding."""
    if asked.identities is not None and read is not None:  # read by the caller already (its session)
        return _Body(*read)
    if asked.identities is not None and may_hold_inline(raw):  # (a scan of megabytes of base64 costs less)
        return _Body(*read_images(fmt, raw, asked.identities))
    if read is not None:
        return _Body(None, read[1], [])
    if not may_hold_refs(raw) and not (asked.url_images and may_hold_urls(fmt, raw)):
        return None
    limit = asked.max_references
    if limit is not None and raw.count(b"sha256:") > limit and len(set(_RAW_ID.findall(raw))) > limit:
        _too_many(limit)
    return _Body(None, decode_json(raw), [])


def _find(fmt: WireFormat, tree: Any, http: HttpRefs, client: list[tuple[Carried, str]], url_images: bool) -> _Found:
    """The image slots of ``tree`` (``fmt.find_slots``, once): its references, ``client`` (the
    client's images as the scan or ``identified`` found them) and, with ``url_images``, the images
    the provider fetches, at most ``MAX_CLIENT_IMAGES`` of them (the rest go as they came)."""
    slots = _slots(fmt, tree, http)
    fetched_here = links_of(slots)[:MAX_CLIENT_IMAGES] if url_images else []  # as ``fetched``
    return _Found(refs_of(slots), client, fetched_here,
                  [ImageRef(url_id(link.url), url_name(link.url)) for link in fetched_here])


async def _ask(fmt: WireFormat, raw: bytes, body: _Body, found: _Found, run: Projector, asked: _Options,
               max_projected_bytes: int | None) -> _Decided:
    """Runs the policy on ``found`` (``run``): what each slot becomes."""
    complete = body.scanned if body.complete else None
    payload = _payload_of(raw, complete, found.client)
    identities = asked.identities
    inline = fit.inlined(found.client, identities, payload, complete, raw) if identities is not None else []
    images = _image_count(fmt, body.tree, asked.http, found.sites, bool(inline))
    projection = await run(Asked([site.ref for site in found.sites], images, inline, body.tree, fit.loader(payload),
                                 len(raw), found.link_refs))
    _check_projected(projection, max_projected_bytes)
    return _decide(found, projection, inline, payload, images)


def _decide(found: _Found, projection: Projection, inline: list[Inlined],
            payload: Callable[[str], Any], images: int) -> _Decided:
    """Each slot's outcome, as the projection gives one for every slot (None: as it came)."""
    held = projection.inline or tuple(None for _ in found.client)
    held_links = projection.links or tuple(None for _ in found.links)
    sent = tuple(aid for (_, aid), outcome in zip(found.client, held) if not isinstance(outcome, Placeholder))
    forms = {image.id: image.form for image, outcome in zip(inline, held) if outcome is None and image.form}
    return _Decided(projection, inline, held, held_links, sent, forms, payload, images)


def _records(tree: Any, found: _Found, decided: _Decided) -> tuple[Any, ...]:
    """The record of each slot, at its JSON pointer in ``tree`` as the client sent it (before
    rendering moves anything): references, then the client's images, then linked images."""
    client_sites = [carried_image.site(ImageRef(aid)) for carried_image, aid in found.client]
    link_sites = [link.site(ref) for link, ref in zip(found.links, found.link_refs)]
    paths = site_paths(tree, [*found.sites, *client_sites, *link_sites])
    after_refs, after_client = len(found.sites), len(found.sites) + len(client_sites)
    return (ref_records(found.sites, paths, decided.projection.outcomes)
            + client_records(paths[after_refs:], found.client, decided.held)
            + link_records(paths[after_client:], link_sites, decided.held_links))


def _as_they_came(raw: bytes, tree: Any, found: _Found, decided: _Decided, asked: _Options,
                  inbound: str | None) -> Built:
    """A body with no reference whose images all go as they came: the original bytes."""
    described = None
    if asked.describe:
        records = _records(tree, found, decided)
        described = (of_decoded(raw, tree, records, inbound) if asked.shape_unchanged else
                     of_unchanged(raw, records, inbound))
    kept_values: dict[int, tuple[Any, str]] = {id(found_image.value): (found_image.value, aid)
                                               for found_image, aid in found.client}
    return Built(raw, decided.projection, described, tree, kept_values, decided.sent, payload=decided.payload,
                 urls=_urls(found.links, found.link_refs, decided.held_links), total=decided.images,
                 forms=decided.forms)


def _rendered(fmt: WireFormat, raw: bytes, tree: Any, found: _Found, decided: _Decided, asked: _Options,
              inbound: str | None) -> Built:
    """``tree`` with every slot that changes rendered (its image, its variant, its placeholder),
    encoded once; the client's images sent as they came are kept as their JSON strings."""
    http = asked.http
    records = _records(tree, found, decided) if asked.describe else ()
    # replay must find the same references: the record keeps the public URLs that made some of them
    via_http = asked.describe and bool(found.sites) and bool(http.bases) \
        and len(refs_of(fmt.find_slots(tree))) != len(found.sites)
    seen = _kept(found.client, decided.held)
    # a variant stands for its original: rejections and records speak of the reference's id
    origin = {id(o.image): site.ref.id for site, o in zip(found.sites, decided.projection.outcomes)
              if isinstance(o, Resolved)}
    client_outcomes, respelled = fit.client_outcomes(found.client, decided.held, decided.inline, origin)
    changed, outcomes = _changes(found, decided, client_outcomes)
    before = fmt.count_images(tree, http)
    fmt.render(changed, outcomes, lambda image: _Tracked(respelled.get(id(image)) or inline_of(image),
                                                         origin.get(id(image), image.id), seen))
    # a placeholder takes its image part away, unless the slot must hold an image (a blank one)
    blanks = fmt.count_images(tree, http) - before + sum(isinstance(o, Placeholder) for o in outcomes)
    described = of_tree(tree, records, http.bases if via_http else (), inbound) if asked.describe else None
    return Built(UPSTREAM.encode(tree), decided.projection, described, tree, seen, decided.sent,
                 sum(isinstance(o, Placeholder) for o in decided.held), decided.payload, blanks,
                 _urls(found.links, found.link_refs, decided.held_links), decided.images, decided.forms)


def _kept(client: list[tuple[Carried, str]], held: tuple[Any, ...]) -> dict[int, tuple[Any, str]]:
    """Each client image sent as it came, put back in its holder as a ``ClientImage`` (it goes
    upstream as it came, and is recorded as its identity), by object id."""
    seen: dict[int, tuple[Any, str]] = {}
    for (found_image, aid), outcome in zip(client, held):
        if outcome is None:
            kept = found_image.holder[found_image.key] = ClientImage(found_image.value, aid)
            seen[id(kept)] = (kept, aid)
    return seen


def _changes(found: _Found, decided: _Decided, client_outcomes: list[Outcome]
             ) -> tuple[list[Site], tuple[Outcome, ...]]:
    """The slots that change and the outcome each renders: every reference, the client's images
    and the linked images that do not go as they came."""
    client_sites = [carried_image.site(ImageRef(aid)) for (carried_image, aid), outcome
                    in zip(found.client, decided.held) if outcome is not None]
    link_sites = [link.site(ref) for link, ref, outcome in zip(found.links, found.link_refs, decided.held_links)
                  if outcome is not None]
    link_outcomes = tuple(outcome for outcome in decided.held_links if outcome is not None)
    return [*found.sites, *client_sites, *link_sites], (*decided.projection.outcomes, *client_outcomes,
                                                        *link_outcomes)


def _image_count(fmt: WireFormat, tree: Any, http: HttpRefs, sites: list[Site], inlined: bool) -> int:
    """How many images the body holds in all, the client's own too, what a many-image rule or a
    learnt one counts: a walk, so only when the format has the rule or the client inlined images
    (a rule may be learnt for them); else its references."""
    if fmt.PROFILE.many_images is None and not inlined:
        return len(sites)
    return max(fmt.count_images(tree, http), len(sites))


def _check_projected(projection: Projection, limit: int | None) -> None:
    """The references' inlined images must stay within ``limit`` bytes of base64."""
    if limit is None:
        return
    inlined = sum(4 * -(-o.image.bytes // 3) for o in projection.outcomes if isinstance(o, Resolved))
    if inlined > limit:
        raise PayloadTooLarge(f"the images this request references would inline {inlined} bytes of base64, "
                              f"over max_projected_bytes ({limit})", code=Code.PROJECTED_TOO_LARGE)


def _urls(links: list[Linked], refs: list[ImageRef], held: tuple[Placeholder | None, ...]
          ) -> dict[int, tuple[str, str]]:
    """The URL strings of the images sent as URLs (``Built.urls``)."""
    return {id(link.url): (link.url, ref.id) for link, ref, outcome in zip(links, refs, held) if outcome is None}


def _slots(fmt: WireFormat, tree: Any, http: HttpRefs) -> list[Slot]:
    """``fmt.find_slots``; a malformed reference's error names its place in the body too."""
    try:
        return fmt.find_slots(tree, http)
    except AttachmentError as error:
        if error.value is None:
            raise
        place = next((path for path, value in _strings(tree) if value == error.value), None)
        raise AttachmentError(error.code, f"{error.message} at {place}" if place else error.message,
                              value=error.value) from None


def _strings(tree: Any) -> Iterator[tuple[str, str]]:
    """Every string of ``tree`` with its JSON pointer (for naming the place of a bad value)."""
    stack: list[tuple[Any, str]] = [(tree, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            yield path, node
        elif isinstance(node, dict):
            stack += [(v, f"{path}/{str(k).replace('~', '~0').replace('/', '~1')}") for k, v in node.items()]
        elif isinstance(node, list):
            stack += [(v, f"{path}/{i}") for i, v in enumerate(node)]


def _payload_of(raw: bytes, scanned: Scanned | None, client: list[tuple[Carried, str]]) -> Callable[[str], Any]:
    """The lookup of a client image's base64 by identity: its run in ``raw`` (a complete scan), or
    the decoded string the adapter found."""
    def payload(aid: str) -> Any:
        if scanned is not None:
            return scanned.payload(raw, aid)
        return next((found.data for found, found_id in client if found_id == aid), None)
    return payload


#: A body's client images as ``read_images`` found them: the scan, the tree, the images.
Read = tuple["Scanned | None", Any, list[tuple[Carried, str]]]


def read_images(fmt: WireFormat, raw: bytes, identities: Identities) -> Read:
    """A body that may carry the client's own images: its scan, its structure (the scan's small
    document when the scan accounts for every run, else the whole body decoded) and those images
    with their identities. The one way a body's client images are read (``build``, and the session
    a request derives before it is built)."""
    scanned = scan_body(fmt, raw, identities)
    if scanned is not None and scanned.complete:
        return scanned, scanned.tree, scanned.client
    tree = decode_json(raw)
    return scanned, tree, identified(fmt, tree, identities.of)


def scan_body(fmt: WireFormat, raw: bytes, identities: Identities) -> Scanned | None:
    """``raw``'s client-inlined images found without decoding their base64 (``scan.scan``)."""
    return scan(fmt, raw, identities.of_run, identities.of,
                lambda f, tree: inlined_of(f.find_slots(tree))[:MAX_CLIENT_IMAGES])


def digest_of(raw: bytes, scanned: Scanned | None, client: list[tuple[Carried, str]]) -> str:
    """The digest a record keeps of a body with the client's own images: the sha256 of ``raw``
    with each image's base64 replaced by its identity (``describe.spliced_id``), from the scan's
    runs when it found every one, else by finding each image's base64 in the raw bytes."""
    if scanned is not None and scanned.complete:
        return spliced_id(raw, [(run.start, run.end, run.id) for run in scanned.runs])
    return spliced_id(raw, located(raw, [(found.data, aid) for found, aid in client]))


class ClientImage:
    """An image the client inlined itself, in a rendered tree: its JSON string goes upstream as it
    came (``raw``), and the record's digest takes its identity for it (``digest``), as for a
    ``Splice``: the base64 that comes back every turn is not hashed again."""

    __slots__ = ("value", "id")

    def __init__(self, value: str, attachment_id: str) -> None:
        self.value = value
        self.id = attachment_id

    def raw(self) -> msgspec.Raw:
        return msgspec.Raw(_encoder.encode(self.value))

    def digest(self) -> str:
        return self.id


def inbound_digest(fmt: WireFormat, raw: bytes, identities: Identities) -> str:
    """The digest a record keeps of ``raw`` when the client inlined images in it (``digest_of``,
    taken the way the proxy took it): what replay checks a given inbound body against."""
    try:
        scanned, _, client = read_images(fmt, raw, identities)
    except InvalidRequest:
        return sha256_id(raw)
    return digest_of(raw, scanned, client)


def identified(fmt: WireFormat, decoded: Any, identify: Callable[[str], str | None]) -> list[tuple[Carried, str]]:
    """The images the client inlined in ``decoded`` whose base64 gives an identity (others go as
    they came: the provider judges them), at most ``MAX_CLIENT_IMAGES`` of them."""
    found: list[tuple[Carried, str]] = []
    for carried_image in inlined_of(fmt.find_slots(decoded))[:MAX_CLIENT_IMAGES]:
        aid = identify(carried_image.data)
        if aid is not None:
            found.append((carried_image, aid))
    return found
