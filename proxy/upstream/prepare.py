"""The upstream body of a projecting call: parse, find references, run the policy, render (proxy layer).

A body with no reference is sent as the original bytes. Otherwise it is decoded once, only the
image slots are patched, and it is encoded once; the record's view of the call (``describe``)
comes from the same tree. Every decision (reads, quarantines,
placeholders, errors) is made here, before the upstream call, so before the first response byte.
``build`` is shared with replay, so a replayed call is rebuilt by the very code that built it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
import re
from typing import Any, Final, NamedTuple, NoReturn

import msgspec

from projectionist.adapters.base import WireFormat
from projectionist.policy.errors import InvalidRequest, PayloadTooLarge
from projectionist.policy.model import ImageRef, Resolved
from projectionist.policy.projection import Projection
from projectionist.proxy.stores.cache import inline
from projectionist.proxy.upstream.describe import (
    UPSTREAM,
    Described,
    of_decoded,
    of_raw,
    of_tree,
    ref_records,
    site_paths,
)

_decoder: Final = msgspec.json.Decoder()
#: A reference's id as it appears unescaped in raw JSON (the cheap count before decoding).
_RAW_ID: Final = re.compile(rb"sha256:[0-9a-f]{64}")

Projector = Callable[[list[ImageRef]], Awaitable[Projection]]


class Built(NamedTuple):
    """An upstream body and what produced it (``projection`` is None when nothing was decoded);
    ``described`` is the record's view of it, when asked for."""

    body: bytes
    projection: Projection | None
    described: Described | None = None


def may_hold_refs(raw: bytes) -> bool:
    """Cheap pre-check on raw bytes: every reference spells ``sha256:`` unless JSON-escaped,
    and a body with any ``\\u`` escape is decoded to be sure."""
    return b"sha256:" in raw or (b"\\" in raw and b"\\u" in raw)  # memchr first: most bodies have no escape


def _too_many(limit: int) -> NoReturn:
    raise InvalidRequest(f"more than {limit} distinct attachment references in one request", code="TOO_MANY_REFERENCES")


def decode_json(raw: bytes) -> Any:
    """A client's JSON body; anything that is not JSON (nested past the parser's depth too) is
    the client's error."""
    try:
        return _decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest("request body is not valid JSON", code="INVALID_JSON") from None


async def build(fmt: WireFormat, raw: bytes, run: Projector, *, describe: bool = False,
                max_references: int | None = None, max_projected_bytes: int | None = None) -> Built:
    """The upstream body for ``raw``: the original bytes without references, else projected.

    The body is decoded at most once; with ``describe`` the record's view (digest, reference
    paths and outcomes, shape) comes from that same tree. More than ``max_references`` distinct
    references is the client's error, refused before anything is read; so is a body whose inlined
    images would pass ``max_projected_bytes`` (one image referenced a thousand times is a
    thousand copies), refused before it is built."""
    if not may_hold_refs(raw):
        return Built(raw, None, of_raw(raw) if describe else None)
    if max_references is not None and raw.count(b"sha256:") > max_references \
            and len(set(_RAW_ID.findall(raw))) > max_references:  # refused before it is decoded
        _too_many(max_references)
    decoded = decode_json(raw)
    sites = fmt.find_refs(decoded)
    if not sites:
        return Built(raw, None, of_decoded(raw, decoded) if describe else None)
    if max_references is not None and len({site.ref.id for site in sites}) > max_references:
        _too_many(max_references)
    paths = site_paths(decoded, sites) if describe else []  # before rendering moves anything
    projection = await run([site.ref for site in sites])
    if max_projected_bytes is not None:
        inlined = sum(4 * -(-o.image.bytes // 3) for o in projection.outcomes if isinstance(o, Resolved))
        if inlined > max_projected_bytes:
            raise PayloadTooLarge(f"the images this request references would inline {inlined} bytes of base64, "
                                  f"over max_projected_bytes ({max_projected_bytes})", code="PROJECTED_TOO_LARGE")
    fmt.render(sites, projection.outcomes, inline)
    described = of_tree(decoded, ref_records(sites, paths, projection.outcomes)) if describe else None
    return Built(UPSTREAM.encode(decoded), projection, described)
