"""The content identity of an image a client inlined itself: the sha256 of its decoded bytes (proxy layer).

That is the id a reference to those bytes would have, so the policy treats the image as it treats
a reference: a refusal of it is attributed and recorded, and the placeholder stands in for it on
every later request that still carries it. Agents re-send their whole history every turn, so the
same base64 comes back again and again: ``Identities`` keeps the answer for the strings it saw
last (at most ``max_bytes`` of them), found by a seeded 128-bit xxh3 of the string's two ends and
its size and confirmed by comparing the whole string, so a hit is exact and costs one pass over
the string (the comparison) instead of a base64 decode and a sha256 of the bytes. The key reads
only ``SAMPLE`` characters at each end: a hash of the whole string would be a second pass, and
the comparison makes the hit in any case. Two strings of one size that share both ends share a
slot: each turn that alternates them is a miss (a decode, as without the cache), never a wrong id.

With a ``sniff``, what the bytes are (``ImageFacts``: their media type by their magic bytes,
their dimensions, whether they are whole) is read on that same miss, while the decoded bytes are
at hand, and kept by identity (``facts``): a seen image costs a dictionary lookup, never a header
parse again. ``canonical`` tells a base64 spelling from its other spellings in constant time.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

import pybase64
import xxhash

from ...policy.model import ImageFacts

#: Reads what decoded bytes are (``stores.admission.image_facts``).
Sniff = Callable[[bytes], ImageFacts]

#: The default bound on the base64 the cache keeps (the strings themselves: a hit compares them).
MAX_BYTES: Final = 64 * 1024 * 1024
#: Fewer base64 characters than this hold no image (a 1x1 PNG is 68 bytes): such a run is left in
#: place by the scan and never kept here; its identity (an empty string's too) is found each time,
#: so that bytes which are no image get their placeholder rather than the provider's refusal.
MIN_CHARS: Final = 16
#: The base64 characters at each end of a string that its key is hashed from.
SAMPLE: Final = 256
#: What one kept entry costs beside its base64 (key, tuple, id string, the ordered dict's node):
#: counted against ``max_bytes``, so many tiny strings cannot outgrow the bound.
ENTRY_BYTES: Final = 512
#: How many identities' facts are kept (a few hundred bytes each).
FACTS_MAX: Final = 65_536
#: The last base64 character of a canonical spelling before ``==`` and before ``=``: its bits past
#: the data are zero. Any other character there decodes to the same bytes, but is another spelling.
_BEFORE_TWO_PADS: Final = frozenset(b"AQgw")
_BEFORE_ONE_PAD: Final = frozenset(b"AEIMQUYcgkosw048")


class Identities:
    """``of(base64)``: the attachment id of the bytes, or None when the string is not base64
    (such an image goes upstream as it came, as the provider would see it)."""

    def __init__(self, max_bytes: int = MAX_BYTES, sniff: Sniff | None = None, facts_max: int = FACTS_MAX) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self.misses = 0
        self.sniff = sniff
        self.facts_max = facts_max
        self._seed = int.from_bytes(os.urandom(8), "little")
        self._kept: OrderedDict[int, tuple[bytes, str]] = OrderedDict()
        self._facts: OrderedDict[str, ImageFacts] = OrderedDict()

    def facts(self, attachment_id: str, data: Callable[[], bytes | None]) -> ImageFacts | None:
        """What the image ``attachment_id`` is: kept since its identity was found, else sniffed
        from ``data()`` (its decoded bytes; None: unknown) now. None without a ``sniff``."""
        found = self._facts.get(attachment_id)
        if found is not None:
            self._facts.move_to_end(attachment_id)
            return found
        if self.sniff is None:
            return None
        decoded = data()
        return self._learn(attachment_id, decoded) if decoded is not None else None

    def _learn(self, attachment_id: str, decoded: bytes) -> ImageFacts:
        assert self.sniff is not None
        found = self._facts[attachment_id] = self.sniff(decoded)
        while len(self._facts) > self.facts_max:
            self._facts.popitem(last=False)
        return found

    def of(self, data: str) -> str | None:
        """The identity of a decoded JSON string's base64 (an empty one is the empty image's)."""
        if not data.isascii():
            return None
        raw = data.encode("ascii")
        return self.of_run(raw, 0, len(raw))

    def of_run(self, raw: bytes, start: int, end: int) -> str | None:
        """The identity of the base64 at ``raw[start:end]``, as it sits in a raw body (no copy on
        a hit: ``bytes.startswith`` compares in place, where comparing a memoryview would go
        byte by byte). Runs shorter than ``MIN_CHARS`` are decoded each time, never kept."""
        size = end - start
        run = memoryview(raw)[start:end]
        if size < MIN_CHARS:
            return self._identify(run, size, None, None)
        key = self._key(raw, start, end)
        kept = self._kept.get(key)
        if kept is not None and len(kept[0]) == size and raw.startswith(kept[0], start):
            self.hits += 1
            self._kept.move_to_end(key)
            return kept[1]
        self.misses += 1
        return self._identify(run, size, key, kept)

    def _identify(self, run: memoryview, size: int, key: int | None, kept: tuple[bytes, str] | None) -> str | None:
        """Decode ``run``, hash its bytes and (with a ``key``) keep the answer."""
        try:
            decoded = pybase64.b64decode(run, validate=True)
        except ValueError:
            return None
        attachment_id = "sha256:" + hashlib.sha256(decoded).hexdigest()
        if self.sniff is not None and attachment_id not in self._facts:
            self._learn(attachment_id, decoded)
        if key is not None and size + ENTRY_BYTES <= self.max_bytes:
            if kept is not None:
                self.size -= len(kept[0]) + ENTRY_BYTES
            self._kept[key] = (bytes(run), attachment_id)
            self.size += size + ENTRY_BYTES
            while self.size > self.max_bytes:
                _, (old, _) = self._kept.popitem(last=False)
                self.size -= len(old) + ENTRY_BYTES
        return attachment_id

    def _key(self, raw: bytes, start: int, end: int) -> int:
        """The slot of ``raw[start:end]``: its size and both ends (at most ``SAMPLE`` each)."""
        size = end - start
        if size <= 2 * SAMPLE:
            return xxhash.xxh3_128_intdigest(memoryview(raw)[start:end], self._seed) ^ size
        return xxhash.xxh3_128_intdigest(raw[start:start + SAMPLE] + raw[end - SAMPLE:end], self._seed) ^ size


def canonical(tail: str | bytes | memoryview) -> bool:
    """Whether base64 that ends in ``tail`` (its last three characters or more) is spelled the one
    canonical way: the bits its last character holds past the data are zero. (A spelling the
    identity accepts is padded to whole quads of the standard alphabet already.)"""
    end = bytes(tail[-3:]) if not isinstance(tail, str) else tail[-3:].encode("ascii", "replace")
    if end.endswith(b"=="):
        return len(end) == 3 and end[0] in _BEFORE_TWO_PADS
    if end.endswith(b"="):
        return len(end) >= 2 and end[-2] in _BEFORE_ONE_PAD
    return True


def decoded_bytes(data: str | bytes | memoryview) -> bytes | None:
    """The bytes of a client-inlined image's base64 (to admit them into the store), or None."""
    try:
        return pybase64.b64decode(data.encode("ascii") if isinstance(data, str) else data, validate=True)
    except (ValueError, UnicodeEncodeError):
        return None
