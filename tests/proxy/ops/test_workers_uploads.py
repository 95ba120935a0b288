"""Gemini uploads sent in several chunks through ``projectionist serve --workers 3``, real processes
on one port: the official ``google-genai`` SDK (its chunk size lowered, a new connection for every
request, so the kernel hands each chunk to any worker) and the bare protocol over fresh
connections, with ``query`` between the chunks. Every upload finishes with its bytes intact, a
finished URL opens nothing on any worker, and the chunks did land on several workers."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import pytest
from google import genai
from google.genai import _api_client, types
from PIL import Image

from tests.imaging import ref_id
from tests.proxy.ops.test_workers import fresh_connections, supervise  # noqa: F401  (the fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")

CHUNK = 16 * 1024
START, UPLOADS = "/upload/v1beta/files", "/v1/attachments/uploads/***"


def noise_png(width: int, height: int, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.frombytes("RGB", (width, height), random.Random(seed).randbytes(width * height * 3)).save(buf, "PNG")
    return buf.getvalue()


async def test_chunked_uploads_spread_over_three_workers_all_finish(
        supervise: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    served = await supervise("--data-dir", str(tmp_path / "d"), workers=3)
    monkeypatch.setattr(_api_client, "CHUNK_SIZE", CHUNK)  # the SDK's 8 MiB, made small: several chunks
    images = [noise_png(96, 80, seed=n) for n in range(4)]  # about 23 KiB each: two chunks
    assert all(1.3 * CHUNK < len(png) <= 2 * CHUNK for png in images)

    async with fresh_connections() as sdk_http:  # the SDK's own session, a new connection per request
        options = types.HttpOptions(base_url=served.url, api_version="v1beta", aiohttp_client=sdk_http)
        async with genai.Client(api_key="g-key", http_options=options).aio as client:
            for n, png in enumerate(images):
                file = await client.files.upload(file=io.BytesIO(png), config={"mime_type": "image/png",
                                                                              "display_name": f"n{n}.png"})
                assert file.uri == f"attachment:{ref_id(png)}?name=n{n}.png"
                assert file.size_bytes == len(png)

    png = noise_png(120, 90, seed=9)
    step = len(png) // 4
    async with fresh_connections() as http:
        async with http.post(f"{served.url}/upload/v1beta/files", json={"file": {}}, headers={
                "X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
                "X-Goog-Upload-Header-Content-Type": "image/png",
                "X-Goog-Upload-Header-Content-Length": str(len(png))}) as started:
            assert started.status == 200, await started.text()
            url = started.headers["X-Goog-Upload-URL"]
        for offset in range(0, 3 * step, step):
            async with http.post(url, data=png[offset:offset + step], headers={
                    "X-Goog-Upload-Command": "upload", "X-Goog-Upload-Offset": str(offset)}) as chunk:
                assert chunk.status == 200, await chunk.text()
            async with http.post(url, headers={"X-Goog-Upload-Command": "query"}) as query:
                assert query.headers["X-Goog-Upload-Size-Received"] == str(offset + step)
        async with http.post(url, data=png[3 * step:], headers={
                "X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": str(3 * step)}) as done:
            assert done.status == 200, await done.text()
        for _ in range(6):  # used once: refused wherever it lands
            async with http.post(url, data=png, headers={"X-Goog-Upload-Command": "upload, finalize",
                                                         "X-Goog-Upload-Offset": "0"}) as again:
                assert again.status == 404, await again.text()
        for data in [*images, png]:
            async with http.get(f"{served.url}/v1/attachments/{ref_id(data)}") as downloaded:
                assert downloaded.status == 200 and await downloaded.read() == data

    lines = [line for line in served.events("request") if line.get("path") in (START, UPLOADS)]
    sdk = lines[:3 * len(images)]  # each SDK upload: its start and two chunks
    assert [line["path"] for line in sdk].count(UPLOADS) == 2 * len(images)
    assert len({line["pid"] for line in sdk}) >= 2  # the SDK's uploads did cross workers
    assert len({line["pid"] for line in lines[3 * len(images):]}) >= 2  # and so did the bare protocol's
    assert [line["status"] for line in lines if line["status"] not in (200, 404)] == []
