"""``POST /v1/attachments``: admit raw or multipart image bytes into the store; ``GET`` (and
``HEAD``) ``/v1/attachments/{id}``: serve them back, verified (proxy layer).

The upload answers ``{id, media_type, bytes, width, height, name?, url, href, variants}`` where
``url`` is the ready-to-paste ``attachment:`` reference (carrying the display name), ``href`` the
same reference as an http(s) URL under ``server.public_url`` (for clients whose helpers validate
or fetch image URLs) and ``variants`` the variants made of it so far (target -> variant id);
with tenants, always none: a variant may have been made for another tenant's calls, and would
tell this one that another holds the same bytes.
Admission itself (magic bytes, limits, atomic publish) is the store's job; this module only gets
the bytes out of HTTP, bounded, and back (``serve_image``, shared with the Files API's content).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from ...policy.errors import NOT_FOUND, AttachmentError, Code, InvalidRequest, ProjectionistError
from ...policy.model import ATTACHMENTS_PATH, EXTENSION_OF, StoredImage, check_id, split_extension
from ..inbound.bodies import Coming, encoding_of, form_parts, parse_form, read_body
from ..inbound.budget import Budget, hold
from ..inbound.context import context
from ..inbound.services import SERVICES

MAX_NAME = 255


def clean_name(name: str | None) -> str | None:
    """A display name as given at upload (query ``name`` or the multipart file name): valid
    UTF-8, printable (no control characters), at most ``MAX_NAME`` characters; empty is none."""
    if not name:
        return None
    try:
        name.encode("utf-8")  # aiohttp keeps bytes that are not UTF-8 as lone surrogates
    except UnicodeEncodeError:
        raise InvalidRequest("display name must be UTF-8", code=Code.INVALID_NAME) from None
    if "\ufffd" in name:  # the email parser (Files API) turns bytes that are not UTF-8 into U+FFFD
        raise InvalidRequest("display name must be UTF-8", code=Code.INVALID_NAME)
    if len(name) > MAX_NAME or not name.isprintable():
        raise InvalidRequest(f"display name must be printable and at most {MAX_NAME} characters", code=Code.INVALID_NAME)
    return name


def describe(image: StoredImage, name: str | None, variants: dict[str, str] | None = None,
             public_url: str | None = None) -> dict[str, Any]:
    query = f"?name={quote(name, safe='')}" if name else ""
    out: dict[str, Any] = {"id": image.id, "media_type": image.media_type, "bytes": image.bytes,
                           "width": image.width, "height": image.height}
    if name:
        out["name"] = name
    out["url"] = f"attachment:{image.id}{query}"
    if public_url:
        extension = EXTENSION_OF.get(image.media_type)
        suffix = f".{extension}" if extension else ""
        out["href"] = f"{public_url}{ATTACHMENTS_PATH}{image.id}{suffix}{query}"
    out["variants"] = variants or {}
    return out


async def read_upload(request: web.Request, limit: int, budget: Budget,
                      field: str = "file") -> tuple[bytes, str | None, str | None]:
    """(bytes, declared media type, file name) from a raw or multipart upload."""
    if request.content_type.startswith("multipart/"):
        if encoding_of(request):  # a compressed form: decode it whole, then parse it
            _, upload = await parse_form(request.headers["Content-Type"], await read_body(request, budget), limit, field)
        else:  # read as it streams: its file part is at most ``limit``, the rest is let go
            length = request.content_length
            hold(context(request), budget, limit if length is None else min(length, limit), "body")
            try:
                reader = await request.multipart()
            except (BadHttpMessage, ValueError, AssertionError):
                raise InvalidRequest("malformed multipart body", code=Code.INVALID_MULTIPART) from None
            async with Coming(budget.idle) as coming:
                _, upload = await form_parts(reader, limit, field, coming)
        if upload is None:
            raise InvalidRequest(f"multipart upload needs a {field!r} file part", code=Code.MISSING_FILE)
        return upload
    return await read_body(request, budget), request.headers.get("Content-Type"), None


async def upload(request: web.Request) -> web.StreamResponse:
    app = request.app[SERVICES]
    tenant = context(request).tenant = app.guard.require_client(request.headers, request.query)
    data, declared, filename = await read_upload(request, app.config.store.limits.max_bytes, app.budget)
    if not data:
        raise InvalidRequest("empty upload", code=Code.EMPTY_UPLOAD)
    name = clean_name(request.query.get("name") or filename)
    image = await app.visible.admit(tenant, data, declared, name=name)
    context(request).fields.update(attachment=image.id[:15], bytes=image.bytes)
    # the same bytes uploaded again keep theirs, shown where no other tenant can have made them
    variants = await app.variants.of(image.id) if tenant is None else {}
    return web.Response(body=msgspec.json.encode(describe(image, name, variants, app.config.public_url)),
                        content_type="application/json")


#: An id names its bytes for good: any cache may keep them (``private`` when clients need a token).
IMMUTABLE = "max-age=31536000, immutable"


async def serve_image(request: web.Request, attachment_id: str, missing: ProjectionistError) -> web.Response:
    """An attachment's bytes after a full verified read of the store (never the cache), typed as
    admitted, with its id as ``ETag``. An absent object raises ``missing``; a corrupt or unreadable
    one its attachment error: bytes that fail verification are never served. A request that
    already holds them (``If-None-Match``) gets 304 while the object exists."""
    services = request.app[SERVICES]
    if not await services.visible.sees(context(request).tenant, attachment_id):
        raise missing  # another tenant's, or none: the same answer
    etag = f'"{attachment_id}"'
    scope = "private" if services.guard.clients_required else "public"
    headers = {"ETag": etag, "Cache-Control": f"{scope}, {IMMUTABLE}"}
    if etag in (t.strip() for t in request.headers.get("If-None-Match", "").split(",")):
        if await services.store.stat(attachment_id) is None:
            raise missing
        return web.Response(status=304, headers=headers)
    try:
        image = await services.store.read_image(attachment_id)
    except AttachmentError as error:
        if error.code == NOT_FOUND:
            raise missing from None
        raise
    return web.Response(body=image.data, content_type=image.media_type, headers=headers)


async def download(request: web.Request) -> web.StreamResponse:
    """``GET``/``HEAD /v1/attachments/{id}``: the HTTP form of a reference, served."""
    context(request).tenant = request.app[SERVICES].guard.require_client(request.headers, request.query)
    attachment_id = check_id(split_extension(request.match_info["id"]))
    context(request).fields.update(attachment=attachment_id[:15])
    missing = ProjectionistError(f"no attachment {attachment_id[:15]}", code=NOT_FOUND, status=404)
    return await serve_image(request, attachment_id, missing)
