"""The upstream body of a projecting call: parse, find references, run the policy, render (proxy layer).

A body with no reference (and no image whose placeholder a quarantine asks for: one the client
inlined, one the provider fetches by URL) is sent as the original bytes. Otherwise it is decoded once, only the
image slots are patched, and it is encoded once; the record's view of the call (``describe``)
comes from the same tree. Every decision (reads, quarantines,
placeholders, errors) is made here, before the upstream call, so before the first response byte.
``build`` is shared with replay, so a replayed call is rebuilt by the very code that built it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
import re
from typing import Any, Final, NamedTuple, NoReturn

import msgspec

from ...adapters.base import Carried, Linked, Site, WireFormat
from ...policy.decide import held_urls
from ...policy.errors import AttachmentError, Code, InvalidRequest, PayloadTooLarge
from ...policy.linked import url_id, url_name
from ...policy.model import NO_HTTP, HttpRefs, ImageRef, Inlined, Placeholder, Resolved
from ...policy.projection import Projection
from ..stores.cache import inline as inline_of
from .describe import (
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
    """The images of ``tree`` the provider fetches by URL (``find_urls``), at most
    ``MAX_CLIENT_IMAGES`` of them (the rest go as they came)."""
    return fmt.find_urls(tree, http)[:MAX_CLIENT_IMAGES]


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
    client: list[tuple[Carried, str]] = []
    if identities is not None and read is not None:  # read by the caller already (its session)
        scanned, tree, client = read
    elif identities is not None and may_hold_inline(raw):  # (a scan of megabytes of base64 costs less)
        scanned, tree, client = read_images(fmt, raw, identities)
    else:
        scanned = None
        if read is None and not may_hold_refs(raw) and not (url_images and may_hold_urls(fmt, raw)):
            return Built(raw, None, (of_raw(raw) if shape_unchanged else of_unchanged(raw)) if describe else None)
        if read is None and max_references is not None and raw.count(b"sha256:") > max_references \
                and len(set(_RAW_ID.findall(raw))) > max_references:  # refused before it is decoded
            _too_many(max_references)
        tree = read[1] if read is not None else decode_json(raw)
    sites = _refs(fmt, tree, http)
    links = fetched(fmt, tree, http) if url_images else []
    if not sites and not client and not links:
        return Built(raw, None, (of_decoded(raw, tree) if shape_unchanged else of_unchanged(raw))
                     if describe else None, tree)
    if max_references is not None and len({site.ref.id for site in sites}) > max_references:
        _too_many(max_references)
    complete = scanned if scanned is not None and scanned.complete else None
    payload = _payload_of(raw, complete, client)
    inline = fit.inlined(client, identities, payload, complete, raw) if identities is not None else []
    images = _image_count(fmt, tree, http, sites, bool(inline))
    projection = await run(Asked([site.ref for site in sites], images, inline, tree, fit.loader(payload), len(raw)))
    _check_projected(projection, max_projected_bytes)
    held = projection.inline or tuple(None for _ in client)
    link_refs = [ImageRef(url_id(link.url), url_name(link.url)) for link in links]
    held_links = held_urls(link_refs, projection.state, fmt.FORMAT, projection.vision)
    sent = tuple(aid for (_, aid), outcome in zip(client, held) if not isinstance(outcome, Placeholder))
    forms = {image.id: image.form for image, outcome in zip(inline, held) if outcome is None and image.form}
    # the inbound digest, without hashing the base64 the client sends again every turn
    inbound = digest_of(raw, scanned, client) if describe else None
    if not sites and all(o is None for o in held) and all(h is None for h in held_links):  # all as they came
        records = client_records(site_paths(tree, [f.site(ImageRef(a)) for f, a in client]) if describe else [],
                                 client, held)
        described = (of_decoded(raw, tree, records, inbound) if shape_unchanged else
                     of_unchanged(raw, records, inbound)) if describe else None
        kept_values: dict[int, tuple[Any, str]] = {id(found.value): (found.value, aid) for found, aid in client}
        return Built(raw, projection, described, tree, kept_values, sent, payload=payload,
                     urls=_urls(links, link_refs, held_links), total=images, forms=forms)
    if complete is not None:  # to change: the whole body, with its base64
        tree = decode_json(raw)
        client = identified(fmt, tree, identities.of) if identities is not None else []
        sites = fmt.find_refs(tree, http)
        links = fmt.find_urls(tree, http)[:MAX_CLIENT_IMAGES] if url_images else []  # as ``fetched``
        link_refs = [ImageRef(url_id(link.url), url_name(link.url)) for link in links]
    client_sites = [found.site(ImageRef(aid)) for found, aid in client]
    link_sites = [link.site(ref) for link, ref in zip(links, link_refs)]
    # before rendering moves anything
    paths = site_paths(tree, [*sites, *client_sites, *link_sites]) if describe else []
    records = (ref_records(sites, paths, projection.outcomes) + client_records(paths[len(sites):], client, held)
               + link_records(paths[len(sites) + len(client_sites):], link_sites, held_links))
    # replay must find the same references: the record keeps the public URLs that made some of them
    via_http = describe and bool(sites) and bool(http.bases) and len(fmt.find_refs(tree)) != len(sites)
    seen: dict[int, tuple[Any, str]] = {}
    for (found, aid), outcome in zip(client, held):
        if outcome is None:  # sent as it came; recorded as its identity
            kept = found.holder[found.key] = ClientImage(found.value, aid)
            seen[id(kept)] = (kept, aid)
    # a variant stands for its original: rejections and records speak of the reference's id
    origin = {id(o.image): site.ref.id for site, o in zip(sites, projection.outcomes) if isinstance(o, Resolved)}
    client_outcomes, respelled = fit.client_outcomes(client, held, inline, origin)
    changed = [*sites, *(site for site, outcome in zip(client_sites, held) if outcome is not None),
               *(site for site, outcome in zip(link_sites, held_links) if outcome is not None)]
    outcomes = (*projection.outcomes, *client_outcomes, *(outcome for outcome in held_links if outcome is not None))
    before = fmt.count_images(tree, http)
    fmt.render(changed, outcomes, lambda image: _Tracked(respelled.get(id(image)) or inline_of(image),
                                                         origin.get(id(image), image.id), seen))
    # a placeholder takes its image part away, unless the slot must hold an image (a blank one)
    blanks = fmt.count_images(tree, http) - before + sum(isinstance(o, Placeholder) for o in outcomes)
    described = of_tree(tree, records, http.bases if via_http else (), inbound) if describe else None
    return Built(UPSTREAM.encode(tree), projection, described, tree, seen, sent,
                 sum(isinstance(o, Placeholder) for o in held), payload, blanks,
                 _urls(links, link_refs, held_links), images, forms)


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


def _refs(fmt: WireFormat, tree: Any, http: HttpRefs) -> list[Site]:
    """``fmt.find_refs``; a malformed reference's error names its place in the body too."""
    try:
        return fmt.find_refs(tree, http)
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
                lambda f, tree: f.find_inline(tree)[:MAX_CLIENT_IMAGES])


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
    for carried_image in fmt.find_inline(decoded)[:MAX_CLIENT_IMAGES]:
        aid = identify(carried_image.data)
        if aid is not None:
            found.append((carried_image, aid))
    return found
