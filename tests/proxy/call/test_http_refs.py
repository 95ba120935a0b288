"""The HTTP form of references end to end: the upload answer's ``href``, its projection in every
format exactly like the ``attachment:`` form (only under ``server.public_url``), ``GET`` of it
serving verified bytes, attachment ids in Chat ``file`` parts, Responses ``input_file`` and
Anthropic ``document`` blocks, replay of an HTTP-form call, and the official ``openai`` SDK
sending the ``href`` as an ``image_url``. The adapters alone: ``tests/adapters/test_http_refs.py``."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import msgspec
import openai
import pytest

from tests.conftest import ADMIN, BACKENDS, Harness
from tests.fakes import FakeUpstream
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]
DEFAULT = "http://127.0.0.1:8787"  # the listen address of the test config: the default public URL
SID = {"X-Session-Id": "h"}


@pytest.fixture
async def web(make_harness: MakeHarness, upstream: FakeUpstream) -> Harness:
    """A proxy whose gemini upstream is the fake one too, recording in full."""
    return await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url},
                                 "record.mode": "full"})


async def upload(harness: Harness, data: bytes, name: str | None = None) -> dict[str, Any]:
    resp = await harness.client.post("/v1/attachments", data=data, params={"name": name} if name else {},
                                     headers={"Content-Type": "image/png"})
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


#: One request per format with ``URL`` where its reference goes: (path, body).
FORMATS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "openai_chat": ("/v1/chat/completions", lambda url: {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url, "detail": "low"}}]}]}),
    "openai_responses": ("/v1/responses", lambda url: {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": url, "detail": "auto"}]}]}),
    "anthropic_messages": ("/v1/messages", lambda url: {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}},
                                     {"type": "text", "text": "look"}]}]}),
    "gemini": ("/v1beta/models/g:generateContent", lambda url: {"contents": [{"role": "user", "parts": [
        {"text": "look"}, {"file_data": {"file_uri": url, "mime_type": "image/png"}}]}]}),
}


async def sent(harness: Harness, path: str, body: dict[str, Any], session: str = "h") -> bytes:
    resp = await harness.client.post(path, json=body, headers={"X-Session-Id": session})
    assert resp.status == 200, await resp.text()
    await resp.read()
    return harness.upstream.last.body


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_every_format_projects_the_href_exactly_like_the_attachment_url(web: Harness, fmt: str) -> None:
    data = make_image(color=150)
    answer = await upload(web, data, "shot one.png")
    assert answer["href"] == f"{DEFAULT}/v1/attachments/{ref_id(data)}.png?name=shot%20one.png"
    path, body = FORMATS[fmt]
    by_href = await sent(web, path, body(answer["href"]))
    by_url = await sent(web, path, body(answer["url"]))
    assert by_href == by_url
    assert base64.b64encode(data) in by_href and b"/v1/attachments/" not in by_href


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_a_missing_href_gets_the_named_placeholder_and_a_quarantine(web: Harness, fmt: str) -> None:
    gone = ref_id(make_image(color=151))
    path, body = FORMATS[fmt]
    upstream = await sent(web, path, body(f"{DEFAULT}/v1/attachments/{gone}?name=old.png"), session=f"q-{fmt}")
    assert f'[image unavailable: not_found; \\"old.png\\" ({gone[:15]})]'.encode() in upstream
    events = await web.events(f"q-{fmt}")
    assert [e["data"]["attachment_id"] for e in events if e["type"] == "attachment/quarantine"] == [gone]


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8787.evil/v1/attachments/{id}",
    "http://127.0.0.1:87870/v1/attachments/{id}",
    "http://localhost:8787/v1/attachments/{id}",
    "https://127.0.0.1:8787/v1/attachments/{id}",
    "http://127.0.0.1:8787/v1/x/../attachments/{id}",
    "http://127.0.0.1:8787/v1/%61ttachments/{id}",
    "https://images.example.com/v1/attachments/{id}",
])
async def test_other_urls_pass_through_untouched(web: Harness, url: str) -> None:
    data = make_image(color=152)
    answer = await upload(web, data)
    other = url.format(id=answer["id"])
    path, body = FORMATS["openai_chat"]
    alone = body(other)
    raw = msgspec.json.encode(alone)
    resp = await web.client.post(path, data=raw, headers={"Content-Type": "application/json", **SID})
    assert resp.status == 200
    assert web.upstream.last.body == raw  # nothing to project: the client's own bytes
    mixed = body(other)
    mixed["messages"][0]["content"].append({"type": "image_url", "image_url": {"url": answer["url"]}})
    parts = msgspec.json.decode(await sent(web, path, mixed))["messages"][0]["content"]
    assert parts[1] == {"type": "image_url", "image_url": {"url": other, "detail": "low"}}
    assert parts[2]["image_url"]["url"].startswith("data:image/png;base64,")


@pytest.mark.parametrize("tail", [
    "sha256:" + "ab" * 31,                       # too short
    "sha256%3A" + "ab" * 32,                     # a percent-encoded id
    "../attachments/sha256:" + "ab" * 32,        # '..' after the prefix
    "sha256:" + "ab" * 32 + "?name=a&x=1",
    "sha256:" + "ab" * 32 + ".exe",             # not an image extension
    "sha256:" + "ab" * 32 + ".png.png",
])
@pytest.mark.parametrize("fmt", ["openai_chat", "gemini"])
async def test_a_malformed_href_is_invalid_attachment_ref(web: Harness, tail: str, fmt: str) -> None:
    path, body = FORMATS[fmt]
    request = body(f"{DEFAULT}/v1/attachments/{tail}")
    request["sha256:"] = "so the body is decoded"  # a body without 'sha256:' is forwarded as it came
    resp = await web.client.post(path, json=request, headers=SID)
    assert resp.status == 400
    assert resp.headers["x-projectionist-error-code"] == "INVALID_ATTACHMENT_REF"
    assert web.upstream.received == [] and await web.events("h") == []


async def test_a_configured_public_url_is_the_only_prefix(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"server.public_url": "HTTPS://Proxy.Example:443/llm/"})
    data = make_image(color=153)
    answer = await upload(harness, data)
    assert answer["href"] == f"https://proxy.example/llm/v1/attachments/{answer['id']}.png"
    path, body = FORMATS["openai_chat"]
    parts = msgspec.json.decode(await sent(harness, path, body(answer["href"])))["messages"][0]["content"]
    assert parts[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(data).decode()
    session_spelling = f"https://proxy.example/llm/s/agent-7/v1/attachments/{answer['id']}"
    parts = msgspec.json.decode(await sent(harness, path, body(session_spelling)))["messages"][0]["content"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    listen = f"{DEFAULT}/v1/attachments/{answer['id']}"  # no longer this proxy's public URL
    raw = msgspec.json.encode(body(listen))
    resp = await harness.client.post(path, data=raw, headers={"Content-Type": "application/json", **SID})
    assert resp.status == 200 and harness.upstream.last.body == raw


# -- GET /v1/attachments/{id} --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_get_serves_the_verified_bytes_and_refuses_bad_ones(harness: Harness) -> None:
    data = make_image(5, 4, color=154)
    answer = await upload(harness, data, "a.png")
    href = answer["href"]
    assert href.startswith(DEFAULT)
    resp = await harness.client.get(href[len(DEFAULT):])
    assert resp.status == 200 and await resp.read() == data
    assert resp.headers["Content-Type"] == "image/png"
    assert resp.headers["ETag"] == f'"{answer["id"]}"'
    assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert href.endswith(".png?name=a.png")  # the extension a type-guessing helper reads
    for spelling in (answer["id"], answer["id"] + ".jpeg"):  # the extension is no part of the id
        plain = await harness.client.get(f"/v1/attachments/{spelling}")
        assert plain.status == 200 and await plain.read() == data and plain.headers["Content-Type"] == "image/png"
    head = await harness.client.head(f"/v1/attachments/{answer['id']}")
    assert head.status == 200 and head.headers["Content-Length"] == str(len(data)) and await head.read() == b""
    again = await harness.client.get(f"/v1/attachments/{answer['id']}", headers={"If-None-Match": resp.headers["ETag"]})
    assert again.status == 304 and await again.read() == b""

    await harness.corrupt(answer["id"], make_image(5, 4, color=155))  # same size and shape, other bytes
    bad = await harness.client.get(f"/v1/attachments/{answer['id']}")
    assert bad.status == 422 and bad.headers["x-projectionist-error-code"] == "ATTACHMENT_CORRUPT"
    assert (await bad.json())["error"]["code"] == "ATTACHMENT_CORRUPT" and "ETag" not in bad.headers

    await harness.remove(answer["id"])
    for request in (harness.client.get, harness.client.head):
        missing = await request(f"/v1/attachments/{answer['id']}")
        assert missing.status == 404 and missing.headers["x-projectionist-error-code"] == "ATTACHMENT_NOT_FOUND"
    missing = await harness.client.get(f"/v1/attachments/{answer['id']}")
    error = (await missing.json())["error"]  # OpenAI's error shape
    assert error["code"] == "ATTACHMENT_NOT_FOUND" and error["type"] == "not_found_error" and "message" in error
    gone = await harness.client.get(f"/v1/attachments/{answer['id']}", headers={"If-None-Match": f'"{answer["id"]}"'})
    assert gone.status == 404


@pytest.mark.parametrize("path", ["/v1/attachments/sha256:abc", "/v1/attachments/SHA256:" + "ab" * 32,
                                  "/v1/attachments/..%2Fmetrics", "/v1/attachments/sha256:" + "ab" * 32 + ".svg"])
async def test_get_of_a_malformed_id_is_400(harness: Harness, path: str) -> None:
    resp = await harness.client.get(path)
    assert resp.status == 400 and resp.headers["x-projectionist-error-code"] == "INVALID_ATTACHMENT_REF"
    assert harness.store.total == 0


async def test_get_needs_a_client_token_when_tokens_are_configured(
        make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "ct-one")
    harness = await make_harness()
    data = make_image(color=156)
    resp = await harness.client.post("/v1/attachments", data=data, headers={
        "Content-Type": "image/png", "Authorization": "Bearer ct-one"})
    href = (await resp.json())["href"]
    path = href[len(DEFAULT):]
    reads = harness.store.total
    for headers in ({}, {"Authorization": "Bearer ct-wrong"}):
        refused = await harness.client.get(path, headers=headers)
        assert refused.status == 401 and (await refused.json())["error"]["code"] == "CLIENT_UNAUTHORIZED"
    assert harness.store.total == reads  # a stranger reads nothing
    for headers in ({"Authorization": "Bearer ct-one"}, {"X-Projectionist-Token": "ct-one"}, {"x-api-key": "ct-one"}):
        ok = await harness.client.get(path, headers=headers)
        assert ok.status == 200 and await ok.read() == data
        assert ok.headers["Cache-Control"].startswith("private,")


async def test_files_content_shares_the_verified_read(harness: Harness) -> None:
    data = make_image(color=157)
    answer = await upload(harness, data)
    resp = await harness.client.get(f"/v1/files/{answer['id']}/content")
    assert resp.status == 200 and await resp.read() == data and resp.headers["ETag"] == f'"{answer["id"]}"'
    await harness.remove(answer["id"])
    missing = await harness.client.get(f"/v1/files/{answer['id']}/content")
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "FILE_NOT_FOUND"


# -- attachment ids in file parts ----------------------------------------------------------------

async def test_attachment_file_ids_in_file_parts_become_images(web: Harness) -> None:
    data = make_image(color=158)
    file_id = (await upload(web, data))["id"]
    gone = ref_id(make_image(color=159))
    inline = "data:image/png;base64," + base64.b64encode(data).decode()

    chat = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "file", "file": {"file_id": file_id}}, {"type": "file", "file": {"file_id": gone}},
        {"type": "file", "file": {"file_id": "file-provider"}}]}]}
    parts = msgspec.json.decode(await sent(web, "/v1/chat/completions", chat))["messages"][0]["content"]
    assert parts[0] == {"type": "image_url", "image_url": {"url": inline}}
    assert parts[1]["type"] == "text" and parts[1]["text"] == f"[image unavailable: not_found ({gone[:15]})]"
    assert parts[2] == {"type": "file", "file": {"file_id": "file-provider"}}

    responses = {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "look"}, {"type": "input_file", "file_id": file_id}]}]}
    content = msgspec.json.decode(await sent(web, "/v1/responses", responses))["input"][0]["content"]
    assert content[1] == {"type": "input_image", "image_url": inline, "detail": "auto"}

    messages = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "file", "file_id": file_id}, "title": "shot"}]}]}
    blocks = msgspec.json.decode(await sent(web, "/v1/messages", messages))["messages"][0]["content"]
    assert blocks == [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                   "data": base64.b64encode(data).decode()}}]


# -- replay ----------------------------------------------------------------------------------------

async def test_replay_rebuilds_an_href_call_byte_identically_under_another_public_url(
        make_harness: MakeHarness, make_config: Callable[..., Any]) -> None:
    first = await make_harness(make_config(**{"record.mode": "full"}))
    data = make_image(color=160)
    answer = await upload(first, data, "r.png")
    path, body = FORMATS["openai_chat"]
    request = body(answer["href"])
    request["messages"][0]["content"].append(
        {"type": "image_url", "image_url": {"url": f"https://elsewhere.example/v1/attachments/{answer['id']}"}})
    original = await sent(first, path, request, session="r")
    plain = await sent(first, path, body(answer["url"]), session="plain")
    records = [e["data"] for e in await first.events("r") if e["type"] == "request/recorded"]
    assert [r["public_urls"] for r in records] == [[DEFAULT]]
    assert all("public_urls" not in e["data"] for e in await first.events("plain"))
    await first.client.close()

    # restarted behind another public URL: replay recognises the references the call had
    second = await make_harness(make_config(**{"record.mode": "full", "server.public_url": "https://new.example"}))
    for session, upstream_body in (("r", original), ("plain", plain)):
        resp = await second.client.post(f"/admin/sessions/{session}/replay", json={"send": True}, headers=ADMIN)
        report = await resp.json()
        assert resp.status == 200 and report["matches"] is True, report
        assert second.upstream.last.body == upstream_body


# -- the official SDK ------------------------------------------------------------------------------

async def test_openai_sdk_sends_the_href_as_an_image_url(harness: Harness) -> None:
    data = make_image(6, 2, color=161)
    answer = await upload(harness, data, "sdk shot.png")
    assert answer["href"].endswith("?name=" + quote("sdk shot.png", safe=""))
    async with openai.AsyncOpenAI(base_url=str(harness.client.make_url("/v1")), api_key="sk-client",
                                  default_headers=SID) as client:
        completion = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": answer["href"]}}]}])
    assert completion.choices[0].message.content == "Hello from the fake upstream."
    parts = harness.upstream.last.json()["messages"][0]["content"]
    assert parts[1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                           + base64.b64encode(data).decode()}}


async def test_an_href_with_escaped_slashes_is_projected_and_recorded(web: Harness) -> None:
    data = make_image(color=162)
    answer = await upload(web, data)
    path, body = FORMATS["openai_chat"]
    raw = msgspec.json.encode(body(answer["href"])).replace(b"/", b"\\/")  # as PHP's json_encode writes it
    assert b"/v1/attachments/" not in raw
    resp = await web.client.post(path, data=raw, headers={"Content-Type": "application/json", **SID})
    assert resp.status == 200
    assert base64.b64encode(data) in web.upstream.last.body
    records = [e["data"] for e in await web.events("h") if e["type"] == "request/recorded"]
    assert records[-1]["public_urls"] == [DEFAULT]
