"""The identity cache of client-inlined base64 (``proxy.upstream.identity``): a hit is exact, its
key reads only the string's ends, and strings that share a key never share an id."""

from __future__ import annotations

import base64
import hashlib
import random

from projectionist.proxy.upstream.identity import SAMPLE, Identities


def _id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _twins(size: int = 30_000) -> tuple[bytes, bytes, bytes, bytes]:
    """Two byte strings and their base64, of one size, that differ only in the middle: the base64
    of both shares its size and more than ``SAMPLE`` characters at each end (the same key)."""
    first = random.Random(7).randbytes(size)
    middle = size // 2
    second = first[:middle] + bytes([first[middle] ^ 0xFF]) + first[middle + 1:]
    a, b = base64.b64encode(first), base64.b64encode(second)
    assert len(a) == len(b) and a[:SAMPLE * 2] == b[:SAMPLE * 2] and a[-SAMPLE * 2:] == b[-SAMPLE * 2:] and a != b
    return first, second, a, b


def test_strings_that_share_their_size_and_both_ends_each_get_the_id_of_their_own_bytes() -> None:
    first, second, a, b = _twins()
    identities = Identities()
    for _ in range(3):  # alternating: each one a miss (they share a slot), never the other's id
        assert identities.of_run(b'{"x":"' + a + b'"}', 6, 6 + len(a)) == _id(first)
        assert identities.of_run(b'{"x":"' + b + b'"}', 6, 6 + len(b)) == _id(second)
    assert identities.hits == 0 and identities.misses == 6


def test_the_same_string_again_is_a_hit_wherever_it_sits_and_a_changed_middle_is_not() -> None:
    first, second, a, b = _twins()
    identities = Identities()
    assert identities.of(a.decode()) == _id(first)
    body = b'{"messages":[{"content":"' + a + b'"}]}'
    start = body.index(a)
    assert identities.of_run(body, start, start + len(a)) == _id(first)
    assert identities.of_run(body.replace(a, b), start, start + len(b)) == _id(second)
    assert (identities.hits, identities.misses) == (1, 2)


def test_a_short_string_is_keyed_by_all_of_it() -> None:
    identities = Identities()
    small = [base64.b64encode(bytes([i]) * 90) for i in range(4)]  # 120 characters: under 2 * SAMPLE
    for _ in range(2):
        assert [identities.of(s.decode()) for s in small] == [_id(bytes([i]) * 90) for i in range(4)]
    assert (identities.hits, identities.misses) == (4, 4)


def test_what_is_no_base64_has_no_identity_and_is_not_kept() -> None:
    identities = Identities()
    escaped = base64.b64encode(random.Random(3).randbytes(3000)).replace(b"/", b"\\/")
    assert b"\\/" in escaped
    assert identities.of_run(escaped, 0, len(escaped)) is None
    assert identities.of("not base64 at all!!") is None
    assert identities.size == 0


# --- what the bytes are: read once, on the miss -----------------------------------------------------

def test_facts_are_read_on_the_miss_and_kept_by_identity() -> None:
    from projectionist.policy.model import ImageFacts
    from tests.imaging import make_image

    sniffed: list[int] = []

    def sniff(data: bytes) -> ImageFacts:
        sniffed.append(len(data))
        return ImageFacts("image/png", len(data), 4, 3)

    png = make_image(4, 3)
    identities = Identities(sniff=sniff)
    text = base64.b64encode(png).decode()
    aid = identities.of(text)
    assert aid == _id(png) and sniffed == [len(png)]
    assert identities.of(text) == aid and sniffed == [len(png)]  # a hit reads nothing again
    assert identities.facts(aid, lambda: None) == ImageFacts("image/png", len(png), 4, 3)
    # evicted facts are read again from the bytes the caller gives
    small = Identities(sniff=sniff, facts_max=1)
    other = make_image(5, 3, color=9)
    first, second = small.of(text), small.of(base64.b64encode(other).decode())
    assert first is not None and second is not None
    assert small.facts(first, lambda: png) == ImageFacts("image/png", len(png), 4, 3) and len(sniffed) == 4
    assert Identities().facts(aid, lambda: png) is None  # no sniff: no facts


def test_an_empty_or_short_base64_has_an_identity_so_that_it_can_be_placed() -> None:
    identities = Identities()
    assert identities.of("") == _id(b"")
    assert identities.of("AAAA") == _id(b"\0\0\0") and identities.size == 0  # never kept


def test_a_canonical_spelling_is_told_from_its_other_spellings_by_its_last_characters() -> None:
    from projectionist.proxy.upstream.identity import canonical

    for size in range(1, 12):
        assert canonical(base64.b64encode(bytes(range(size))).decode())
    assert not canonical("QR==") and not canonical("QUJ=") and canonical("QQ==") and canonical("QUI=")
    assert base64.b64decode("QR==") == base64.b64decode("QQ==")  # the same bytes, another spelling
    assert canonical(memoryview(b"xxQQ=="))
