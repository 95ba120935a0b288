"""Image variants: a deterministic render that fits a provider's profile, made once per original and
target and remembered by the store's variant index across replicas (proxy layer).

``render_variant`` is the recipe (``RECIPE``): the same bytes and Pillow version give the same
bytes, so racing replicas and re-makes agree on the variant's id. ``Variants`` looks the index up,
renders off the event loop in a lane of its own, admits the bytes as an ordinary content-addressed
object (the original is never touched) and records the index entry put-if-absent. Called as the
policy's ``Varier``, it answers the variant and ``RECIPE``: every index entry so far was made by
``v1``; a recipe that changes the bytes must key its entries apart before it changes the name.
"""

from __future__ import annotations

import asyncio
import io
import math
import warnings
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Final, TypeVar

from PIL import Image, ImageOps

from ...policy.errors import (
    AttachmentError,
    ImageRejected,
    ProjectionistError,
    Unavailable,
)
from ...policy.failures import LASTING
from ...policy.model import ID_PREFIX, StoredImage
from ...policy.ports import AttachmentStore
from ...policy.profile import Profile, breaks
from ..observe.logger import get_logger
from ..lanes import Lane
from .base import Store, check_target

#: The name of the recipe below, recorded in every variant's admission name. Change it with the recipe.
RECIPE: Final = "v1"
JPEG_QUALITY: Final = 85
JPEG_SUBSAMPLING: Final = 2  # 4:2:0
WEBP_QUALITY: Final = 85
WEBP_METHOD: Final = 4
PNG_COMPRESS_LEVEL: Final = 6
#: When the bytes do not fit, the longest side shrinks to 3/4 (rounded down), at most this often.
SHRINK: Final = (3, 4)
MAX_SHRINKS: Final = 8
_FORMATS: Final = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}
_EXTENSIONS: Final = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp"}
#: Formats a client may inline that no provider takes: decoded only to be converted (to PNG).
_CONVERTED: Final = ("BMP", "TIFF")

Render = Callable[[StoredImage, Profile, int], bytes]
_V = TypeVar("_V")


class VariantImpossible(Exception):
    """No variant that fits could be had: send the original unchanged. ``transient`` is True when
    trying again later may succeed (the render timed out, a read failed); False when the recipe
    cannot make this image fit this target (remembered: it is not rendered again)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


# -- the recipe (pure, synchronous: run it off the event loop) ------------------------------------


def render_variant(image: StoredImage, profile: Profile, images: int) -> bytes:
    """Bytes of an image that fits ``profile`` in a request of ``images`` images: decoded once
    (first frame of an animation, EXIF orientation applied, no metadata kept), scaled down with
    Lanczos to the side and pixel limits, encoded with fixed settings; shrunk by 3/4 while the
    bytes are over the limit; PNG that cannot fit falls back to JPEG. Raises ``VariantImpossible``."""
    frame, animated = _decode(image.data)
    kinds = _output_types(image.media_type, animated, profile)
    if not kinds:
        raise VariantImpossible(f"profile {profile.name!r} takes neither PNG nor JPEG")
    limit = _longest_fit(frame.width, frame.height, profile.side_limit(images), profile.max_pixels)
    for media_type in kinds:
        prepared, side = _prepare(frame, media_type), limit
        for _ in range(MAX_SHRINKS + 1):
            width, height = _scaled(frame.width, frame.height, side)
            data = _encode(prepared, (width, height), media_type)
            if breaks(profile, media_type, len(data), width, height, images) is None:
                return data
            side = side * SHRINK[0] // SHRINK[1]
            if side < 1:
                break
    raise VariantImpossible(f"no {'/'.join(kinds)} rendering of {image.id[:15]} fits {profile.target(images)}")


def _decode(data: bytes) -> tuple[Image.Image, bool]:
    """The first frame, loaded and upright, and whether the image is animated."""
    try:
        with warnings.catch_warnings():  # the store's admission limits decide, not Pillow's warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[*_FORMATS.values(), *_CONVERTED]) as source:
                animated = getattr(source, "n_frames", 1) > 1
                source.seek(0)
                source.load()
                frame = ImageOps.exif_transpose(source)
    except Exception as exc:  # noqa: BLE001 (any decoder failure: the header verified, the pixels may not)
        raise VariantImpossible(f"image cannot be decoded ({type(exc).__name__})") from None
    frame.info = {}  # no EXIF, ICC profile, text or transparency key travels into the variant
    return frame, animated


def _output_types(media_type: str, animated: bool, profile: Profile) -> list[str]:
    """The types to try, in order: the original's if the profile takes it (never GIF: re-quantising
    resampled pixels to a palette degrades them; never for an animation, which loses its frames),
    else PNG (lossless: alpha and palettes survive), with JPEG as the fallback."""
    accepted = profile.media_types
    first = media_type if media_type in accepted and media_type != "image/gif" and not animated else None
    first = first or ("image/png" if "image/png" in accepted else None)
    kinds = [first] if first is not None else []
    if first != "image/jpeg" and "image/jpeg" in accepted:
        kinds.append("image/jpeg")
    return kinds


def _longest_fit(width: int, height: int, side: int | None, pixels: int | None) -> int:
    """The largest longest side, never above the original's, whose scaled size (``_scaled``) keeps
    the longest side within ``side`` and the pixel count within ``pixels``; integers only."""
    longest = max(width, height)
    limit = longest if side is None else min(longest, side)
    if pixels is not None:
        # L <= sqrt(P * longest^2 / (w * h)) gives L * floor(shortest * L / longest) <= P
        limit = min(limit, math.isqrt(pixels * longest * longest // (width * height)))
        scaled = _scaled(width, height, limit)
        if scaled[0] * scaled[1] > pixels:  # the shorter side was rounded up to 1
            limit = min(limit, pixels)
    return max(limit, 1)


def _scaled(width: int, height: int, side: int) -> tuple[int, int]:
    """``width`` x ``height`` scaled so the longest side is ``side`` (never up), aspect kept,
    each side rounded down and at least 1."""
    longest = max(width, height)
    if side >= longest:
        return width, height
    return max(1, width * side // longest), max(1, height * side // longest)


def _prepare(frame: Image.Image, media_type: str) -> Image.Image:
    """``frame`` in a mode the output type holds and Lanczos can resample."""
    alpha = frame.has_transparency_data
    if media_type == "image/jpeg":
        if not alpha:
            return frame.convert("RGB")
        white = Image.new("RGBA", frame.size, (255, 255, 255, 255))  # transparency becomes white
        return Image.alpha_composite(white, frame.convert("RGBA")).convert("RGB")
    if frame.mode in ("RGB", "RGBA") or (media_type == "image/png" and frame.mode in ("L", "LA")):
        return frame
    return frame.convert("RGBA" if alpha else "RGB")


def _encode(prepared: Image.Image, size: tuple[int, int], media_type: str) -> bytes:
    """Encode with fixed settings (nothing that depends on time, randomness or the source's metadata)."""
    image = prepared if prepared.size == size else prepared.resize(size, Image.Resampling.LANCZOS)
    image.info = {}
    out = io.BytesIO()
    if media_type == "image/png":
        image.save(out, "PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False)
    elif media_type == "image/jpeg":
        image.save(out, "JPEG", quality=JPEG_QUALITY, subsampling=JPEG_SUBSAMPLING, optimize=False,
                   progressive=False)
    else:
        image.save(out, "WEBP", quality=WEBP_QUALITY, method=WEBP_METHOD, lossless=False, exact=False)
    return out.getvalue()


# -- made once, remembered by the store ------------------------------------------------------------


class Variants:
    """One variant per (original, target), across replicas.

    ``make`` reads the store's index; a recorded variant that reads back verified and still fits
    is the answer. Otherwise it renders (``render``, in the ``variants`` lane: ``threads`` at once,
    ``timeout`` seconds each, room waited for ``queue_timeout``, else ``Busy``), admits the bytes
    into ``store`` and records the entry put-if-absent; a replica that recorded another id first
    wins, and its variant is returned. Concurrent ``make`` calls for the same original and target share one
    flight, which runs to its end even when its callers leave. Variants are read back through
    ``reader`` (the verified-object cache in the app). Found ids (``memo`` of them) save the index
    read; a permanent impossibility is remembered too, so it is not rendered again."""

    def __init__(self, store: Store, reader: AttachmentStore | None = None, *, threads: int = 2,
                 timeout: float | None = 60.0, queue_timeout: float = 30.0, render: Render = render_variant,
                 memo: int = 4096, max_pixels: int | None = None) -> None:
        self.store = store
        #: An image of more pixels is never decoded to make a variant (one a client inlined met no
        #: admission limit): it goes as it came.
        self.max_pixels = max_pixels
        self.reader = reader or store
        self.lane = Lane("variants", threads, timeout, queue_timeout)
        self.render = render
        self.memo = memo
        #: Renders asked of the lane, and ``make`` calls that joined a flight already under way.
        self.renders = 0
        self.shared = 0
        self._flights: dict[tuple[str, str], asyncio.Task[StoredImage]] = {}
        self._known: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._impossible: OrderedDict[tuple[str, str], VariantImpossible] = OrderedDict()

    async def __call__(self, image: StoredImage, profile: Profile, count: int) -> tuple[StoredImage, str]:
        """The policy's ``Varier``: ``make``, and the name of the recipe that made the variant. An
        unexpected failure (a bug, an image library error) is logged and means "no variant": the
        original is sent, and the session is never held up by it."""
        try:
            return await self.make(image, profile, count), RECIPE
        except (VariantImpossible, Unavailable):
            raise
        except Exception as exc:
            get_logger().error("variant_failed", error=type(exc).__name__, attachment=image.id[:15],
                               target=profile.target(count))
            raise VariantImpossible(f"variant failed: {type(exc).__name__}", transient=True) from None

    async def make(self, image: StoredImage, profile: Profile, images: int) -> StoredImage:
        """The variant of ``image`` that fits ``profile`` in a request of ``images`` images (made
        and recorded now if it has to be). Raises ``VariantImpossible`` (send the original);
        ``Unavailable`` when the store, or the render lane (``Busy``), fails or is full: the
        request's failure, as with reads; ``ValueError`` for a profile whose target is no valid
        name (a bug). Cancelling a caller leaves the flight running for the others."""
        key = (image.id, check_target(profile.target(images)))
        failed = self._impossible.get(key)
        if failed is not None:
            raise VariantImpossible(str(failed))
        if self.max_pixels is not None and image.width * image.height > self.max_pixels:
            raise VariantImpossible(f"{image.id[:15]} has more pixels than a variant is made from")
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = asyncio.get_running_loop().create_task(self._make(image, profile, images))
            flight.add_done_callback(partial(self._landed, key))
        else:
            self.shared += 1
        return await asyncio.shield(flight)

    async def of(self, attachment_id: str) -> dict[str, str]:
        """The image's recorded variants: target -> variant id."""
        return await self.store.variants(attachment_id)

    async def close(self) -> None:
        """Stop flights nobody waits for any more and the lane's idle threads (shutdown)."""
        flights = list(self._flights.values())
        for flight in flights:
            flight.cancel()
        await asyncio.gather(*flights, return_exceptions=True)
        self.lane.close()

    async def _make(self, image: StoredImage, profile: Profile, images: int) -> StoredImage:
        target = profile.target(images)
        try:
            return await self._find_or_make(image, profile, images, target)
        except VariantImpossible as exc:
            if not exc.transient:
                _remember(self._impossible, (image.id, target), exc, self.memo)
            raise
        except ImageRejected as exc:  # the store refuses the rendering (its own limits): for good
            impossible = VariantImpossible(f"the store refused the variant ({exc.code})")
            _remember(self._impossible, (image.id, target), impossible, self.memo)
            raise impossible from None
        except Unavailable:
            raise  # a busy or failing store (or render lane) is the request's failure
        except (ProjectionistError, TimeoutError) as exc:
            why = getattr(exc, "code", type(exc).__name__)
            raise VariantImpossible(f"variant of {image.id[:15]} for {target}: {why}", transient=True) from None

    async def _find_or_make(self, image: StoredImage, profile: Profile, images: int, target: str) -> StoredImage:
        key = (image.id, target)
        found = self._known.get(key) or await self.store.variant_of(image.id, target)
        if found is not None:
            variant = await self._fitting(found, profile, images)
            if variant is not None:
                _remember(self._known, key, found, self.memo)
                return variant
            self._known.pop(key, None)
        data = await self._render(image, profile, images)
        ext = _EXTENSIONS.get(_media_type(data), "")
        name = f"{image.id[len(ID_PREFIX):][:12]}.{target}.{RECIPE}{ext}"
        variant = await self.store.admit(data, name=name)
        holder = await self.store.put_variant(image.id, target, variant.id, replacing=found)
        if holder != variant.id:
            winner = await self._fitting(holder, profile, images)
            if winner is not None:  # another replica recorded its variant first: one per target
                _remember(self._known, key, holder, self.memo)
                return winner
            return variant  # the winner's object is gone already; the next make repairs the entry
        _remember(self._known, key, variant.id, self.memo)
        return variant

    async def _fitting(self, variant_id: str, profile: Profile, images: int) -> StoredImage | None:
        """The recorded variant, verified; None when it is missing, damaged or no longer fits
        (the profile's limits changed under the same target name): then it is made again."""
        try:
            variant = await self.reader.read_image(variant_id)
        except AttachmentError as exc:
            if exc.code in LASTING:  # gone or damaged for good; a transient failure propagates
                return None
            raise
        if breaks(profile, variant.media_type, variant.bytes, variant.width, variant.height, images) is not None:
            return None
        return variant

    async def _render(self, image: StoredImage, profile: Profile, images: int) -> bytes:
        if len(image.data) != image.bytes:  # a cached image holds its base64, not its bytes
            image = await self.store.read_image(image.id)
        self.renders += 1
        try:
            return await self.lane.run(partial(self.render, image, profile, images))
        except TimeoutError:
            raise VariantImpossible(f"rendering {image.id[:15]} timed out", transient=True) from None

    def _landed(self, key: tuple[str, str], flight: asyncio.Task[StoredImage]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # seen here, so an outcome nobody waited for is never "unretrieved"


def _media_type(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    return "image/webp" if data[8:12] == b"WEBP" else ""


def _remember(memo: OrderedDict[tuple[str, str], _V], key: tuple[str, str], value: _V, size: int) -> None:
    memo[key] = value
    memo.move_to_end(key)
    while len(memo) > size:
        memo.popitem(last=False)
