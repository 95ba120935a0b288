"""Gemini Files API compatibility: resumable uploads of images become attachments (proxy layer).

On an upstream whose format's Files API is ``resumable`` (``adapters.facts.Files``: ``gemini``'s;
also under ``/u/{name}/``):

- ``POST /upload/{version}/files`` with ``X-Goog-Upload-Protocol: resumable`` and
  ``X-Goog-Upload-Command: start`` whose declared type (``X-Goog-Upload-Header-Content-Type``) is
  png, jpeg, gif or webp and whose declared size (``X-Goog-Upload-Header-Content-Length``) is at
  most ``store.limits.max_bytes`` opens an upload here (``http.resumable``) and answers with its
  ``X-Goog-Upload-URL``, ``{server.public_url}/v1/attachments/uploads/{token}`` (unset: the
  origin the request reached). Anything else (other types, larger files, other upload protocols)
  is forwarded unchanged: the bytes then go to Google.
- The SDK sends the bytes there (``upload`` at an offset, ``upload, finalize`` with the last
  chunk; ``query`` and ``cancel`` are answered too), to any worker or replica: each chunk but the
  last is a part in the store, where every process finds it (``http.resumable``), so ``query``
  and the offsets are checked against what every process received. Finalizing admits them like every other upload
  (magic bytes decide, the declared type must agree, the store's limits apply) and answers
  ``{"file": File}``: ``name`` ``files/sha256-<hex>``, ``uri`` the ``attachment:`` reference, which
  the SDK sends as ``file_data.file_uri`` when the ``File`` is passed in ``contents``. The type
  is decided when the upload starts, before any byte is seen: bytes declared as an image that are
  not one are refused (400), not forwarded.
- ``GET`` and ``DELETE /{version}/files/sha256-<hex>`` are answered from the store (``DELETE``
  needs the admin token, as in the other Files APIs); other names pass through.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from typing import Final

import msgspec
from aiohttp import web

from ...adapters import gemini
from ...adapters.registry import FORMATS
from ...policy.errors import Code, InvalidRequest, NotFound, ProjectionistError
from ...policy.model import ID_PREFIX, check_id
from ..inbound.bodies import read_body, read_raw
from ..inbound.budget import hold
from ..inbound.context import context, error_response
from ..call.call import Call
from ..call.pipeline import relay_unchanged
from ..inbound.services import SERVICES
from .attachments import clean_name
from ..stores.base import AttachmentMeta
from ..inbound.params import natural

START_PATH: Final = re.compile(r"/upload/v1(?:beta|alpha)?/files")
FILE_PATH: Final = re.compile(r"/v1(?:beta|alpha)?/files/sha256-(?P<hex>[^/:]*)")
#: Where the bytes of an upload opened here go (a route the proxy owns, never forwarded).
UPLOAD_ROUTE: Final = "/v1/attachments/uploads/{token}"
ADMITTED: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: The largest start body read here (a small JSON ``{"file": {...}}``).
START_MAX: Final = 64 * 1024
STATUS: Final = "X-Goog-Upload-Status"


def handles(upstream_format: str, method: str, path: str) -> bool:
    facts = FORMATS.get(upstream_format)
    if facts is None or facts.files is None or facts.files.kind != "resumable":
        return False
    if method == "POST":
        return START_PATH.fullmatch(path) is not None
    return method in ("GET", "DELETE") and FILE_PATH.fullmatch(path) is not None


def _json(payload: object, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(payload), content_type="application/json", headers=headers)


def _file(meta: AttachmentMeta) -> dict[str, object]:
    return gemini.file_object(meta.id, meta.name, meta.media_type, meta.bytes, meta.created_at)


def _declared(request: web.Request) -> tuple[str, int] | None:
    """The start's declared type and size, when it is an upload this proxy admits."""
    headers = request.headers
    if (headers.get("X-Goog-Upload-Protocol", "").lower() != "resumable"
            or headers.get("X-Goog-Upload-Command", "").lower() != "start"):
        return None
    media_type = headers.get("X-Goog-Upload-Header-Content-Type", "").split(";", 1)[0].strip().lower()
    size = headers.get("X-Goog-Upload-Header-Content-Length", "")
    limit = request.app[SERVICES].config.store.limits.max_bytes
    declared = natural(size)
    if media_type not in ADMITTED or declared is None or not 0 < declared <= limit:
        return None
    return media_type, declared


async def handle(call: Call) -> web.StreamResponse:
    request = call.request
    if request.method == "POST":
        declared = _declared(request)
        if declared is None or (request.content_length or 0) > START_MAX:
            call.ctx.fields.update(files="forwarded")
            return await relay_unchanged(call)
        return await _start(request, *declared)
    match = FILE_PATH.fullmatch(call.path)
    assert match is not None
    attachment_id = check_id(ID_PREFIX + match["hex"])
    services = request.app[SERVICES]
    context(request).fields.update(attachment=attachment_id[:15])
    if request.method == "DELETE":  # removes history for every session that uses it: admin only
        services.guard.require_admin(request.headers, request.query, "deleting an attachment")
        if not await services.reader.delete(attachment_id):
            raise NotFound(f"no attachment {attachment_id[:15]}", code=Code.FILE_NOT_FOUND)
        return _json({})
    meta = await services.visible.stat(context(request).tenant, attachment_id)
    if meta is None:
        raise NotFound(f"no attachment {attachment_id[:15]}", code=Code.FILE_NOT_FOUND)
    return _json(_file(meta))


async def _start(request: web.Request, media_type: str, size: int) -> web.Response:
    raw = await read_body(request, request.app[SERVICES].budget)
    try:
        doc = msgspec.json.decode(raw) if raw.strip() else {}
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest("the upload's start body is not valid JSON", code=Code.INVALID_JSON) from None
    described = doc.get("file") if isinstance(doc, dict) else None
    name = described.get("display_name", described.get("displayName")) if isinstance(described, dict) else None
    tenant = context(request).tenant
    # the per-client share is the tenant's (a stranger cannot mint more of them by varying a
    # header); with no client tokens, the credentials' digest
    owner = "tenant:" + tenant if tenant is not None else hashlib.sha256("\0".join([
        *request.headers.getall("x-goog-api-key", ()), *request.headers.getall("Authorization", ()),
        *request.query.getall("key", ())]).encode("utf-8", "surrogateescape")).hexdigest()
    services = request.app[SERVICES]
    uploads = services.uploads
    if uploads.sweep_due():  # expired uploads' parts and markers, off the request
        services.background(uploads.sweep(services.store))
    await uploads.reclaim(services.store, size, owner)
    token = uploads.open(media_type, size, clean_name(name if isinstance(name, str) else None), owner,
                         context(request).tenant)
    context(request).fields.update(files="upload_started")
    path = request.app.router["gemini.upload"].url_for(token=token)
    public = request.app[SERVICES].config.server.public_url  # where clients reach us, when configured
    url = f"{public}{path}" if public else str(request.url.origin().join(path))
    return web.Response(headers={"X-Goog-Upload-URL": url, STATUS: "active"})


async def upload(request: web.Request) -> web.StreamResponse:
    """``POST /v1/attachments/uploads/{token}``: the bytes of an upload opened by ``_start``. No
    client token: the SDK sends none here, and the URL's token is the credential. Every answer,
    errors included, carries ``X-Goog-Upload-Status`` (the SDK retries an answer without one)."""
    ctx = context(request)
    ctx.route, ctx.fmt = "files", gemini
    try:
        return await _chunk(request)
    except ProjectionistError as error:
        ctx.fields["error_code"] = error.code
        failed = error_response(gemini, error)
        failed.headers[STATUS] = "final"
        return failed


async def _chunk(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    uploads, store = services.uploads, services.store
    token = request.match_info["token"]
    uploads.get(token)  # a URL that was never an upload here: 404 before anything else
    commands = {c.strip().lower() for c in request.headers.get("X-Goog-Upload-Command", "").split(",")}
    if "cancel" in commands:
        await uploads.cancel(store, token)
        return web.Response(headers={STATUS: "cancelled"})
    if "query" not in commands and (not commands <= {"upload", "finalize"} or not commands):
        raise InvalidRequest("X-Goog-Upload-Command must be upload, finalize, query or cancel", code=Code.INVALID_UPLOAD)
    upload, parts = await uploads.held(store, token)  # what every process has received of it
    received = parts.size
    if "query" in commands:
        return web.Response(headers={STATUS: "active", "X-Goog-Upload-Size-Received": str(received)})
    chunk = b""
    if "upload" in commands:
        offset = request.headers.get("X-Goog-Upload-Offset", str(received))
        length = request.content_length
        if offset != str(received):
            raise InvalidRequest(f"offset {offset[:20]!r} is not the {received} bytes received", code=Code.INVALID_UPLOAD)
        if length is None or received + length > upload.size:
            raise InvalidRequest(f"the upload declared {upload.size} bytes; send that many, with Content-Length",
                                 code=Code.INVALID_UPLOAD)
        if upload.receiving:
            raise InvalidRequest("another chunk of this upload is being received", code=Code.INVALID_UPLOAD)
        upload.receiving = True
        try:
            chunk = await read_raw(request, services.budget)  # held, at most the declared size, kept coming
            if len(chunk) != length:
                raise asyncio.IncompleteReadError(chunk, length)
            if "finalize" not in commands:  # a part in the store; the last chunk is only joined to them
                received = await uploads.receive(store, upload, parts, chunk)
        except asyncio.IncompleteReadError:
            raise InvalidRequest("the chunk ended before its Content-Length", code=Code.INVALID_UPLOAD) from None
        finally:
            upload.receiving = False
    if "finalize" not in commands:
        return web.Response(headers={STATUS: "active", "X-Goog-Upload-Size-Received": str(received)})
    hold(context(request), services.budget, upload.size, "body")  # the whole file, joined from its parts
    data = await uploads.finish(store, token, upload, parts, chunk)  # closed now, whatever admission says
    visible = services.visible
    try:
        image = await visible.admit(upload.tenant, data, upload.media_type, name=upload.name)
    finally:
        if parts.parts:
            await uploads.drop(store, upload)
    context(request).fields.update(files="admitted", attachment=image.id[:15])
    meta = await visible.stat(upload.tenant, image.id) or AttachmentMeta(image.id, image.media_type, image.bytes, image.width,
                                                        image.height, upload.name)
    return _json({"file": _file(meta)}, {STATUS: "final"})
