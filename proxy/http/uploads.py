"""``POST /v1/attachments``: admit raw or multipart image bytes into the store (proxy layer).

Answers ``{id, media_type, bytes, width, height, name?, url, variants}`` where ``url`` is the
ready-to-paste ``attachment:`` reference (carrying the display name) and ``variants`` the variants
made of it so far (target -> variant id). Admission itself (magic bytes, limits,
atomic publish) is the store's job; this module only gets the bytes out of HTTP, bounded.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from projectionist.policy.errors import InvalidRequest
from projectionist.policy.model import StoredImage
from projectionist.proxy.http.bodies import encoding_of, form_parts, parse_form, read_body
from projectionist.proxy.http.middleware import context
from projectionist.proxy.http.services import SERVICES

MAX_NAME = 255


def clean_name(name: str | None) -> str | None:
    """A display name as given at upload (query ``name`` or the multipart file name): valid
    UTF-8, printable (no control characters), at most ``MAX_NAME`` characters; empty is none."""
    if not name:
        return None
    try:
        name.encode("utf-8")  # aiohttp keeps bytes that are not UTF-8 as lone surrogates
    except UnicodeEncodeError:
        raise InvalidRequest("display name must be UTF-8", code="INVALID_NAME") from None
    if "\ufffd" in name:  # the email parser (Files API) turns bytes that are not UTF-8 into U+FFFD
        raise InvalidRequest("display name must be UTF-8", code="INVALID_NAME")
    if len(name) > MAX_NAME or not name.isprintable():
        raise InvalidRequest(f"display name must be printable and at most {MAX_NAME} characters", code="INVALID_NAME")
    return name


def describe(image: StoredImage, name: str | None, variants: dict[str, str] | None = None) -> dict[str, Any]:
    url = f"attachment:{image.id}" + (f"?name={quote(name, safe='')}" if name else "")
    out: dict[str, Any] = {"id": image.id, "media_type": image.media_type, "bytes": image.bytes,
                           "width": image.width, "height": image.height}
    if name:
        out["name"] = name
    out["url"] = url
    out["variants"] = variants or {}
    return out


async def read_upload(request: web.Request, limit: int, field: str = "file") -> tuple[bytes, str | None, str | None]:
    """(bytes, declared media type, file name) from a raw or multipart upload."""
    if request.content_type.startswith("multipart/"):
        if encoding_of(request):  # a compressed form: decode it whole, then parse it
            _, upload = await parse_form(request.headers["Content-Type"], await read_body(request), limit, field)
        else:
            try:
                reader = await request.multipart()
            except (BadHttpMessage, ValueError, AssertionError):
                raise InvalidRequest("malformed multipart body", code="INVALID_MULTIPART") from None
            _, upload = await form_parts(reader, limit, field)
        if upload is None:
            raise InvalidRequest(f"multipart upload needs a {field!r} file part", code="MISSING_FILE")
        return upload
    return await read_body(request), request.headers.get("Content-Type"), None


async def upload(request: web.Request) -> web.StreamResponse:
    app = request.app[SERVICES]
    app.guard.require_client(request.headers, request.query)
    data, declared, filename = await read_upload(request, app.config.store.limits.max_bytes)
    if not data:
        raise InvalidRequest("empty upload", code="EMPTY_UPLOAD")
    name = clean_name(request.query.get("name") or filename)
    image = await app.store.admit(data, declared, name=name)
    context(request).fields.update(attachment=image.id[:15], bytes=image.bytes)
    variants = await app.variants.of(image.id)  # the same bytes uploaded again keep theirs
    return web.Response(body=msgspec.json.encode(describe(image, name, variants)), content_type="application/json")
