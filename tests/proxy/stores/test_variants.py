"""Image variants on every store backend (filesystem, S3 on SeaweedFS): the recipe fits each profile
and is deterministic (twice, and in a fresh process); a variant is made once per original and
target, shared by concurrent callers and agreed on by racing replicas; the index heals when its
variant is gone; targets are checked before they reach a path or a key."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import os
import random
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from PIL import Image

from projectionist.policy.model import StoredImage
from projectionist.policy.profile import Profile, breaks
from projectionist.proxy.lanes import Busy
from projectionist.proxy.stores.cache import CachedImage, CachedStore, VerifiedCache
from projectionist.proxy.stores.variants import (
    RECIPE,
    VariantImpossible,
    Variants,
    render_variant,
)
from tests.fakes import CountingStore
from tests.proxy.stores.test_store_contract import KINDS, StoreBackend

ROOT = Path(__file__).resolve().parents[3]
ALL_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
ANTHROPIC = Profile("anthropic", ALL_TYPES, max_image_bytes=5 * 1024 * 1024, max_side=8000,
                    many_images=20, many_images_max_side=2000)
GEMINI = Profile("gemini", ("image/png", "image/jpeg", "image/webp"))
SMALL = Profile("small", ("image/png", "image/jpeg"), max_image_bytes=300_000)
PIXELS = Profile("pixels", ("image/png", "image/jpeg", "image/webp"), max_pixels=100_000)
JPEG_ONLY = Profile("jpegonly", ("image/jpeg",), max_side=500)


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def stored(data: bytes) -> StoredImage:
    with Image.open(io.BytesIO(data)) as image:
        media_type = Image.MIME[image.format or ""]
        return StoredImage("sha256:" + hashlib.sha256(data).hexdigest(), media_type, len(data),
                           image.width, image.height, data)


@functools.cache
def big_png() -> bytes:
    """3000x2000, a gradient with some structure: compresses well, resamples visibly."""
    base = Image.linear_gradient("L").resize((3000, 2000))
    return encode(Image.merge("RGB", (base, base.transpose(Image.Transpose.FLIP_LEFT_RIGHT), base.rotate(90))), "PNG")


@functools.cache
def noise_png() -> bytes:
    """600x600 of noise: about 1 MB that no PNG encoder can squeeze."""
    noise = random.Random(7).randbytes(600 * 600 * 3)
    return encode(Image.frombytes("RGB", (600, 600), noise), "PNG")


@functools.cache
def animated_gif() -> bytes:
    frames = [Image.new("P", (40, 30), color) for color in (1, 2, 3)]
    for frame in frames:
        frame.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * 756)
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


@functools.cache
def rgba_webp() -> bytes:
    image = Image.new("RGBA", (900, 700), (10, 200, 30, 128))
    return encode(image, "WEBP", quality=90)


@functools.cache
def exif_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 on display
    exif[0x0131] = "a camera that stamps its name"
    return encode(Image.linear_gradient("L").resize((1200, 800)).convert("RGB"), "JPEG", exif=exif, quality=95)


#: (name, image bytes, profile, images in the request) for the determinism checks.
CASES: list[tuple[str, Callable[[], bytes], Profile, int]] = [
    ("png-many-images", big_png, ANTHROPIC, 21),
    ("gif-to-png", animated_gif, GEMINI, 1),
    ("png-over-bytes", noise_png, SMALL, 1),
    ("webp-over-pixels", rgba_webp, PIXELS, 1),
    ("webp-alpha-to-jpeg", rgba_webp, JPEG_ONLY, 1),
    ("jpeg-exif-rotated", exif_jpeg, JPEG_ONLY, 1),
]


def opened(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


# -- the recipe -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "source", "profile", "images"), CASES, ids=[c[0] for c in CASES])
def test_every_rendering_fits_its_profile(name: str, source: Callable[[], bytes], profile: Profile,
                                          images: int) -> None:
    data = render_variant(stored(source()), profile, images)
    out = opened(data)
    media_type = Image.MIME[out.format or ""]
    assert breaks(profile, media_type, len(data), out.width, out.height, images) is None
    assert not {"exif", "icc_profile", "transparency"} & set(out.info)


def test_many_images_scale_the_longest_side_to_2000() -> None:
    out = opened(render_variant(stored(big_png()), ANTHROPIC, 21))
    assert (out.format, out.size) == ("PNG", (2000, 1333))
    assert opened(render_variant(stored(big_png()), ANTHROPIC, 20)).size == (3000, 2000)  # never up


def test_an_animated_gif_becomes_its_first_frame_as_png() -> None:
    out = opened(render_variant(stored(animated_gif()), GEMINI, 1))
    assert (out.format, out.size, out.convert("RGB").getpixel((0, 0))) == ("PNG", (40, 30), (255, 0, 0))


def test_over_bytes_shrinks_until_it_fits() -> None:
    data = render_variant(stored(noise_png()), SMALL, 1)
    out = opened(data)
    assert len(data) <= 300_000 and out.format == "PNG" and out.width < 600 and out.width == out.height


def test_alpha_becomes_white_in_jpeg_and_exif_turns_the_image_upright() -> None:
    flat = opened(render_variant(stored(rgba_webp()), JPEG_ONLY, 1))
    assert flat.format == "JPEG" and flat.mode == "RGB" and flat.size == (500, 388)
    red, green, blue = flat.getpixel((250, 194))  # type: ignore[misc]
    assert red > 100 and green > 200 and blue > 100  # half-transparent green on white
    upright = opened(render_variant(stored(exif_jpeg()), JPEG_ONLY, 1))
    assert upright.size == (333, 500) and "exif" not in upright.info


def test_pixel_limit_keeps_the_aspect_ratio() -> None:
    out = opened(render_variant(stored(rgba_webp()), PIXELS, 1))
    assert out.format == "WEBP" and out.width * out.height <= 100_000
    assert abs(out.width / out.height - 900 / 700) < 0.01


def test_impossible_profiles_raise() -> None:
    with pytest.raises(VariantImpossible) as info:
        render_variant(stored(noise_png()), Profile("tiny", ("image/png", "image/jpeg"), max_image_bytes=100), 1)
    assert not info.value.transient
    with pytest.raises(VariantImpossible):
        render_variant(stored(big_png()), Profile("webponly", ("image/webp",)), 1)


SCRIPT = """
import hashlib, sys, msgspec
from projectionist.policy.model import StoredImage
from projectionist.policy.profile import Profile
from projectionist.proxy.stores.variants import render_variant
cases = msgspec.json.decode(open(sys.argv[1], "rb").read(), type=list[tuple[StoredImage, Profile, int]])
print(" ".join(hashlib.sha256(render_variant(*case)).hexdigest() for case in cases))
"""


def test_the_recipe_is_deterministic_twice_and_in_a_fresh_process(tmp_path: Path) -> None:
    cases = [(stored(source()), profile, images) for _, source, profile, images in CASES]
    first = [hashlib.sha256(render_variant(*case)).hexdigest() for case in cases]
    assert [hashlib.sha256(render_variant(*case)).hexdigest() for case in cases] == first
    path = tmp_path / "cases.json"
    path.write_bytes(msgspec.json.encode(cases))
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, check=True, cwd=ROOT,
                          env=env, timeout=120)
    assert done.stdout.decode().split() == first


# -- made once, remembered by the store -----------------------------------------------------------


class Counting:
    """A render function that counts its calls, optionally waiting at a barrier or changing the recipe."""

    def __init__(self, barrier: threading.Barrier | None = None, quality_shift: bool = False) -> None:
        self.calls = 0
        self.barrier = barrier
        self.quality_shift = quality_shift

    def __call__(self, image: StoredImage, profile: Profile, images: int) -> bytes:
        self.calls += 1
        if self.barrier is not None:
            self.barrier.wait(timeout=30)
        data = render_variant(image, profile, images)
        if self.quality_shift:  # another recipe: other bytes, other id
            data = encode(opened(data), "PNG", compress_level=1)
        return data


@pytest.fixture(name="stores", params=list(KINDS))
async def stores_on_every_backend(request: pytest.FixtureRequest,
                                  monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[StoreBackend]:
    """Stores on one root or prefix of this test's own (a replica is ``stores.make()``), each kind."""
    backend = KINDS[request.param].for_test(request, monkeypatch)
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture
async def make_variants(stores: StoreBackend) -> AsyncIterator[Callable[..., Variants]]:
    made: list[Variants] = []

    def make(store: Any = None, **options: Any) -> Variants:
        variants = Variants(store or stores.store, **options)
        made.append(variants)
        return variants

    yield make
    for variants in made:
        await variants.close()


async def test_a_many_images_request_gets_a_2000px_variant_stored_beside_the_original(
        stores: StoreBackend, make_variants: Callable[..., Variants]) -> None:
    store = stores.store
    original = await store.admit(big_png())
    variants = make_variants()
    variant = await variants.make(original, ANTHROPIC, 21)
    assert (variant.media_type, variant.width, variant.height) == ("image/png", 2000, 1333)
    assert breaks(ANTHROPIC, variant.media_type, variant.bytes, variant.width, variant.height, 21) is None
    assert variant.id != original.id and (await store.read_image(variant.id)).data == variant.data
    assert (await store.read_image(original.id)).data == big_png()  # the original is untouched
    assert await variants.of(original.id) == {"anthropic@2000": variant.id}
    assert await store.variant_of(original.id, "anthropic@2000") == variant.id
    meta = await store.stat(variant.id)
    assert meta is not None and meta.name == f"{original.id[7:19]}.anthropic@2000.{RECIPE}.png"


async def test_gif_for_gemini_is_a_png_and_over_bytes_fits_by_bytes(
        stores: StoreBackend, make_variants: Callable[..., Variants]) -> None:
    store, variants = stores.store, make_variants()
    gif = await variants.make(await store.admit(animated_gif()), GEMINI, 3)
    assert (gif.media_type, gif.width, gif.height) == ("image/png", 40, 30)
    small = await variants.make(await store.admit(noise_png()), SMALL, 1)
    assert small.bytes <= 300_000 and small.width < 600
    assert await variants.of(stored(animated_gif()).id) == {"gemini@any": gif.id}


async def test_made_once_then_read_from_the_index_by_every_replica(
        stores: StoreBackend, make_variants: Callable[..., Variants]) -> None:
    original = await stores.store.admit(big_png())
    render = Counting()
    first = make_variants(render=render)
    made = await first.make(original, ANTHROPIC, 21)
    again = await first.make(original, ANTHROPIC, 21)
    replica = make_variants(stores.make(), render=render)
    elsewhere = await replica.make(original, ANTHROPIC, 21)
    assert render.calls == 1 and made.id == again.id == elsewhere.id


async def test_concurrent_makes_share_one_render(stores: StoreBackend,
                                                 make_variants: Callable[..., Variants]) -> None:
    original = await stores.store.admit(big_png())
    render = Counting()
    variants = make_variants(render=render)
    results = await asyncio.gather(*(variants.make(original, ANTHROPIC, 21) for _ in range(4)))
    assert render.calls == 1 and variants.shared == 3 and len({r.id for r in results}) == 1


async def test_racing_replicas_agree_on_one_variant(stores: StoreBackend,
                                                    make_variants: Callable[..., Variants]) -> None:
    original = await stores.store.admit(big_png())
    barrier = threading.Barrier(2)  # both render before either records: a real race for the entry
    one = make_variants(stores.make(), render=Counting(barrier))
    two = make_variants(stores.make(), render=Counting(barrier, quality_shift=True))
    a, b = await asyncio.gather(one.make(original, ANTHROPIC, 21), two.make(original, ANTHROPIC, 21))
    assert a.id == b.id == await stores.store.variant_of(original.id, "anthropic@2000")
    assert one.renders == two.renders == 1


async def test_an_entry_whose_variant_is_gone_is_made_again(stores: StoreBackend,
                                                            make_variants: Callable[..., Variants]) -> None:
    store = stores.store
    original = await store.admit(big_png())
    made = await make_variants().make(original, ANTHROPIC, 21)
    await stores.remove(made.id)
    render = Counting()
    remade = await make_variants(stores.make(), render=render).make(original, ANTHROPIC, 21)
    assert render.calls == 1 and remade.id == made.id  # deterministic: the same object again
    assert (await store.read_image(made.id)).data == made.data
    # an entry naming an object that never existed (another recipe's, since deleted) is replaced
    gone = "sha256:" + hashlib.sha256(b"gone").hexdigest()
    other = await store.admit(noise_png())
    assert await store.put_variant(other.id, "small@any", gone) == gone
    fixed = await make_variants().make(other, SMALL, 1)
    assert await store.variant_of(other.id, "small@any") == fixed.id != gone


async def test_a_cached_original_is_read_from_the_store_to_render(stores: StoreBackend,
                                                                  make_variants: Callable[..., Variants]) -> None:
    store = stores.store
    reader = CachedStore(store, VerifiedCache(64 * 1024 * 1024))  # type: ignore[arg-type]
    original = await store.admit(big_png())
    cached = await reader.read_image(original.id)
    assert isinstance(cached, CachedImage) and cached.data == b""
    variant = await make_variants(reader=reader).make(cached, ANTHROPIC, 21)
    assert (variant.width, variant.height) == (2000, 1333)
    await reader.close()


async def test_an_impossible_variant_is_not_rendered_again(stores: StoreBackend,
                                                           make_variants: Callable[..., Variants]) -> None:
    original = await stores.store.admit(noise_png())
    render = Counting()
    variants = make_variants(render=render)
    tiny = Profile("tiny", ("image/png", "image/jpeg"), max_image_bytes=100)
    for _ in range(2):
        with pytest.raises(VariantImpossible) as info:
            await variants.make(original, tiny, 1)
        assert not info.value.transient
    assert render.calls == 1 and await variants.of(original.id) == {}


async def test_put_variant_is_put_if_absent(stores: StoreBackend) -> None:
    store = stores.store
    original = await store.admit(big_png())
    ids = ["sha256:" + hashlib.sha256(bytes([n])).hexdigest() for n in range(8)]
    replicas = [stores.make() for _ in ids]
    holders = await asyncio.gather(*(r.put_variant(original.id, "p@1", i) for r, i in zip(replicas, ids)))
    holder = holders[0]
    assert set(holders) == {holder} and holder in ids  # exactly one writer created the entry
    other, stale = [i for i in ids if i != holder][:2]
    assert await store.put_variant(original.id, "p@1", other) == holder
    assert await store.put_variant(original.id, "p@1", other, replacing=stale) == holder  # not the entry
    assert await store.put_variant(original.id, "p@1", other, replacing=holder) == other
    assert await store.variants(original.id) == {"p@1": other}


async def test_deleting_the_original_drops_its_entries_and_keeps_its_variants(
        stores: StoreBackend, make_variants: Callable[..., Variants]) -> None:
    store = stores.store
    original = await store.admit(big_png())
    variant = await make_variants().make(original, ANTHROPIC, 21)
    assert await store.delete(original.id)
    assert await store.variants(original.id) == {} and await store.variant_of(original.id, "anthropic@2000") is None
    assert (await store.read_image(variant.id)).data == variant.data
    assert await store.delete(original.id) is False  # nothing left, and no error


@pytest.mark.parametrize("target", ["../../x@1", "Anthropic@2000", "a@", "@1", "a@b@c", "a b@1", "a@" + "9" * 11,
                                    "x" * 33 + "@1", ".hidden@1", "a@1/b"])
async def test_bad_targets_are_refused_before_they_touch_storage(stores: StoreBackend, target: str) -> None:
    store = stores.store
    original = await store.admit(make_png())
    before = await stores.stored()
    with pytest.raises(ValueError, match="invalid variant target"):
        await store.variant_of(original.id, target)
    with pytest.raises(ValueError, match="invalid variant target"):
        await store.put_variant(original.id, target, original.id)
    assert await stores.stored() == before


async def test_a_profile_with_a_bad_name_is_refused(stores: StoreBackend,
                                                    make_variants: Callable[..., Variants]) -> None:
    original = await stores.store.admit(make_png())
    with pytest.raises(ValueError, match="invalid variant target"):
        await make_variants().make(original, Profile("Bad Name", ALL_TYPES), 1)


async def test_the_counting_store_passes_the_index_through(stores: StoreBackend,
                                                           make_variants: Callable[..., Variants]) -> None:
    counting = CountingStore(stores.store)
    original = await counting.admit(big_png())
    variant = await make_variants(counting).make(original, ANTHROPIC, 21)
    assert await counting.variants(original.id) == {"anthropic@2000": variant.id}


async def test_the_policy_calls_it_as_its_varier_and_a_full_lane_is_busy(
        stores: StoreBackend, make_variants: Callable[..., Variants]) -> None:
    store = stores.store
    original, other = await store.admit(big_png()), await store.admit(noise_png())
    started, release = threading.Event(), threading.Event()

    def slow(image: StoredImage, profile: Profile, images: int) -> bytes:
        started.set()
        release.wait(30)
        return render_variant(image, profile, images)

    variants = make_variants(threads=1, queue_timeout=0.05, render=slow)
    first = asyncio.ensure_future(variants(original, ANTHROPIC, 21))
    await asyncio.to_thread(started.wait, 30)
    with pytest.raises(Busy):  # no room to render: the request's failure (503), never the original
        await variants.make(other, SMALL, 1)
    release.set()
    variant, recipe = await first
    assert recipe == RECIPE == "v1" and (variant.width, variant.height) == (2000, 1333)
    assert (await variants.make(other, SMALL, 1)).bytes <= 300_000  # not remembered as impossible


def make_png() -> bytes:
    return encode(Image.new("RGB", (4, 3), (1, 2, 3)), "PNG")
