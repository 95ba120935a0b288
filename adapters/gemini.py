"""Gemini ``generateContent`` wire format (adapters layer, pure data mapping).

References sit in ``file_data.file_uri`` (or ``fileData.fileUri``: the REST API takes both
spellings) of ``contents[].parts``, and in ``function_response.parts``. A resolved image becomes
``inline_data`` in the spelling the part used. A placeholder becomes a ``text`` part (the part's
other fields, such as ``thoughtSignature``, kept); inside a function response, whose parts may only
carry data, it becomes a text part right after that function response in the enclosing content. Errors use Google's ``{error: {code, status}}`` shape
with the stable code as an ``ErrorInfo.reason``. A ``file_uri`` that is an ``http(s)`` image URL
outside Google (not the Files API's, not YouTube's) is an image the provider fetches itself
(``find_slots``). ``PROFILE`` is what the API accepts in images; ``rejection`` reads its answers
refusing one, or failing to fetch one. ``file_object`` is an admitted attachment as the Files
API's ``File`` resource.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import quote, urlsplit

from .base import (SCAN_CHARS, Carried, FetchAnswers, Host, Inline, Inliner, Json, Known, KnownFetch, Linked, Slot,
                   PlainInline, Site, error_object, inliner, insert_after, known_pattern, listed,
                   opening_message, part_pointer)
from .facts import CallFacts, Files, FormatFacts, Spoken
from .responses import member
from ..policy.linked import is_web_url, url_name
from ..policy.model import ID_PREFIX, NO_HTTP, URL_SCHEME, HttpRefs, Outcome, Resolved, parse_url_ref
from ..policy.profile import Profile, Rejection

NAME: Final = "gemini"
FORMAT: Final = "gemini"
AUTH_HEADERS: Final = ("x-goog-api-key",)
AUTH_QUERY: Final = ("key",)
#: What opens the base64 of an image the client inlined, in the raw body (the proxy's cheap scan).
INLINE_MARKERS: Final = (b'"data":',)
#: What every part the provider fetches by URL spells in the raw body (either spelling).
URL_MARKERS: Final = (b"file_uri", b"fileUri")
PATHS: Final = re.compile(r"/v1(?:beta|alpha)?/models/[^/:]+:(?:generateContent|streamGenerateContent|countTokens)")
VOLATILE: Final = frozenset({"responseId", "createTime"})
#: The ``gemini`` format: its paths are versioned ``v1beta``/``v1alpha`` (or name a model method),
#: its SDKs send ``x-goog-api-key`` or ``?key=``; its Files API takes resumable uploads.
FACTS: Final = FormatFacts(
    FORMAT, url="https://generativelanguage.googleapis.com", provider="gcp.gemini", files=Files("resumable"),
    spoken=Spoken(headers=("x-goog-api-key",), query=("key",), prefixes=("/v1beta/", "/v1alpha/", "/upload/"),
                  pattern=re.compile(r"/v1(?:beta|alpha)?/models/[^/:]+:[A-Za-z]+")))
#: The model is named in the path (``/models/{model}:generateContent``), not in the body.
CALLS: Final = CallFacts(operation="generate_content", counting=(":countTokens",),
                         model_path=re.compile(r"/models/([^/:]+):"))
#: The ``File`` name of an admitted attachment: this prefix and the id's hex digest.
FILE_NAME_PREFIX: Final = "files/sha256-"
#: Keys of a part that carry or describe its data: dropped when the part becomes placeholder text.
_DATA_KEYS: Final = frozenset({"file_data", "fileData", "inline_data", "inlineData", "video_metadata", "videoMetadata"})

_STATUS: Final = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                  409: "ABORTED", 413: "INVALID_ARGUMENT", 422: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED",
                  500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}

_IMAGES: Final = "https://ai.google.dev/gemini-api/docs/image-understanding"
#: The Gemini API's image limits for inline data.
PROFILE: Final = Profile(
    FORMAT,
    # "PNG - image/png, JPEG - image/jpeg, WEBP - image/webp, HEIC - image/heic, HEIF - image/heif"
    # (GIF is not listed).
    ("image/png", "image/jpeg", "image/webp", "image/heic", "image/heif"),
    # No per-image byte limit, side or pixel limit is documented for the Gemini API.
    # "Inline image data limits your total request size (text prompts, system instructions, and
    # inline bytes) to 20MB" (10^6-byte MB, the safe side). The file-input page says "Inline data:
    # 100 MB per request or payload"; the image page's stricter figure is kept.
    max_request_bytes=20_000_000,
    # "Gemini models support a maximum of 3,600 image files per request."
    max_images=3600,
    sources=(_IMAGES, "https://ai.google.dev/gemini-api/docs/file-input-methods"),
)

#: The Gemini API's answers refusing an image (HTTP 400 ``INVALID_ARGUMENT``): a pattern of
#: ``error.message``, and where it was seen. Only a base64 failure names the part.
REJECTIONS: Final[tuple[Known, ...]] = (
    (r"Unable to process input image", "https://github.com/google-gemini/gemini-cli/issues/5064"),
    (r"Provided image is not valid", "https://github.com/google-gemini/gemini-cli/issues/27244"),
    (r"Unsupported MIME type: image/", "https://github.com/ogkalu2/comic-translate/pull/399"),
    (r"Invalid value at '[^']*\.inline_?data\.data' \(TYPE_BYTES\), Base64 decoding failed",
     "https://github.com/danny-avila/LibreChat/issues/6593"),
)
_REJECTED: Final = known_pattern(REJECTIONS)
#: The Gemini API's answers when it could not fetch a ``file_uri`` it fetches itself (HTTP 400
#: ``INVALID_ARGUMENT``), and what each says of the URL. Neither names the part; the second
#: names the URL.
UNFETCHED: Final[tuple[KnownFetch, ...]] = (
    # intermittent for presigned S3 URLs that stay valid: "a retry succeeds"
    (r"Cannot fetch content from the provided URL", "read_failed",
     "https://github.com/googleapis/js-genai/issues/1385"),
    (r"Invalid or unsupported file uri: https?://", "not_found", "https://github.com/BoundaryML/baml/issues/1548"),
)
_UNFETCHED: Final = FetchAnswers(UNFETCHED)
#: Hosts whose ``https`` URIs are Google's own (the Files API's files, YouTube videos): passed
#: through untouched, as provider file ids are.
GOOGLE_HOSTS: Final = frozenset({"generativelanguage.googleapis.com", "youtube.com", "www.youtube.com",
                                 "m.youtube.com", "youtu.be"})
_PATH: Final = re.compile(r"Invalid value at '([^']+)'")
_ROOTS: Final = frozenset({"contents"})
_KEYS: Final = frozenset({"parts"})


def _either(obj: dict[str, Any], snake: str, camel: str) -> Any:
    return obj[snake] if snake in obj else obj.get(camel)


def _scan(parts: list[Json], host: Host | None) -> Iterator[tuple[list[Json], int, dict[str, Any], Host | None]]:
    for index, part in enumerate(parts):
        if not isinstance(part, dict):
            continue
        yield parts, index, part, host
        response = _either(part, "function_response", "functionResponse")
        if host is None and isinstance(response, dict) and isinstance(nested := response.get("parts"), list):
            yield from _scan(nested, (parts, index))


def _parts(body: Json) -> Iterator[tuple[list[Json], int, dict[str, Any], Host | None]]:
    """Every part of ``body["contents"]`` and of its function responses (its list, its index, the
    part, and the function response's place when nested), in document order."""
    contents = body.get("contents") if isinstance(body, dict) else None
    for content in contents if isinstance(contents, list) else ():
        if isinstance(content, dict) and isinstance(parts := content.get("parts"), list):
            yield from _scan(parts, None)


def _uri(part: dict[str, Any]) -> str | None:
    data = _either(part, "file_data", "fileData")
    uri = _either(data, "file_uri", "fileUri") if isinstance(data, dict) else None
    return uri if isinstance(uri, str) else None


def _fetched_image(part: dict[str, Any], uri: str, http: HttpRefs) -> bool:
    """A file URI the provider fetches itself that names an image: ``http(s)``, no reference,
    not Google's own, and an ``image/`` type (or, with no type given, an image file's name)."""
    if not is_web_url(uri) or http.rest(uri) is not None:
        return False
    try:
        host = urlsplit(uri).hostname
    except ValueError:
        return False
    if host in GOOGLE_HOSTS:
        return False
    data = _either(part, "file_data", "fileData")
    mime = _either(data, "mime_type", "mimeType") if isinstance(data, dict) else None
    return mime.lower().startswith("image/") if isinstance(mime, str) else url_name(uri) is not None


def _slot(parts: list[Json], index: int, part: dict[str, Any], host: Host | None, http: HttpRefs) -> Slot | None:
    """The image ``part`` is: a reference (an ``attachment:`` or ``http`` file URI), one the client
    inlined (``inline_data``, or ``inlineData``, of an ``image/`` type), one the provider fetches (a
    ``file_data`` part's ``http(s)`` image URL outside Google: ``_fetched_image``), or None."""
    uri = _uri(part)
    if uri is not None:
        ref = parse_url_ref(uri, http)
        if ref is not None:
            return Site(parts, index, ref, host)
        return Linked(parts, index, uri, host) if _fetched_image(part, uri, http) else None
    data = _either(part, "inline_data", "inlineData")
    mime = _either(data, "mime_type", "mimeType") if isinstance(data, dict) else None
    if isinstance(mime, str) and mime.lower().startswith("image/") and isinstance(b64 := data.get("data"), str):
        return Carried(parts, index, data, "data", b64, b64, host, mime)
    return None


def find_slots(body: Json, http: HttpRefs = NO_HTTP) -> list[Slot]:
    """Every image slot of ``body["contents"]``, function responses included, in document order."""
    return [slot for parts, index, part, host in _parts(body)
            if (slot := _slot(parts, index, part, host, http)) is not None]


def session_hint(body: Json) -> tuple[str, str] | None:
    """The session a Gemini body names: none of its fields is one."""
    return None


def opening(body: Json) -> Json:
    """The system instruction and the first content (``base.opening_message``: past a first
    content of bookkeeping alone, as Gemini CLI's router call opens with its ``<session_context>``)."""
    if not isinstance(body, dict):
        return None
    first = opening_message(body.get("contents"), untagged="user")
    return None if first is None else [_either(body, "system_instruction", "systemInstruction"), first]


def messages(body: Json) -> Json:
    """The conversation's contents, as the body lists them (None: it lists none)."""
    return listed(body, "contents")


def system(body: Json) -> Json:
    """The system instruction."""
    return _either(body, "system_instruction", "systemInstruction") if isinstance(body, dict) else None


def _is_image(part: dict[str, Any], http: HttpRefs) -> bool:
    for slot in (("inline_data", "inlineData"), ("file_data", "fileData")):
        data = _either(part, *slot)
        mime = _either(data, "mime_type", "mimeType") if isinstance(data, dict) else None
        if isinstance(mime, str) and mime.lower().startswith("image/"):
            return True
    uri = _uri(part)
    return uri is not None and (uri.startswith(URL_SCHEME) or http.rest(uri) is not None)


def count_images(body: Json, http: HttpRefs = NO_HTTP) -> int:
    """Every image part in ``body["contents"]``, function responses included: inline or file
    data of an ``image/`` type, or a reference (``attachment:`` or under ``http``: the proxy
    knows its type)."""
    return sum(1 for _, _, part, _ in _parts(body) if _is_image(part, http))


def _inline(part: dict[str, Any], inline: Inline) -> dict[str, Any]:
    kept = {k: v for k, v in part.items() if k not in ("file_data", "fileData")}
    if "fileData" in part:
        return {**kept, "inlineData": {"mimeType": inline.media_type, "data": inline.base64()}}
    return {**kept, "inline_data": {"mime_type": inline.media_type, "data": inline.base64()}}


def render(sites: list[Site], outcomes: tuple[Outcome, ...], inline: Inliner = PlainInline) -> None:
    if len(sites) != len(outcomes):
        raise ValueError("one outcome per site")
    get = inliner(inline)
    nested: list[tuple[Site, str]] = []
    for site, outcome in zip(sites, outcomes):
        if isinstance(outcome, Resolved):
            site.parent[site.index] = _inline(site.parent[site.index], get(outcome.image))
        elif site.host is None:
            part = site.parent[site.index]
            site.parent[site.index] = {**{k: v for k, v in part.items() if k not in _DATA_KEYS}, "text": outcome.text}
        else:
            nested.append((site, outcome.text))
    _move_out(nested)


def _move_out(placeholders: list[tuple[Site, str]]) -> None:
    """Function-response parts may only carry data: a placeholder there leaves the function
    response and follows it as a text part of the enclosing content, in document order."""
    removed: dict[int, tuple[list[Json], set[int]]] = {}
    follow: list[tuple[Host, Json]] = []
    for site, text in placeholders:
        assert site.host is not None and isinstance(site.index, int)
        removed.setdefault(id(site.parent), (site.parent, set()))[1].add(site.index)
        follow.append((site.host, {"text": text}))
    for parts, gone in removed.values():
        parts[:] = [part for i, part in enumerate(parts) if i not in gone]
    for (host_list, host_index), _ in follow:
        response = _either(host_list[host_index], "function_response", "functionResponse")
        if response.get("parts") == []:
            del response["parts"]  # nothing left to carry: drop the empty list
    insert_after(follow)


def error_body(code: str, message: str, status: int) -> dict[str, Any]:
    """Google's error shape; ``google-genai`` exposes it as ``APIError.details``."""
    return {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN"),
                      "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                   "reason": code, "domain": "projectionist"}]}}


def rejection(status: int, doc: Json) -> Rejection | None:
    """The error answer ``doc`` read as an image refusal: Google's message, the pointer of the
    part it names (``contents[2].parts[0].inline_data.data`` is ``/contents/2/parts/0``), if any,
    and whether it refused the image or its fetch."""
    error = error_object(doc)
    message = doc if isinstance(doc, str) else error.get("message") if error is not None else None
    if status != 400 or not isinstance(message, str):
        return None
    head = message[:SCAN_CHARS]
    fetch = _UNFETCHED.failure(head)
    if fetch is None and not _REJECTED.search(head):
        return None
    path = _PATH.search(head)
    return Rejection(message, part_pointer(path.group(1), _ROOTS, _KEYS) if path else None, fetch or "rejected")


def sign(method: str, url: str, headers: Mapping[str, str], body: bytes | None, credential: str) -> dict[str, str]:
    """The key in ``x-goog-api-key`` (it reads nothing of the request)."""
    return {"x-goog-api-key": credential}


def usage(doc: Json) -> dict[str, Any] | None:
    """``usageMetadata`` of a response (every chunk of a stream carries the running total)."""
    return member(doc, "usageMetadata")


def file_object(file_id: str, name: str | None, media_type: str, size: int, created_at: int) -> dict[str, Any]:
    """An admitted attachment as a Gemini ``File`` resource (what ``google-genai`` parses into
    ``types.File``): named ``files/sha256-<hex>``, its ``uri`` the ``attachment:`` reference (with
    the display name), which the SDK sends back as ``file_data.file_uri`` when the file is passed
    in ``contents``."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created_at))
    uri = URL_SCHEME + file_id + (f"?name={quote(name, safe='')}" if name else "")
    resource = {"name": FILE_NAME_PREFIX + file_id[len(ID_PREFIX):], "mimeType": media_type, "sizeBytes": str(size),
                "createTime": created, "updateTime": created, "uri": uri, "state": "ACTIVE", "source": "UPLOADED"}
    return {**resource, "displayName": name} if name else resource
