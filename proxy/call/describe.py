"""The record's view of an upstream body: its digest, each reference's path and outcome, its shape (proxy layer).

The projected digest is a Merkle form of the upstream bytes: the body with every inlined image
value replaced by the sha256 of that value's exact JSON bytes, then hashed. It changes whenever
any upstream byte would, without hashing megabytes of base64 per request. Both encodings come
from the one decoded and rendered tree: images sit in it as ``Splice`` markers, which the
upstream encoder turns into their base64 and the record encoder into their digests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final, Protocol

import msgspec

from ...adapters.base import Carried, Json, Site
from ...policy.events import RefRecord
from ...policy.model import InlineOutcome, Outcome, Placeholder, Resolved


class Splice(Protocol):
    """An inlined image's JSON value in a rendered tree (see ``stores.cache.Encoded``)."""

    def raw(self) -> msgspec.Raw: ...
    def digest(self) -> str: ...


def _as_raw(value: Splice) -> msgspec.Raw:
    return value.raw()


def _as_digest(value: Splice) -> str:
    return "<" + value.digest() + ">"


#: The upstream bytes of a rendered tree, and the record's view of them.
UPSTREAM: Final = msgspec.json.Encoder(enc_hook=_as_raw)
RECORD: Final = msgspec.json.Encoder(enc_hook=_as_digest)
_decoder: Final = msgspec.json.Decoder()


def sha256_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


#: Opens the framed hash of ``spliced_id``: no plain body's digest is ever one of these.
_SPLICED: Final = b"projectionist spliced body v1\0"


def spliced_id(raw: bytes, runs: Sequence[tuple[int, int, str | None]]) -> str:
    """The digest of a body whose images the client inlined itself: the sha256 of ``raw`` framed
    as its pieces, each stretch of bytes as ``B`` + its length + the bytes, each base64 run
    (``runs``: start, end and the image's identity, in byte order, not overlapping) as ``I`` +
    its identity. It commits to every byte, as ``sha256_id`` of ``raw`` would (an identity
    commits to its bytes; the framing keeps a body that spells an identity in its text from
    hashing like one that carries the image), without hashing megabytes of base64 that come
    back every turn. A run without an identity is hashed as bytes; with no identity at all it is
    ``sha256_id(raw)`` itself (a body without the client's own images is recorded as it always was)."""
    if not any(aid is not None for _, _, aid in runs):
        return sha256_id(raw)
    digest = hashlib.sha256(_SPLICED)
    view = memoryview(raw)
    last = 0

    def stretch(end: int) -> None:
        digest.update(b"B" + (end - last).to_bytes(8, "big"))
        digest.update(view[last:end])

    for start, end, aid in runs:
        if aid is None:
            continue
        stretch(start)
        digest.update(b"I" + aid.encode())
        last = end
    stretch(len(raw))
    return "sha256:" + digest.hexdigest()


def located(raw: bytes, images: Sequence[tuple[str, str]]) -> list[tuple[int, int, str | None]]:
    """Where in ``raw`` the base64 of each image lies (``images``: its base64 as decoded, and its
    identity, in document order), as runs for ``spliced_id``. An image not found verbatim after
    the previous one (JSON escapes in it, or a short one) is left out: its bytes are hashed as
    they are."""
    found: list[tuple[int, int, str | None]] = []
    last = 0
    for data, aid in images:
        if len(data) < 16 or not data.isascii():
            continue
        needle = data.encode("ascii")
        at = raw.find(needle[:64], last)
        if at < 0 or not raw.startswith(needle, at) or raw[at + len(needle):at + len(needle) + 1] != b'"':
            continue
        found.append((at, at + len(needle), aid))
        last = at + len(needle)
    return found


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def container_paths(root: Json, wanted: set[int]) -> dict[int, str]:
    """JSON pointer of each list and dict in ``root`` whose object id is ``wanted``, by id. The walk
    ends once it found them all, and spells a path only for those: a body's big members (a
    coding agent's tool schemas) cost a step each, not a string each."""
    paths: dict[int, str] = {}
    if not wanted:
        return paths
    # each container with its trail: (its key, the trail of its parent), the root's is None
    stack: list[tuple[Json, _Trail]] = [(root, None)]
    while stack:
        node, trail = stack.pop()
        if id(node) in wanted:
            paths[id(node)] = _spelled(trail)
            if len(paths) == len(wanted):
                break
        if isinstance(node, dict):
            stack += [(v, (k, trail)) for k, v in node.items() if isinstance(v, (dict, list))]
        elif isinstance(node, list):
            stack += [(v, (i, trail)) for i, v in enumerate(node) if isinstance(v, (dict, list))]
    return paths


#: A container's place: its key in its parent, and its parent's place (None: the root).
_Trail = tuple[Any, "_Trail"] | None


def _spelled(trail: _Trail) -> str:
    keys: list[str] = []
    while trail is not None:
        key, trail = trail
        keys.append(_escape(key) if isinstance(key, str) else str(key))
    return "".join("/" + key for key in reversed(keys))


def site_paths(root: Json, sites: Sequence[Site]) -> list[str]:
    """The JSON pointer of each site, in the tree as the client sent it (before rendering)."""
    paths = container_paths(root, {id(site.parent) for site in sites})
    return [f"{paths.get(id(site.parent), '?')}/{_escape(str(site.index))}" for site in sites]


def ref_records(sites: Sequence[Site], paths: Sequence[str], outcomes: Sequence[Outcome]) -> tuple[RefRecord, ...]:
    return tuple(
        RefRecord(path, site.ref.id, "inlined", variant=outcome.image.id if outcome.image.id != site.ref.id else None)
        if isinstance(outcome, Resolved) else RefRecord(path, site.ref.id, "placeholder", outcome.failure)
        for site, path, outcome in zip(sites, paths, outcomes)
    )


def client_records(paths: Sequence[str], client: Sequence[tuple[Carried, str]],
                   held: Sequence[InlineOutcome]) -> tuple[RefRecord, ...]:
    """What each image the client inlined itself became: ``client`` (sent as it came, or
    respelled: the same bytes), ``inlined`` as its ``variant``, or ``placeholder``. What an
    upstream accepted is read from these."""
    return tuple(_client_record(path, aid, outcome) for path, (_, aid), outcome in zip(paths, client, held))


def _client_record(path: str, aid: str, outcome: InlineOutcome) -> RefRecord:
    if isinstance(outcome, Placeholder):
        return RefRecord(path, aid, "placeholder", outcome.failure)
    if isinstance(outcome, Resolved):
        return RefRecord(path, aid, "inlined", variant=outcome.image.id)
    return RefRecord(path, aid, "client")


def link_records(paths: Sequence[str], sites: Sequence[Site], held: Sequence[Placeholder | None]) -> tuple[RefRecord, ...]:
    """What became of each image the provider fetches by URL that a quarantine holds for:
    ``placeholder`` (its failure), under the URL's identity. One sent as it came is not recorded:
    its URL is in the body as the client sent it, and the log keeps no URL."""
    return tuple(RefRecord(path, site.ref.id, "placeholder", outcome.failure)
                 for path, site, outcome in zip(paths, sites, held) if outcome is not None)


def shape(body: Json) -> tuple[tuple[str, str], ...]:
    """Short digests of each top-level member, and of each item of a top-level list."""
    if not isinstance(body, dict):
        return (("", hashlib.sha256(RECORD.encode(body)).hexdigest()[:16]),)
    out: list[tuple[str, str]] = []
    for key, value in body.items():
        path = "/" + _escape(str(key))
        items = enumerate(value) if isinstance(value, list) else ()
        out.append((path, hashlib.sha256(RECORD.encode(value)).hexdigest()[:16]))
        out += [(f"{path}/{i}", hashlib.sha256(RECORD.encode(item)).hexdigest()[:16]) for i, item in items]
    return tuple(out)


class Described(msgspec.Struct, frozen=True, gc=False):
    """``public_urls``: the bases of the HTTP references the call had (none: it had none);
    ``inbound_digest``: the inbound body's, when known already (``spliced_id``)."""

    projected_digest: str
    refs: tuple[RefRecord, ...]
    shape: tuple[tuple[str, str], ...]
    public_urls: tuple[str, ...] = ()
    inbound_digest: str | None = None


def of_tree(rendered: Json, refs: tuple[RefRecord, ...], public_urls: tuple[str, ...] = (),
            inbound_digest: str | None = None) -> Described:
    """A projected call, from its rendered tree (no second decode, no base64 hashed); the client's
    own images in it are hashed as ``<`` their identity ``>`` too (``Splice``)."""
    return Described(sha256_id(RECORD.encode(rendered)), refs, shape(rendered), public_urls,
                     inbound_digest=inbound_digest)


#: What a record keeps of a call sent as the client's own bytes, as the request path describes it:
#: their digest is taken by the recorder's writer, off the request (``Recording.start``), so
#: ``projected_digest`` is empty here. Never written as it is.
UNHASHED: Final = Described("", (), ())


def of_unchanged(raw: bytes, refs: tuple[RefRecord, ...] = (), digest: str | None = None) -> Described:
    """What a record keeps of a call sent as the client's own bytes: their digest (``digest``
    when known: ``spliced_id``), the images the client inlined (``refs``), and no shape. Its
    upstream body *is* its inbound body, which a replay has (checked against this digest), so the
    replay takes the shape from it (``of_raw``) when it needs one: a request pays for a digest per
    message only where a projection changed the body."""
    digest = digest or sha256_id(raw)
    return Described(digest, refs, (), inbound_digest=digest)


def of_raw(raw: bytes) -> Described:
    """A call sent as the client's own bytes (nothing to project), with its shape: what a replay
    compares a reconstruction with (the request path records ``of_unchanged``)."""
    try:
        tree = _decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return Described(sha256_id(raw), (), (("", hashlib.sha256(raw).hexdigest()[:16]),))
    return of_decoded(raw, tree)


def of_decoded(raw: bytes, tree: Json, refs: tuple[RefRecord, ...] = (), digest: str | None = None) -> Described:
    """``of_raw`` of a body already decoded (it held no reference; ``refs``: the images the
    client inlined, sent as they came, ``digest``: the body's ``spliced_id``): no second decode."""
    digest = digest or sha256_id(raw)
    return Described(digest, refs, shape(tree), inbound_digest=digest)
