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
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from typing import Final

import pybase64
import xxhash

#: The default bound on the base64 the cache keeps (the strings themselves: a hit compares them).
MAX_BYTES: Final = 64 * 1024 * 1024
#: Fewer base64 characters than this hold no image worth naming (a 1x1 PNG is 68 bytes).
MIN_CHARS: Final = 16
#: The base64 characters at each end of a string that its key is hashed from.
SAMPLE: Final = 256
#: What one kept entry costs beside its base64 (key, tuple, id string, the ordered dict's node):
#: counted against ``max_bytes``, so many tiny strings cannot outgrow the bound.
ENTRY_BYTES: Final = 512


class Identities:
    """``of(base64)``: the attachment id of the bytes, or None when the string is not base64
    (such an image goes upstream as it came, as the provider would see it)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._seed = int.from_bytes(os.urandom(8), "little")
        self._kept: OrderedDict[int, tuple[bytes, str]] = OrderedDict()

    def of(self, data: str) -> str | None:
        """The identity of a decoded JSON string's base64."""
        if len(data) < MIN_CHARS or not data.isascii():
            return None
        raw = data.encode("ascii")
        return self.of_run(raw, 0, len(raw))

    def of_run(self, raw: bytes, start: int, end: int) -> str | None:
        """The identity of the base64 at ``raw[start:end]``, as it sits in a raw body (no copy on
        a hit: ``bytes.startswith`` compares in place, where comparing a memoryview would go
        byte by byte)."""
        size = end - start
        if size < MIN_CHARS:
            return None
        run = memoryview(raw)[start:end]
        key = self._key(raw, start, end)
        kept = self._kept.get(key)
        if kept is not None and len(kept[0]) == size and raw.startswith(kept[0], start):
            self.hits += 1
            self._kept.move_to_end(key)
            return kept[1]
        self.misses += 1
        try:
            decoded = pybase64.b64decode(run, validate=True)
        except ValueError:
            return None
        if not decoded:
            return None
        attachment_id = "sha256:" + hashlib.sha256(decoded).hexdigest()
        if size + ENTRY_BYTES <= self.max_bytes:
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


def decoded_bytes(data: str | bytes | memoryview) -> bytes | None:
    """The bytes of a client-inlined image's base64 (to admit them into the store), or None."""
    try:
        return pybase64.b64decode(data.encode("ascii") if isinstance(data, str) else data, validate=True)
    except (ValueError, UnicodeEncodeError):
        return None
