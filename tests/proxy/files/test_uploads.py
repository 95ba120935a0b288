"""``POST /v1/attachments``: raw and multipart admission, names, refusals in the OpenAI error shape;
the variants of an attachment in the upload answer and the admin attachment view."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from projectionist.policy.profile import Profile
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import ADMIN, BACKENDS, Harness
from tests.imaging import make_image, ref_id

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


async def test_raw_upload_answers_the_reference(harness: Harness) -> None:
    data = make_image(7, 5, "image/webp", color=70)
    resp = await harness.client.post("/v1/attachments", data=data, params={"name": "my shot.webp"},
                                     headers={"Content-Type": "image/webp"})
    assert resp.status == 200
    assert await resp.json() == {
        "id": ref_id(data), "media_type": "image/webp", "bytes": len(data), "width": 7, "height": 5,
        "name": "my shot.webp", "url": f"attachment:{ref_id(data)}?name=my%20shot.webp",
        "href": f"http://127.0.0.1:8787/v1/attachments/{ref_id(data)}.webp?name=my%20shot.webp", "variants": {}}
    assert (await harness.store.read_image(ref_id(data))).data == data


async def test_multipart_upload_takes_the_file_name(harness: Harness) -> None:
    data = make_image(3, 3, "image/gif", color=71)
    form = aiohttp.FormData()
    form.add_field("purpose", "vision")
    form.add_field("file", data, filename="anim.gif", content_type="image/gif")
    resp = await harness.client.post("/v1/attachments", data=form)
    assert resp.status == 200
    body = await resp.json()
    assert (body["id"], body["media_type"], body["name"]) == (ref_id(data), "image/gif", "anim.gif")


async def test_same_bytes_twice_is_the_same_id(harness: Harness) -> None:
    data = make_image(color=72)
    assert await harness.admit(data) == await harness.admit(data) == ref_id(data)


@pytest.mark.parametrize(
    ("data", "content_type", "status", "code"),
    [(b"not an image at all", "image/png", 400, "INVALID_IMAGE"),
     (make_image(media_type="image/jpeg"), "image/png", 400, "MEDIA_TYPE_MISMATCH"),
     (b"", "image/png", 400, "EMPTY_UPLOAD")],
)
async def test_refused_uploads(harness: Harness, data: bytes, content_type: str, status: int, code: str) -> None:
    resp = await harness.client.post("/v1/attachments", data=data, headers={"Content-Type": content_type})
    assert resp.status == status
    assert (await resp.json())["error"]["code"] == code


async def test_limits_apply_to_raw_and_multipart(make_harness: Callable[..., Awaitable[Harness]]) -> None:
    harness = await make_harness(**{"store.limits": {"max_bytes": 100, "max_side": 8}})
    big = make_image(40, 40, color=73)
    resp = await harness.client.post("/v1/attachments", data=big, headers={"Content-Type": "image/png"})
    assert resp.status == 413 and (await resp.json())["error"]["code"] == "IMAGE_TOO_LARGE"
    form = aiohttp.FormData()
    form.add_field("file", big, filename="big.png", content_type="image/png")
    resp = await harness.client.post("/v1/attachments", data=form)
    assert resp.status == 413
    wide = make_image(9, 1, color=74)
    resp = await harness.client.post("/v1/attachments", data=wide, headers={"Content-Type": "image/png"})
    assert resp.status == 413 and "max_side" in (await resp.json())["error"]["message"]


async def test_multipart_without_a_file_part_is_refused(harness: Harness) -> None:
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("purpose", "vision")
    resp = await harness.client.post("/v1/attachments", data=form)
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "MISSING_FILE"


async def test_upload_answer_and_admin_view_show_the_variants(harness: Harness) -> None:
    data = make_image(40, 30, "image/gif", color=75)
    resp = await harness.client.post("/v1/attachments", data=data, params={"name": "g.gif"},
                                     headers={"Content-Type": "image/gif"})
    aid = (await resp.json())["id"]
    view = await harness.client.get(f"/admin/attachments/{aid}", headers=ADMIN)
    assert view.status == 200
    body = await view.json()
    assert body == {"id": aid, "media_type": "image/gif", "bytes": len(data), "width": 40, "height": 30,
                    "name": "g.gif", "created_at": body["created_at"], "variants": {}}
    services = harness.app[SERVICES]
    original = await services.store.read_image(aid)
    variant = await services.variants.make(original, Profile("gemini", ("image/png", "image/jpeg")), 1)
    resp = await harness.client.post("/v1/attachments", data=data, headers={"Content-Type": "image/gif"})
    assert (await resp.json())["variants"] == {"gemini@any": variant.id}
    view = await harness.client.get(f"/admin/attachments/{aid}", headers=ADMIN)
    assert (await view.json())["variants"] == {"gemini@any": variant.id}


async def test_admin_attachment_view_is_guarded_and_answers_404(harness: Harness) -> None:
    aid = ref_id(b"never admitted")
    assert (await harness.client.get(f"/admin/attachments/{aid}")).status == 401
    resp = await harness.client.get(f"/admin/attachments/{aid}", headers=ADMIN)
    assert resp.status == 404 and (await resp.json())["error"]["code"] == "FILE_NOT_FOUND"
    resp = await harness.client.get("/admin/attachments/sha256:nothex", headers=ADMIN)
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "INVALID_ATTACHMENT_REF"


async def test_undecodable_upload_is_refused_and_not_stored(harness: Harness) -> None:
    whole = make_image(40, 30, color=76)
    data = whole[:-16]  # the image data's CRC and IEND are gone; the header still parses
    for form in (False, True):
        if form:
            body = aiohttp.FormData()
            body.add_field("file", data, filename="cut.png", content_type="image/png")
            resp = await harness.client.post("/v1/attachments", data=body)
        else:
            resp = await harness.client.post("/v1/attachments", data=data, headers={"Content-Type": "image/png"})
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert (error["code"], error["type"], error["param"]) == ("INVALID_IMAGE", "invalid_request_error", None)
        assert "truncated" in error["message"]
        assert resp.headers["x-projectionist-error-code"] == "INVALID_IMAGE"
    assert await harness.store.stat(ref_id(data)) is None
    assert await harness.admit(whole) == ref_id(whole)  # the whole image is admitted
