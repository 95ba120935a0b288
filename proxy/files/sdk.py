"""Files API compatibility: SDK uploads of images become attachments (proxy layer).

The rule, for ``POST /v1/files`` (and ``/u/{name}/v1/files``) on an upstream whose format has a
``multipart`` Files API (``adapters.facts.Files``: OpenAI's and Anthropic's), whose shapes are its
speaking adapter's (``file_object``, ``file_deleted``):

- OpenAI: a multipart upload with ``purpose=vision`` (the format's ``Files.purpose``) whose file
  is a png, jpeg, gif or webp image (by its magic bytes) is admitted into the attachment store;
- Anthropic (no ``purpose``): a multipart upload whose file is such an image is admitted;
- anything else (other purposes, non-images, non-multipart bodies, bodies larger than
  ``store.limits.max_bytes`` + 64 KiB, which could never be admitted) is forwarded unchanged to the
  upstream's own Files API. Bodies over ``server.client_max_size`` are streamed through uninspected too.

An admitted file's id is its attachment id (``sha256:<hex>``): it works as a Responses
``input_image.file_id`` and an Anthropic ``source: {type: "file", file_id}``. ``GET``, ``DELETE``
and ``GET .../content`` on a ``sha256:`` id are answered from the store; other ids pass through.
``DELETE`` of an attachment needs the admin token: it changes history for every session.

``GET /v1/files`` on an OpenAI-format upstream (``Files.lists``) lists the upstream's files (its page fetched with the
client's own auth, as the pass-through would) followed by the admitted images as ``purpose=vision``
files. The merged order: the upstream's pages come first, in its own ``order``; once its last page
(``has_more: false``) is reached the rest of that page and the pages after it are admitted images,
in id order (``after=sha256:...`` pages through them without asking the upstream again). Another
``purpose`` is the upstream's alone (passed through). An upstream without a Files API (404, 405)
lists ours only; any other upstream error is passed through unchanged, so a bad key is never
hidden behind a list that looks complete.
"""

from __future__ import annotations

import asyncio
import mimetypes
import re
from typing import Any, Final, cast

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from ...adapters.base import FilesFormat
from ...adapters.facts import Files
from ...adapters.registry import FORMATS, SPEAKS
from ...policy.errors import Code, ImageRejected, InvalidRequest, NotFound, UpstreamError
from ...policy.model import ID_PREFIX, check_id
from ..stores.admission import IMAGE_TOO_LARGE, header_info
from ..inbound.bodies import decoded, parse_form, read_raw
from ..inbound.context import context
from ..call.call import Call
from ..call.pipeline import relay_unchanged
from ..call.send import relay_body
from ..inbound.services import SERVICES
from ..stores.base import LIST_MAX, AttachmentMeta
from ..call.outgoing import outgoing_headers, target_url
from ..call.relay import answer_headers, upstream_errors
from .attachments import clean_name, serve_image
from ..inbound.params import natural

FILES_PATH: Final = re.compile(r"(?:/v1)?/files(?:/(?P<id>[^/]+)(?P<content>/content)?)?")
MULTIPART_SLACK: Final = 64 * 1024
#: OpenAI's ``limit`` of a file list: its range and default.
LIST_LIMITS: Final = (1, 10_000)
#: Upstream answers that mean "no Files API here": the list is ours alone.
NO_FILES_API: Final = frozenset({404, 405})


def handles(upstream_format: str, method: str, path: str) -> bool:
    match = FILES_PATH.fullmatch(path)
    if match is None:
        return False
    files = _api(upstream_format)
    if files is None or files.kind != "multipart":
        return False
    if match["id"] is None:
        return method == "POST" or (method == "GET" and files.lists)
    return method == "GET" or (method == "DELETE" and not match["content"])


def _api(upstream_format: str) -> Files | None:
    """The Files API of ``upstream_format`` (its facts'), if it has one."""
    facts = FORMATS.get(upstream_format)
    return facts.files if facts is not None else None


def _is_image(data: bytes) -> bool:
    try:
        header_info(data)
    except ImageRejected as rejected:
        return rejected.code == IMAGE_TOO_LARGE  # an image, refused by admission with a clear 413
    return True


def _filename(meta: AttachmentMeta) -> str:
    if meta.name:
        return meta.name
    return f"{meta.id[len(ID_PREFIX):][:12]}{mimetypes.guess_extension(meta.media_type) or ''}"


def file_object(upstream_format: str, meta: AttachmentMeta) -> dict[str, Any]:
    """An attachment as the upstream format's SDK expects a file (its adapter owns the shape)."""
    return _files(upstream_format).file_object(meta.id, _filename(meta), meta.media_type, meta.bytes,
                                               meta.created_at)


def _files(upstream_format: str) -> FilesFormat:
    """The adapter that speaks for ``upstream_format``, which has a Files API (``handles``)."""
    return cast(FilesFormat, SPEAKS[upstream_format])


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(payload), status=status, content_type="application/json")


async def handle(call: Call) -> web.StreamResponse:
    request, upstream = call.request, call.upstream
    match = FILES_PATH.fullmatch(call.path)
    assert match is not None
    file_id = match["id"]
    if file_id is None and request.method == "GET":
        return await _list(call)
    if file_id is None:
        return await _upload(call)
    if not file_id.startswith(ID_PREFIX):
        return await relay_unchanged(call)
    check_id(file_id)
    context(request).fields.update(attachment=file_id[:15])
    if request.method == "DELETE":  # removes history for every session that uses it: admin only
        request.app[SERVICES].guard.require_admin(request.headers, request.query, "deleting an attachment")
        # through the reader: this process's cached copy goes at once, whatever stamp_ttl says
        if not await request.app[SERVICES].reader.delete(file_id):
            raise NotFound(f"no attachment {file_id[:15]}", code=Code.FILE_NOT_FOUND)
        return _json(_files(upstream.format).file_deleted(file_id))
    if match["content"]:
        return await serve_image(request, file_id, NotFound(f"no attachment {file_id[:15]}", code=Code.FILE_NOT_FOUND))
    meta = await request.app[SERVICES].visible.stat(context(request).tenant, file_id)
    if meta is None:
        raise NotFound(f"no attachment {file_id[:15]}", code=Code.FILE_NOT_FOUND)
    return _json(file_object(upstream.format, meta))


async def _upload(call: Call) -> web.StreamResponse:
    request, upstream, app = call.request, call.upstream, call.services
    limit = min(app.config.store.limits.max_bytes + MULTIPART_SLACK, app.config.server.client_max_size)
    length = request.content_length
    if not request.content_type.startswith("multipart/") or length is None or length > limit:
        return await relay_unchanged(call)
    raw = await read_raw(request, app.budget)  # forwarded as it came, if it is not an image to admit
    form = await decoded(request, raw, app.budget)
    fields, upload = await parse_form(request.headers["Content-Type"], form, limit)
    purpose = _purpose(upstream.format)
    wanted = not purpose or fields.get("purpose") == purpose
    if not wanted or upload is None or not _is_image(upload[0]):
        context(request).fields.update(files="forwarded")
        return await relay_body(call, raw)
    data, declared, filename = upload
    filename = clean_name(filename)
    tenant = context(request).tenant
    image = await app.visible.admit(tenant, data, declared, name=filename)
    meta = await app.visible.stat(tenant, image.id)
    context(request).fields.update(files="admitted", attachment=image.id[:15])
    if meta is None:  # deleted between admission and stat: report what was admitted
        meta = AttachmentMeta(image.id, image.media_type, image.bytes, image.width, image.height, filename)
    return _json(file_object(upstream.format, meta))


async def _list(call: Call) -> web.StreamResponse:
    """The upstream's files, then the admitted images (the rule in the module docstring)."""
    request = call.request
    query = request.query
    purpose = _purpose(call.upstream.format)
    if query.get("purpose", purpose) not in ("", purpose):
        return await relay_unchanged(call)
    limit = _limit(query.get("limit"))
    after = query.get("after") or None
    theirs: list[Any] = []
    if after is None or not after.startswith(ID_PREFIX):
        answer = await _upstream_list(call)
        if isinstance(answer, web.Response):
            return answer
        theirs, more = answer
        if more:  # not at the upstream's last page yet: its page as it is
            return _json(_page(theirs, more))
        after = None
    else:
        check_id(after)
    room = min(limit - len(theirs), LIST_MAX)
    ours = await request.app[SERVICES].visible.list(context(request).tenant, after, room + 1)
    context(request).fields.update(files="listed", listed=min(len(ours), room))
    listed = [file_object(call.upstream.format, meta) for meta in ours[:room]]
    return _json(_page(theirs + listed, len(ours) > room))


def _purpose(upstream_format: str) -> str:
    """The ``purpose`` an image upload names to be admitted ('': any)."""
    files = _api(upstream_format)
    return files.purpose if files is not None else ""


def _limit(raw: str | None) -> int:
    low, high = LIST_LIMITS
    if raw is None:
        return high
    limit = natural(raw)
    if limit is None or not low <= limit <= high:
        raise InvalidRequest(f"limit must be an integer from {low} to {high}", code=Code.INVALID_QUERY)
    return limit


def _page(data: list[Any], has_more: bool) -> dict[str, Any]:
    ids = [item.get("id") if isinstance(item, dict) else None for item in data[:1] + data[-1:]]
    return {"object": "list", "data": data, "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None, "has_more": has_more}


async def _upstream_list(call: Call) -> tuple[list[Any], bool] | web.Response:
    """The upstream's page (its files, whether it has more), or its answer to pass through as it
    came when that is an error or not a list. No Files API there: an empty last page."""
    request, services, fmt, upstream = call.request, call.services, call.fmt, call.upstream
    call.ctx.fields["upstream"] = upstream.name
    headers = outgoing_headers(request.headers, fmt, upstream, services.guard)
    headers["Accept-Encoding"] = "identity"  # the page is read here, and the upstream session never decodes
    url = target_url(call.raw_path, request.rel_url.raw_query_string, fmt, upstream, services.guard)
    cap = services.config.server.client_max_size
    with upstream_errors():
        answer = await upstream.session.send("GET", url, headers=headers)
        try:
            context(request).fields["upstream_status"] = answer.status
            chunks, size = [], 0
            async for chunk in answer.iter_any():
                chunks.append(chunk)
                size += len(chunk)
                if size > cap:
                    raise UpstreamError("upstream file list exceeds the configured client_max_size")
            body, status, head = b"".join(chunks), answer.status, CIMultiDict[str]()
            answer_headers(head, answer.headers)  # as the relay passes on any answer: sandboxed, no console cookie
        finally:
            answer.release()
    if status in NO_FILES_API:
        return [], False
    try:
        page = msgspec.json.decode(body) if status == 200 else None
    except msgspec.DecodeError:
        page = None
    if not isinstance(page, dict) or not isinstance(data := page.get("data"), list):
        return web.Response(status=status, body=body, headers=head)
    return data, page.get("has_more") is True
