"""Inlined images are encoded with pybase64 (SIMD): byte for byte what the standard library
writes, in the data URL and the bare form, for any bytes; an upstream body never depends on
which encoder ran."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from projectionist.adapters.base import PlainInline
from projectionist.policy.model import StoredImage
from projectionist.proxy.stores.cache import Encoded


@given(st.binary(max_size=5000))
def test_the_encoding_is_the_standard_librarys(data: bytes) -> None:
    image = StoredImage(id="sha256:" + "0" * 64, media_type="image/png", bytes=len(data), width=1, height=1,
                        data=data)
    expected = base64.b64encode(data).decode("ascii")
    encoded = Encoded.of(image)
    assert bytes(encoded.base64().raw()).decode() == f'"{expected}"'
    assert bytes(encoded.data_url().raw()).decode() == f'"data:image/png;base64,{expected}"'
    inline = PlainInline(image)
    assert (inline.base64(), inline.data_url()) == (expected, f"data:image/png;base64,{expected}")
