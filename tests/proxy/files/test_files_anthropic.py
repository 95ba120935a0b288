"""The official ``anthropic`` SDK's Files API against the proxy: image uploads become attachments
whose ``sha256:`` ids work as ``source: {type: "file"}`` references; everything else is the
upstream's own Files API, reached unchanged."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import anthropic
import pytest
from aiohttp import web

from projectionist.policy.events import Quarantine
from projectionist.policy.fold import placeholder
from projectionist.policy.model import ImageRef
from projectionist.proxy.stores.s3 import S3Store
from projectionist.proxy.inbound.services import SERVICES
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness
from tests.fakes import MESSAGE
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]
SID = "files-1"
UPSTREAM_FILE = {"id": "file_011CNha8iCJcU1wXNR6q4V8w", "type": "file", "filename": "report.pdf",
                 "mime_type": "application/pdf", "size_bytes": 0, "created_at": "2025-04-14T12:00:00Z",
                 "downloadable": False}


def client_for(harness: Harness, session: str | None = SID, path: str = "") -> anthropic.AsyncAnthropic:
    headers = {"X-Session-Id": session} if session else {}
    return anthropic.AsyncAnthropic(base_url=str(harness.client.make_url(path)), api_key="sk-ant-client",
                                    default_headers=headers, max_retries=0)


def image_from_file(file_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "file", "file_id": file_id}, **extra}


async def ask(client: anthropic.AsyncAnthropic, *blocks: dict[str, Any]) -> Any:
    """One user turn of ``blocks`` through ``client.messages.create``."""
    messages: Any = [{"role": "user", "content": list(blocks)}]
    return await client.messages.create(model="claude", max_tokens=10, messages=messages)


async def stored_objects(harness: Harness) -> list[str]:
    """Hex names of the image objects the store holds, on either backend."""
    inner = harness.store.inner
    if isinstance(inner, S3Store):
        client = await inner.client()
        listed = await client.list_objects_v2(Bucket=inner.bucket, Prefix=f"{inner.prefix}objects/")
        return [item["Key"].rsplit("/", 1)[-1] for item in listed.get("Contents", [])]
    root = Path(harness.app[SERVICES].config.store_path)
    return [p.name for p in root.rglob("*") if p.is_file() and "objects" in p.parts and p.suffix != ".json"]


async def test_image_upload_use_metadata_delete_then_placeholder(harness: Harness) -> None:
    png = make_image(width=5, height=4, color=120)
    expected_id = ref_id(png)
    async with client_for(harness) as client:
        uploaded = await client.beta.files.upload(file=("shot.png", png, "image/png"))
        assert uploaded.id == expected_id
        assert uploaded.id.startswith("sha256:") and len(uploaded.id) == len("sha256:") + 64
        assert uploaded.type == "file"
        assert uploaded.filename == "shot.png"
        assert uploaded.mime_type == "image/png"
        assert uploaded.size_bytes == len(png)
        assert isinstance(uploaded.created_at, datetime)
        assert uploaded.downloadable is True
        assert harness.upstream.received == []  # admitted locally, never sent to the upstream

        # the id is a file-id reference: the image is inlined upstream as a base64 source
        message = await ask(client, {"type": "text", "text": "what is this?"},
                            image_from_file(uploaded.id, cache_control={"type": "ephemeral"}))
        assert message.content[0].text == "Hello from the fake upstream."
        sent = harness.upstream.last
        assert sent.path_qs == "/v1/messages"
        blocks = sent.json()["messages"][0]["content"]
        assert blocks[0] == {"type": "text", "text": "what is this?"}
        assert blocks[1] == {"type": "image", "cache_control": {"type": "ephemeral"}, "source": {
            "type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}}
        assert harness.store.reads[expected_id] == 1

        meta = await client.beta.files.retrieve_metadata(uploaded.id)
        assert meta.model_dump() == uploaded.model_dump()

        content = await client.beta.files.download(uploaded.id)
        assert await content.read() == png

        deleted = await client.with_options(api_key="admintok").beta.files.delete(uploaded.id)  # admin only
        assert deleted.id == expected_id and deleted.type == "file_deleted"
        assert await harness.events(SID) == []

        # the next request of the same session: the not_found placeholder, recorded once
        await ask(client, {"type": "text", "text": "and now?"}, image_from_file(uploaded.id))
        text = placeholder(ImageRef(expected_id), Quarantine(expected_id, "not_found", retryable=False))
        assert text == f"[image unavailable: not_found ({expected_id[:15]})]"
        assert harness.upstream.last.json()["messages"][0]["content"] == [
            {"type": "text", "text": "and now?"}, {"type": "text", "text": text}]
        reads = harness.store.reads[expected_id]

        # and again: same bytes upstream, no new read, no new event
        await ask(client, {"type": "text", "text": "and now?"}, image_from_file(uploaded.id))
        assert harness.upstream.received[-1].body == harness.upstream.received[-2].body
        assert harness.store.reads[expected_id] == reads

    events = await harness.events(SID)
    assert len(events) == 1
    assert events[0]["type"] == "attachment/quarantine"
    assert events[0]["data"] == {"attachment_id": expected_id, "failure": "not_found", "retryable": False}


async def test_metadata_and_delete_of_a_missing_sha256_file_are_404(harness: Harness) -> None:
    png = make_image(color=121)
    async with client_for(harness) as client:
        uploaded = await client.beta.files.upload(file=("a.png", png, "image/png"))
        admin = client.with_options(api_key="admintok")
        await admin.beta.files.delete(uploaded.id)
        with pytest.raises(anthropic.NotFoundError) as gone_meta:
            await client.beta.files.retrieve_metadata(uploaded.id)
        assert gone_meta.value.error_code == "FILE_NOT_FOUND"
        with pytest.raises(anthropic.NotFoundError) as gone_delete:
            await admin.beta.files.delete(uploaded.id)
        assert gone_delete.value.error_code == "FILE_NOT_FOUND"
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.beta.files.retrieve_metadata("sha256:XYZ")
        assert bad.value.error_code == "INVALID_ATTACHMENT_REF"
    assert harness.upstream.received == []


async def test_uploading_the_same_image_twice_gives_the_same_file(harness: Harness) -> None:
    jpeg = make_image(media_type="image/jpeg", color=122)
    async with client_for(harness) as client:
        first = await client.beta.files.upload(file=("one.jpg", jpeg, "image/jpeg"))
        second = await client.beta.files.upload(file=("two.jpg", jpeg, "image/jpeg"))
    assert first.id == second.id == ref_id(jpeg)
    assert first.mime_type == second.mime_type == "image/jpeg"
    assert first.filename == "one.jpg"  # the first admission's name is the stored one
    assert await stored_objects(harness) == [first.id.removeprefix("sha256:")]


async def test_image_upload_through_a_named_anthropic_upstream(make_harness: MakeHarness, upstream: Any) -> None:
    harness = await make_harness(**{"upstreams.claude": {"format": "anthropic", "url": upstream.url}})
    png = make_image(color=123)
    async with client_for(harness, path="/u/claude") as client:
        uploaded = await client.beta.files.upload(file=("named.png", png, "image/png"))
        assert uploaded.id == ref_id(png) and uploaded.filename == "named.png"
        await ask(client, image_from_file(uploaded.id))
    [sent] = harness.upstream.received
    assert sent.path_qs == "/v1/messages"
    assert sent.json()["messages"][0]["content"][0]["source"]["data"] == base64.b64encode(png).decode()


@pytest.mark.parametrize(("filename", "data", "media_type"), [
    ("report.pdf", b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n", "application/pdf"),
    ("notes.txt", b"hello, plain text\n", "text/plain"),
    ("fake.png", b"not really a png at all", "image/png"),  # the declared type does not make it an image
])
async def test_non_image_upload_is_forwarded_to_the_upstream_echo(
    harness: Harness, filename: str, data: bytes, media_type: str
) -> None:
    async with client_for(harness) as client:
        answer = await client.beta.files.upload(file=(filename, data, media_type))
    [got] = harness.upstream.received
    headers = {k.lower(): v for k, v in got.headers.items()}
    assert (got.method, got.path_qs) == ("POST", "/v1/files")
    assert headers["anthropic-version"]
    assert headers.get("x-api-key", headers.get("authorization", "").removeprefix("Bearer ")) == "sk-ant-client"
    assert "x-session-id" not in headers
    assert headers["content-type"].startswith("multipart/form-data")
    assert headers["content-length"] == str(len(got.body))
    assert data in got.body and f'filename="{filename}"'.encode() in got.body
    # FakeUpstream's echo is not an Anthropic file object: the SDK builds its model leniently, so
    # the echo fields arrive as extras and `id` is None (no exception is raised).
    assert answer.id is None
    assert answer.model_extra == {"method": "POST", "path_qs": "/v1/files", "body_len": len(got.body)}
    assert await stored_objects(harness) == []
    assert await harness.store.stat(ref_id(data)) is None
    assert harness.store.total == 0


class AnthropicFiles:
    """A small Anthropic-like upstream: Files API with provider ids, and Messages."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, str, dict[str, str], bytes]] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/files", self.upload)
        app.router.add_get("/v1/files/{id}", self.metadata)
        app.router.add_delete("/v1/files/{id}", self.delete)
        app.router.add_post("/v1/messages", self.messages)
        return app

    async def _hit(self, request: web.Request) -> bytes:
        body = await request.read()
        self.hits.append((request.method, request.path_qs, dict(request.headers), body))
        return body

    async def upload(self, request: web.Request) -> web.Response:
        body = await self._hit(request)
        return web.json_response({**UPSTREAM_FILE, "size_bytes": len(body)})

    async def metadata(self, request: web.Request) -> web.Response:
        await self._hit(request)
        if request.match_info["id"] != UPSTREAM_FILE["id"]:
            return web.json_response({"type": "error", "error": {"type": "not_found_error", "message": "nope"}},
                                     status=404)
        return web.json_response(UPSTREAM_FILE)

    async def delete(self, request: web.Request) -> web.Response:
        await self._hit(request)
        return web.json_response({"id": request.match_info["id"], "type": "file_deleted"})

    async def messages(self, request: web.Request) -> web.Response:
        await self._hit(request)
        return web.json_response(MESSAGE)


@pytest.fixture
async def files_upstream(aiohttp_server: Any) -> tuple[AnthropicFiles, str]:
    fake = AnthropicFiles()
    server = await aiohttp_server(fake.app())
    return fake, str(server.make_url("")).rstrip("/")


async def test_non_image_upload_reaches_the_upstream_files_api_and_its_id_passes_through(
    make_harness: MakeHarness, files_upstream: tuple[AnthropicFiles, str]
) -> None:
    fake, url = files_upstream
    harness = await make_harness(**{"upstreams.anthropic": {"format": "anthropic", "url": url}})
    pdf = b"%PDF-1.4\n" + bytes(range(256)) * 8 + b"\n%%EOF\n"
    async with client_for(harness) as client:
        uploaded = await client.beta.files.upload(file=("report.pdf", pdf, "application/pdf"))
        assert uploaded.id == UPSTREAM_FILE["id"]
        assert uploaded.filename == "report.pdf" and uploaded.mime_type == "application/pdf"
        method, path_qs, headers, body = fake.hits[-1]
        assert (method, path_qs) == ("POST", "/v1/files") and pdf in body
        assert int(headers["Content-Length"]) == len(body) == uploaded.size_bytes

        meta = await client.beta.files.retrieve_metadata(uploaded.id)
        assert meta.id == UPSTREAM_FILE["id"]
        assert fake.hits[-1][:2] == ("GET", f"/v1/files/{UPSTREAM_FILE['id']}")

        # a provider file id in a message is not an attachment reference: it passes through untouched
        block = {"type": "document", "source": {"type": "file", "file_id": uploaded.id}}
        image = image_from_file(uploaded.id)
        await ask(client, block, image, {"type": "text", "text": "summarise"})
        assert json.loads(fake.hits[-1][3])["messages"][0]["content"] == [
            block, image, {"type": "text", "text": "summarise"}]

        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.beta.files.retrieve_metadata("file_doesnotexist")
        assert missing.value.type == "not_found_error"  # the upstream's own error, unchanged

        deleted = await client.beta.files.delete(uploaded.id)
        assert deleted.id == UPSTREAM_FILE["id"] and deleted.type == "file_deleted"
        assert fake.hits[-1][:2] == ("DELETE", f"/v1/files/{UPSTREAM_FILE['id']}")
    assert await stored_objects(harness) == []
    assert harness.store.total == 0
    assert await harness.events(SID) == []
