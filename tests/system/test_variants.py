"""Variants end to end: an image that breaks the profile of the upstream it goes to is sent as a
variant that fits, made once, pinned in the session log, and replayed from the log byte for byte
without the image library (its renderer swapped for a different one, its index deleted)."""

from __future__ import annotations

import base64
import io
import random
import shutil
from typing import Any

import msgspec
import pytest
from PIL import Image

from projectionist.adapters import anthropic_messages, gemini
from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.stores.filesystem import FilesystemStore
from projectionist.proxy.call.replay import rebuild
from tests.conftest import ADMIN, BACKENDS, Harness
from tests.imaging import make_image, ref_id

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


def pins(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "attachment/variant"]


def size_of(data: bytes) -> tuple[str, int, int]:
    with Image.open(io.BytesIO(data)) as im:
        return im.format or "", im.width, im.height


def many_image_body(wide: str, small: str) -> dict[str, Any]:
    """An Anthropic request of 21 images (the many-image rule: 2000 px): one wide, 20 small."""
    blocks = [{"type": "image", "source": {"type": "url", "url": f"attachment:{wide}?name=wide.png"}}]
    blocks += [{"type": "image", "source": {"type": "url", "url": f"attachment:{small}"}}] * 20
    return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": blocks}]}


async def admit(harness: Harness, data: bytes, media_type: str = "image/png") -> str:
    resp = await harness.client.post("/v1/attachments", data=data, headers={"Content-Type": media_type})
    assert resp.status == 200, await resp.text()
    return str((await resp.json())["id"])


async def test_a_side_over_anthropics_many_image_limit_is_sent_as_a_pinned_variant(make_harness: Any) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    original = make_image(2100, 60, color=3)
    wide, small = await admit(harness, original), await admit(harness, make_image(color=4))
    assert anthropic_messages.PROFILE.side_limit(21) == 2000
    resp = await harness.client.post("/v1/messages", json=many_image_body(wide, small), headers={"X-Session-Id": "v1"})
    assert resp.status == 200, await resp.text()
    sent = harness.upstream.last.json()["messages"][0]["content"]
    data = base64.b64decode(sent[0]["source"]["data"])
    assert size_of(data) == ("PNG", 2000, 57) and sent[0]["source"]["media_type"] == "image/png"
    assert base64.b64decode(sent[1]["source"]["data"]) == make_image(color=4)  # fitting images as they are
    [pin] = pins(await harness.events("v1"))
    assert (pin["attachment_id"], pin["target"], pin["variant_id"]) == (wide, "anthropic@2000", ref_id(data))
    assert pin["recipe"] == "v1" and (pin["width"], pin["height"]) == (2000, 57)
    # the variant sits next to the original, which is untouched; the upload answer and admin show it
    meta = await (await harness.client.get(f"/admin/attachments/{wide}", headers=ADMIN)).json()
    assert meta["variants"] == {"anthropic@2000": ref_id(data)} and meta["width"] == 2100
    again = await (await harness.client.post("/v1/attachments", data=original,
                                             headers={"Content-Type": "image/png"})).json()
    assert again["variants"] == {"anthropic@2000": ref_id(data)}
    # alone in a request the original fits Anthropic (8000 px): it goes as it is
    one = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": f"attachment:{wide}"}}]}]}
    assert (await harness.client.post("/v1/messages", json=one, headers={"X-Session-Id": "v1"})).status == 200
    assert base64.b64decode(harness.upstream.last.json()["messages"][0]["content"][0]["source"]["data"]) == original
    # later requests read the pinned variant; no new pin, no new rendering
    renders = harness.app[SERVICES].variants.renders
    before = harness.upstream.last.body
    await harness.client.post("/v1/messages", json=many_image_body(wide, small), headers={"X-Session-Id": "v1"})
    assert base64.b64decode(harness.upstream.last.json()["messages"][0]["content"][0]["source"]["data"]) == data
    assert harness.app[SERVICES].variants.renders == renders and before != harness.upstream.last.body
    assert len(pins(await harness.events("v1"))) == 1


async def test_a_gif_goes_to_gemini_as_a_png_variant(make_harness: Any, upstream: Any) -> None:
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    assert "image/gif" not in gemini.PROFILE.media_types
    gif = await admit(harness, make_image(5, 4, "image/gif", color=6), "image/gif")
    body = {"contents": [{"role": "user", "parts": [{"file_data": {"mime_type": "image/gif",
                                                                   "file_uri": f"attachment:{gif}"}}]}]}
    resp = await harness.client.post("/v1beta/models/m:generateContent", json=body, headers={"X-Session-Id": "g1"})
    assert resp.status == 200, await resp.text()
    inline = harness.upstream.last.json()["contents"][0]["parts"][0]["inline_data"]
    assert inline["mime_type"] == "image/png"
    assert size_of(base64.b64decode(inline["data"])) == ("PNG", 5, 4)
    [pin] = pins(await harness.events("g1"))
    assert (pin["target"], pin["media_type"]) == ("gemini@any", "image/png")
    # the same image to OpenAI (which takes GIF) goes as it is
    assert (await harness.chat("g1", gif)).status == 200
    url = harness.upstream.last.json()["messages"][0]["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/gif;base64,")


async def test_replay_and_later_requests_use_the_pinned_bytes_not_todays_renderer(make_harness: Any) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    wide, small = await admit(harness, make_image(2400, 80, color=7)), await admit(harness, make_image(color=8))
    body = many_image_body(wide, small)
    assert (await harness.client.post("/v1/messages", json=body, headers={"X-Session-Id": "r1"})).status == 200
    sent = harness.upstream.last.body
    services = harness.app[SERVICES]
    # "a Pillow upgrade": the renderer now makes other bytes, and the variant index is gone
    services.variants.render = lambda image, profile, images: make_image(2000, 67, color=99)
    services.variants._known.clear()
    inner = harness.store.inner
    if isinstance(inner, FilesystemStore):
        shutil.rmtree(inner.root / "variants")
    else:
        client = await inner.client()
        listed = await client.list_objects_v2(Bucket=inner.bucket, Prefix=inner.prefix + "variants/")
        for item in listed.get("Contents", []):
            await client.delete_object(Bucket=inner.bucket, Key=item["Key"])
    assert await services.variants.of(wide) == {}
    await services.recording.drain()
    rebuilt = await rebuild(services.log, services.store, "r1")
    assert rebuilt.matches and rebuilt.body == sent
    renders = services.variants.renders
    assert (await harness.client.post("/v1/messages", json=body, headers={"X-Session-Id": "r1"})).status == 200
    assert harness.upstream.last.body == sent and services.variants.renders == renders
    # a new session has no pin: it gets today's rendering, pinned for it
    assert (await harness.client.post("/v1/messages", json=body, headers={"X-Session-Id": "r2"})).status == 200
    assert harness.upstream.last.body != sent and services.variants.renders == renders + 1
    assert pins(await harness.events("r2"))[0]["variant_id"] == ref_id(make_image(2000, 67, color=99))


async def test_an_image_over_the_byte_limit_is_sent_as_a_variant_under_it(make_harness: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # the real limit (7.5 MiB decoded) would take a large image: the same rule, at a small scale
    small = msgspec.structs.replace(anthropic_messages.PROFILE, max_image_bytes=3000)
    monkeypatch.setattr(anthropic_messages, "PROFILE", small)
    harness = await make_harness()
    noisy = random.Random(14).randbytes(64 * 48 * 3)  # noise: PNG cannot squeeze it
    buf = io.BytesIO()
    Image.frombytes("RGB", (64, 48), noisy).save(buf, format="PNG")
    assert len(buf.getvalue()) > 3000
    big = await admit(harness, buf.getvalue())
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": f"attachment:{big}"}}]}]}
    resp = await harness.client.post("/v1/messages", json=body, headers={"X-Session-Id": "b1"})
    assert resp.status == 200, await resp.text()
    data = base64.b64decode(harness.upstream.last.json()["messages"][0]["content"][0]["source"]["data"])
    assert len(data) <= 3000 and size_of(data)[1] < 64
    [pin] = pins(await harness.events("b1"))
    assert (pin["target"], pin["bytes"]) == ("anthropic@8000", len(data))
