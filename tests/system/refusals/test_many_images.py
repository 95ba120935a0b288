"""Anthropic's many-image rule (more than 20 images in a request: 2000 px per side) counts every
image the request holds, client-inlined ones too, not just its references: the wide references go
as 2000 px variants instead of being refused and quarantined."""

from __future__ import annotations

import base64
import io
from typing import Any

from aiohttp import web
from PIL import Image

from tests.imaging import make_image


async def anthropic_many_image_rule(request: web.Request, doc: Any) -> web.StreamResponse | None:
    """Anthropic as documented: over 20 images, no side over 2000 px (the error names the block)."""
    if request.path != "/v1/messages" or not isinstance(doc, dict):
        return None
    blocks = [(m, c, b) for m, msg in enumerate(doc["messages"]) for c, b in enumerate(msg["content"])
              if isinstance(b, dict) and b.get("type") == "image"]
    if len(blocks) <= 20:
        return None
    for m, c, block in blocks:
        with Image.open(io.BytesIO(base64.b64decode(block["source"]["data"]))) as im:
            if max(im.size) > 2000:
                message = (f"messages.{m}.content.{c}.image.source.base64.data: At least one of the image dimensions "
                           "exceed max allowed size for many-image requests: 2000 pixels")
                return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                                     "message": message}}, status=400)
    return None


async def test_client_inlined_images_count_toward_the_many_image_rule(make_harness: Any) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    harness.upstream.script = anthropic_many_image_rule  # type: ignore[attr-defined]
    wide = []
    for color in range(15):
        resp = await harness.client.post("/v1/attachments", data=make_image(2100, 40, color=color),
                                         headers={"Content-Type": "image/png"})
        wide.append((await resp.json())["id"])
    blocks: list[dict[str, Any]] = [{"type": "image", "source": {"type": "url", "url": f"attachment:{w}"}} for w in wide]
    small = base64.b64encode(make_image(color=99)).decode()
    blocks += [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": small}}] * 10
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": blocks}]}  # 25 images
    resp = await harness.client.post("/v1/messages", json=body, headers={"X-Session-Id": "many"})
    assert resp.status == 200, await resp.text()
    events = await harness.events("many")
    assert [e["data"]["attachment_id"] for e in events if e["type"] == "attachment/quarantine"] == []
