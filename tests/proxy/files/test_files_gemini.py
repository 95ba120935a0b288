"""The official ``google-genai`` SDK's Files API against the proxy: a resumable upload of an image
becomes an attachment whose ``File`` works in ``contents``; other uploads reach the upstream's own
Files API unchanged; the upload sessions' protocol and bounds."""

from __future__ import annotations

import base64
import io
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from google import genai
from google.genai import errors, types
from structlog.testing import capture_logs

from projectionist.proxy.inbound.resumable import Uploads
from projectionist.proxy.inbound.services import SERVICES
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness
from tests.fakes import FakeUpstream
from tests.imaging import make_image, ref_id

pytestmark = pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")

MakeHarness = Callable[..., Awaitable[Harness]]
SID = "gemini-files"
MODEL = "gemini-2.0-flash"
START = {"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start"}


@pytest.fixture
async def gharness(make_harness: MakeHarness, upstream: FakeUpstream) -> Harness:
    return await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})


def gclient(harness: Harness, session: str | None = SID, api_key: str = "g-key", base: str = "") -> Any:
    headers = {"X-Session-Id": session} if session else {}
    options = types.HttpOptions(base_url=str(harness.client.make_url(base)), api_version="v1beta", headers=headers)
    return genai.Client(api_key=api_key, http_options=options).aio


async def upload(client: Any, data: bytes, mime_type: str = "image/png", name: str | None = "shot.png") -> types.File:
    config: dict[str, Any] = {"mime_type": mime_type}
    if name:
        config["display_name"] = name
    file: types.File = await client.files.upload(file=io.BytesIO(data), config=config)
    return file


async def test_upload_use_get_delete_then_placeholder(gharness: Harness) -> None:
    png = make_image(width=5, height=4, color=190)
    aid = ref_id(png)
    async with gclient(gharness) as client:
        file = await upload(client, png)
        assert file.name == "files/sha256-" + aid.removeprefix("sha256:")
        assert file.uri == f"attachment:{aid}?name=shot.png"
        assert (file.mime_type, file.size_bytes, file.display_name) == ("image/png", len(png), "shot.png")
        assert file.state == types.FileState.ACTIVE
        assert gharness.upstream.received == []  # admitted here, never sent to Google
        assert len(gharness.app[SERVICES].uploads) == 0  # the session ended with the upload

        # the returned File, passed in contents, is a file_data reference: inlined upstream
        await client.models.generate_content(model=MODEL, contents=[file, "what is this?"])
        sent = gharness.upstream.last
        assert sent.path_qs == f"/v1beta/models/{MODEL}:generateContent"
        assert sent.json()["contents"][0]["parts"] == [
            {"inlineData": {"mimeType": "image/png", "data": base64.b64encode(png).decode()}},
            {"text": "what is this?"}]

        got = await client.files.get(name=file.name)
        assert got.model_dump(exclude_none=True) == file.model_dump(exclude_none=True)

        with pytest.raises(errors.ClientError) as not_admin:
            await client.files.delete(name=file.name)
        assert not_admin.value.code == 403
        async with gclient(gharness, api_key="admintok") as admin:
            await admin.files.delete(name=file.name)
        with pytest.raises(errors.ClientError) as gone:
            await client.files.get(name=file.name)
        assert gone.value.code == 404 and gone.value.details["error"]["details"][0]["reason"] == "FILE_NOT_FOUND"

        # the same File in the same session: a placeholder, recorded once
        await client.models.generate_content(model=MODEL, contents=[file, "and now?"])
        assert gharness.upstream.last.json()["contents"][0]["parts"] == [
            {"text": f'[image unavailable: not_found; "shot.png" ({aid[:15]})]'}, {"text": "and now?"}]
    events = await gharness.events(SID)
    assert [(e["type"], e["data"]["attachment_id"], e["data"]["failure"]) for e in events] == [
        ("attachment/quarantine", aid, "not_found")]
    assert [r.path_qs for r in gharness.upstream.received] == [f"/v1beta/models/{MODEL}:generateContent"] * 2


async def test_upload_through_a_named_upstream_and_without_a_name(gharness: Harness) -> None:
    jpeg = make_image(media_type="image/jpeg", color=191)
    async with gclient(gharness, base="/u/gemini") as client:
        file = await upload(client, jpeg, "image/jpeg", name=None)
        assert file.uri == f"attachment:{ref_id(jpeg)}" and file.display_name is None
        assert file.mime_type == "image/jpeg"
        assert (await client.files.get(name=file.name)).uri == file.uri
    assert gharness.upstream.received == []


async def test_bytes_that_are_not_the_declared_image_are_refused(gharness: Harness) -> None:
    async with gclient(gharness) as client:
        with pytest.raises(errors.ClientError) as refused:
            await upload(client, b"not a png at all, only text", "image/png")
        assert refused.value.code == 400
        assert refused.value.details["error"]["details"][0]["reason"] == "INVALID_IMAGE"
        with pytest.raises(errors.ClientError) as mismatch:
            await upload(client, make_image(color=192), "image/gif")
        assert mismatch.value.details["error"]["details"][0]["reason"] == "MEDIA_TYPE_MISMATCH"
    assert await gharness.store.stat(ref_id(make_image(color=192))) is None
    assert gharness.upstream.received == [] and len(gharness.app[SERVICES].uploads) == 0


class GoogleFiles:
    """A Google-like resumable upload endpoint: its upload URL points at itself."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, str, dict[str, str], bytes]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/upload/v1beta/files", self.upload)
        return app

    async def upload(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.hits.append((request.method, request.path_qs, dict(request.headers), body))
        if request.headers.get("X-Goog-Upload-Command") == "start":
            url = request.url.with_query(upload_id="google-1", upload_protocol="resumable")
            return web.Response(headers={"X-Goog-Upload-URL": str(url), "X-Goog-Upload-Status": "active"})
        return web.json_response({"file": {"name": "files/google-1", "mimeType": request.headers.get(
            "X-Goog-Upload-Header-Content-Type", ""), "sizeBytes": str(len(body)), "state": "ACTIVE",
            "uri": "https://generativelanguage.googleapis.com/v1beta/files/google-1"}},
            headers={"X-Goog-Upload-Status": "final"})


@pytest.mark.parametrize(("data", "mime_type"), [
    (b"%PDF-1.7\n1 0 obj << >> endobj\n%%EOF\n", "application/pdf"),
    (make_image(color=193), "image/heic"),  # an image type the store does not admit
    (make_image(color=194), "image/png"),   # declared larger than store.limits.max_bytes
])
async def test_other_uploads_go_to_the_upstreams_files_api(
    make_harness: MakeHarness, aiohttp_server: Any, data: bytes, mime_type: str
) -> None:
    google = GoogleFiles()
    server = await aiohttp_server(google.app())
    limits = {"store.limits.max_bytes": len(data) - 1} if mime_type == "image/png" else {}
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": str(server.make_url(""))},
                                    **limits})
    async with gclient(harness) as client:
        file = await upload(client, data, mime_type)
    assert file.name == "files/google-1" and file.size_bytes == len(data)
    (_, start_path, start_headers, _), (_, bytes_path, _, sent) = google.hits
    assert start_path == "/upload/v1beta/files"
    assert start_headers["x-goog-api-key"] == "g-key" and "X-Session-Id" not in start_headers
    assert start_headers["X-Goog-Upload-Header-Content-Type"] == mime_type
    assert bytes_path == "/upload/v1beta/files?upload_id=google-1&upload_protocol=resumable" and sent == data
    assert await harness.store.stat(ref_id(data)) is None


async def test_chunked_protocol_offsets_query_cancel_and_unknown_urls(gharness: Harness) -> None:
    png = make_image(width=40, height=30, color=195)
    headers = {**START, "X-Goog-Upload-Header-Content-Length": str(len(png)),
               "X-Goog-Upload-Header-Content-Type": "image/png", "X-Session-Id": SID}
    started = await gharness.client.post("/upload/v1beta/files", json={"file": {"displayName": "big.png"}},
                                         headers=headers)
    assert started.status == 200 and started.headers["X-Goog-Upload-Status"] == "active"
    url = started.headers["X-Goog-Upload-URL"]
    assert url.startswith(str(gharness.client.make_url("/v1/attachments/uploads/")))
    path = url[len(str(gharness.client.make_url(""))):]

    async def send(command: str, data: bytes = b"", offset: int | None = None) -> Any:
        extra = {"X-Goog-Upload-Offset": str(offset)} if offset is not None else {}
        return await gharness.client.post(path, data=data, headers={"X-Goog-Upload-Command": command, **extra})

    first = await send("upload", png[:100], 0)
    assert first.status == 200 and first.headers["X-Goog-Upload-Status"] == "active"
    wrong = await send("upload", png[100:], 50)
    assert wrong.status == 400 and wrong.headers["X-Goog-Upload-Status"] == "final"
    assert (await wrong.json())["error"]["details"][0]["reason"] == "INVALID_UPLOAD"
    too_long = await send("upload, finalize", png[100:] + b"extra", 100)
    assert too_long.status == 400
    query = await send("query")
    assert query.headers["X-Goog-Upload-Size-Received"] == "100"
    done = await send("upload, finalize", png[100:], 100)
    assert done.status == 200 and done.headers["X-Goog-Upload-Status"] == "final"
    assert (await done.json())["file"]["uri"] == f"attachment:{ref_id(png)}?name=big.png"
    again = await send("upload, finalize", png, 0)  # one upload per URL
    assert again.status == 404 and again.headers["X-Goog-Upload-Status"] == "final"
    assert (await again.json())["error"]["details"][0]["reason"] == "UPLOAD_NOT_FOUND"

    started = await gharness.client.post("/upload/v1beta/files", headers=headers)
    cancel_path = started.headers["X-Goog-Upload-URL"][len(str(gharness.client.make_url(""))):]
    cancelled = await gharness.client.post(cancel_path, headers={"X-Goog-Upload-Command": "cancel"})
    assert cancelled.headers["X-Goog-Upload-Status"] == "cancelled"
    assert len(gharness.app[SERVICES].uploads) == 0
    assert gharness.upstream.received == []


async def test_client_tokens_guard_the_start_and_the_url_is_the_credential_for_the_bytes(
    make_harness: MakeHarness, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "ctok")
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    png = make_image(color=196)
    async with gclient(harness, api_key="wrong") as stranger:
        with pytest.raises(errors.ClientError) as denied:
            await upload(stranger, png)
        assert denied.value.code == 401
    async with gclient(harness, api_key="ctok") as client:  # the SDK sends no key with the bytes
        file = await upload(client, png)
    assert file.uri == f"attachment:{ref_id(png)}?name=shot.png"
    guessed = await harness.client.post("/v1/attachments/uploads/guessed-token", data=png,
                                        headers={"X-Goog-Upload-Command": "upload, finalize"})
    assert guessed.status == 404 and upstream.received == []


def test_upload_sessions_are_bounded_in_count_bytes_and_age() -> None:
    now = [0.0]
    uploads = Uploads(max_sessions=8, max_bytes=400, ttl=60.0, clock=lambda: now[0], wall=lambda: now[0])
    first = uploads.open("image/png", 100, None, "c1")
    others = [uploads.open("image/png", 40, "b.png", f"c{n}") for n in range(2, 9)]  # 8 clients, 380 bytes
    with pytest.raises(Exception) as full:
        uploads.open("image/png", 1, None, "c9")
    assert getattr(full.value, "code", None) == "UPLOADS_BUSY" and getattr(full.value, "status", None) == 503
    uploads.close(others[0])
    with pytest.raises(Exception) as heavy:
        uploads.open("image/png", 61, None, "c9")  # 340 + 61 bytes reserved would pass 400
    assert getattr(heavy.value, "code", None) == "UPLOADS_BUSY"
    now[0] = 61.0  # every session is older than the TTL now
    token = uploads.open("image/png", 100, None, "c1")
    assert len(uploads) == 1 and uploads.get(token).size == 100
    with pytest.raises(Exception) as expired:
        uploads.get(first)
    assert getattr(expired.value, "code", None) == "UPLOAD_NOT_FOUND"
    assert len(token) >= 40 and token not in (first, uploads.open("image/png", 0, None, "c2"))


def test_one_client_holds_at_most_a_quarter_of_the_upload_slots_and_bytes() -> None:
    uploads = Uploads(max_sessions=32, max_bytes=400, ttl=600.0)
    mine = [uploads.open("image/png", 10, None, "greedy") for _ in range(8)]
    with pytest.raises(Exception) as slots:
        uploads.open("image/png", 10, None, "greedy")  # a ninth slot: a quarter of 32 is 8
    assert getattr(slots.value, "code", None) == "UPLOADS_BUSY"
    assert uploads.open("image/png", 10, None, "someone else")  # the others still get theirs
    uploads.close(mine[0])
    with pytest.raises(Exception) as heavy:
        uploads.open("image/png", 40, None, "greedy")  # 70 + 40 bytes: over a quarter of 400
    assert getattr(heavy.value, "code", None) == "UPLOADS_BUSY"


async def test_other_file_names_pass_through_and_a_bad_sha256_name_is_refused(gharness: Harness) -> None:
    async with gclient(gharness) as client:
        await client.files.get(name="files/abc-123")
        with pytest.raises(errors.ClientError) as bad:
            await client.files.get(name="files/sha256-zz")
        assert bad.value.code == 400 and bad.value.details["error"]["details"][0]["reason"] == "INVALID_ATTACHMENT_REF"
    [sent] = gharness.upstream.received
    assert (sent.method, sent.path_qs) == ("GET", "/v1beta/files/abc-123")
    assert sent.headers["x-goog-api-key"] == "g-key"


async def test_a_declared_size_of_non_ascii_digits_opens_no_upload_here(gharness: Harness) -> None:
    # str.isdigit() is true of '²', which int() refuses: the start is not ours to admit (forwarded
    # as any other), never a 500.
    for size in ["²", "1²", "١٠٠"]:
        headers = {**START, "X-Goog-Upload-Header-Content-Length": size,
                   "X-Goog-Upload-Header-Content-Type": "image/png", "X-Session-Id": SID}
        started = await gharness.client.post("/upload/v1beta/files", json={"file": {}}, headers=headers)
        assert started.status == 200 and "X-Goog-Upload-URL" not in started.headers, size
    assert len(gharness.upstream.received) == 3 and len(gharness.app[SERVICES].uploads) == 0


async def test_the_upload_url_is_under_the_configured_public_url(make_harness: MakeHarness, upstream: FakeUpstream) -> None:
    # Behind a TLS terminator at a path prefix, the origin the request reached (http, no prefix)
    # would send the upload's credential and bytes in clear text, or to another application.
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url},
                                    "server.public_url": "https://llm.example.com/proxy"})
    png = make_image(width=20, height=10, color=3)
    headers = {**START, "X-Goog-Upload-Header-Content-Length": str(len(png)),
               "X-Goog-Upload-Header-Content-Type": "image/png", "Host": "attacker.example"}
    started = await harness.client.post("/upload/v1beta/files", json={"file": {}}, headers=headers)
    assert started.status == 200
    url = started.headers["X-Goog-Upload-URL"]
    assert url.startswith("https://llm.example.com/proxy/v1/attachments/uploads/"), url
    path = url.removeprefix("https://llm.example.com/proxy")
    done = await harness.client.post(path, data=png, headers={"X-Goog-Upload-Command": "upload, finalize"})
    assert done.status == 200 and (await done.json())["file"]["name"] == f"files/sha256-{ref_id(png)[7:]}"


async def test_the_upload_url_s_token_never_reaches_the_log(gharness: Harness) -> None:
    # The token in the upload URL is the upload's only credential: whoever reads the log line
    # could send or cancel the bytes of an upload under way.
    png = make_image(width=20, height=10, color=5)
    headers = {**START, "X-Goog-Upload-Header-Content-Length": str(len(png)),
               "X-Goog-Upload-Header-Content-Type": "image/png", "X-Session-Id": SID}
    with capture_logs() as logs:
        started = await gharness.client.post("/upload/v1beta/files", json={"file": {}}, headers=headers)
        token = started.headers["X-Goog-Upload-URL"].rsplit("/", 1)[1]
        for prefix in ("", f"/s/{SID}"):
            query = await gharness.client.post(f"{prefix}/v1/attachments/uploads/{token}",
                                               headers={"X-Goog-Upload-Command": "query"})
            assert query.status == 200
        done = await gharness.client.post(f"/v1/attachments/uploads/{token}", data=png,
                                          headers={"X-Goog-Upload-Command": "upload, finalize"})
        assert done.status == 200
    lines = [entry for entry in logs if entry["event"] == "request"]
    assert len(lines) == 4 and not any(token in repr(entry) for entry in logs)
    assert [line["path"] for line in lines[1:]] == ["/v1/attachments/uploads/***", f"/s/{SID}/v1/attachments/uploads/***",
                                                    "/v1/attachments/uploads/***"]


def test_a_signed_upload_token_opens_the_upload_on_another_process_of_the_deployment() -> None:
    key = b"k" * 32
    started = Uploads(key=key)
    token = started.open("image/png", 40, "a.png", "c1")
    elsewhere = Uploads(key=key)  # another worker or replica of the same deployment
    upload = elsewhere.get(token)
    assert (upload.media_type, upload.size, upload.name, upload.owner) == ("image/png", 40, "a.png", "c1")
    elsewhere.close(token)  # finished there: that process never opens it again
    with pytest.raises(Exception) as used:
        elsewhere.get(token)
    assert getattr(used.value, "code", None) == "UPLOAD_NOT_FOUND"
    for forged in (Uploads(key=b"x" * 32), Uploads(key=key, wall=lambda: 1e12)):  # another key; too late
        with pytest.raises(Exception) as refused:
            forged.get(token)
        assert getattr(refused.value, "code", None) == "UPLOAD_NOT_FOUND"
    payload, _, mac = token.rpartition(".")
    with pytest.raises(Exception) as tampered:
        Uploads(key=key).get(payload[:-2] + "AA." + mac)
    assert getattr(tampered.value, "code", None) == "UPLOAD_NOT_FOUND"
