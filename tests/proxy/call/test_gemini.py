"""Gemini ``generateContent`` / ``streamGenerateContent`` through the proxy: the golden request
projected, recorded and replayed, the official ``google-genai`` SDK (unmodified, async client)
pointed at the proxy, auth substitution and un-prefixed routing. The fake Gemini upstream lives in
``tests/fake_gemini.py``; the adapter alone against the golden files is ``tests/adapters/test_gemini.py``."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from google import genai
from google.genai import errors, types
from structlog.testing import capture_logs

from projectionist.policy.errors import NOT_FOUND, READ_FAILED
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import ADMIN, Harness
from tests.fake_gemini import GEMINI_TEXT
from tests.fakes import FakeUpstream, fail_with
from tests.golden_gemini import BLUE, BLUE_ID, GONE2_ID, GONE_ID, RED, RED_ID, golden
from tests.imaging import make_image, ref_id
from tests.paths import GOLDEN

# google-genai subclasses aiohttp.ClientSession, which aiohttp deprecates (not our concern).
pytestmark = pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")


MakeHarness = Callable[..., Awaitable[Harness]]
SID = "gemini-sess"
MODEL = "gemini-2.0-flash"
DEAD = "http://127.0.0.1:9"  # nothing listens: a request routed there would be a 502


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def short(attachment_id: str) -> str:
    return attachment_id[: len("sha256:") + 8]


@pytest.fixture
async def gharness(make_harness: MakeHarness, upstream: FakeUpstream) -> Harness:
    """A proxy whose ``gemini`` upstream is the fake (``openai``/``anthropic`` point there too)."""
    return await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})


def gclient(harness: Harness, session: str | None = SID, *, api_version: str = "v1beta",
            base: str = "", api_key: str = "g-key") -> genai.client.AsyncClient:
    headers = {"X-Session-Id": session} if session else {}
    options = types.HttpOptions(base_url=str(harness.client.make_url(base)), api_version=api_version,
                                headers=headers)
    return genai.Client(api_key=api_key, http_options=options).aio


async def generate(client: genai.client.AsyncClient, contents: Any, stream: bool) -> str:
    """Call the SDK in either mode and return the model's whole text."""
    if stream:
        chunks = await client.models.generate_content_stream(model=MODEL, contents=contents)
        return "".join([chunk.text or "" async for chunk in chunks])
    response = await client.models.generate_content(model=MODEL, contents=contents)
    assert response.candidates and response.candidates[0].finish_reason == types.FinishReason.STOP
    assert response.usage_metadata and response.usage_metadata.total_token_count == 17
    return response.text or ""


def expected_path(stream: bool, version: str = "v1beta") -> str:
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/{version}/models/{MODEL}:{method}"


def expected_text(upstream: FakeUpstream, stream: bool) -> str:
    return "".join(f"tok{i} " for i in range(upstream.chunks)) if stream else GEMINI_TEXT


def image(uri: str) -> list[types.Content]:
    """One user turn holding one image reference, the way the SDK builds it."""
    return [types.Content(role="user", parts=[types.Part.from_uri(file_uri=uri, mime_type="image/png")])]


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


# --- golden -----------------------------------------------------------------------------------

async def test_golden_request_through_the_proxy_is_projected_recorded_and_replayed(gharness: Harness) -> None:
    assert await gharness.admit(RED) == RED_ID and await gharness.admit(BLUE) == BLUE_ID
    raw = (GOLDEN / "gemini.request.json").read_bytes()
    headers = {"Content-Type": "application/json", "X-Session-Id": SID, "x-goog-api-key": "g-key"}
    for _ in range(2):
        resp = await gharness.client.post(f"/v1beta/models/{MODEL}:generateContent", data=raw, headers=headers)
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["candidates"][0]["content"]["parts"][0]["text"] == GEMINI_TEXT
    first, second = gharness.upstream.received
    assert first.path_qs == f"/v1beta/models/{MODEL}:generateContent"
    assert first.body == golden("gemini.projected.json")
    assert second.body == first.body  # replayed from the log: byte-identical
    assert gharness.store.reads[GONE_ID] == 1 and gharness.store.reads[GONE2_ID] == 1
    events = await gharness.events(SID)
    assert [(e["type"], e["data"]["attachment_id"], e["data"]["failure"], e["data"].get("name")) for e in events] == [
        ("attachment/quarantine", GONE_ID, "not_found", "gone.png"),
        ("attachment/quarantine", GONE2_ID, "not_found", "crop.png")]


# --- the official SDK -------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_healthy_and_missing_references(gharness: Harness, stream: bool) -> None:
    data = make_image(color=60)
    ok = await gharness.admit(data)
    gone = ref_id(make_image(color=61))
    contents = [types.Content(role="user", parts=[
        types.Part.from_text(text="describe"),
        types.Part.from_uri(file_uri=f"attachment:{ok}", mime_type="image/png"),
        types.Part.from_uri(file_uri=f"attachment:{gone}", mime_type="image/png"),
    ])]
    async with gclient(gharness) as client:
        assert await generate(client, contents, stream) == expected_text(gharness.upstream, stream)
    sent = gharness.upstream.last
    assert sent.path_qs == expected_path(stream)
    got = lower(sent.headers)
    assert got["x-goog-api-key"] == "g-key" and "x-session-id" not in got
    # The SDK speaks camelCase; the rendered image keeps that spelling.
    assert sent.json()["contents"] == [{"role": "user", "parts": [
        {"text": "describe"},
        {"inlineData": {"mimeType": "image/png", "data": b64(data)}},
        {"text": f"[image unavailable: not_found ({short(gone)})]"},
    ]}]
    events = await gharness.events(SID)
    assert [(e["data"]["attachment_id"], e["data"]["failure"]) for e in events] == [(gone, "not_found")]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_function_response_images(gharness: Harness, stream: bool) -> None:
    data = make_image(color=62)
    ok = await gharness.admit(data)
    gone = ref_id(make_image(color=63))
    contents = [
        types.Content(role="user", parts=[types.Part.from_text(text="take a screenshot")]),
        types.Content(role="model", parts=[types.Part.from_function_call(name="shot", args={"w": 1})]),
        types.Content(role="user", parts=[
            types.Part(function_response=types.FunctionResponse(name="shot", response={"ok": True}, parts=[
                types.FunctionResponsePart.from_uri(file_uri=f"attachment:{ok}", mime_type="image/png"),
                types.FunctionResponsePart.from_uri(file_uri=f"attachment:{gone}?name=crop.png", mime_type="image/png"),
            ])),
            types.Part.from_text(text="what do you see?"),
        ]),
    ]
    async with gclient(gharness) as client:
        assert await generate(client, contents, stream) == expected_text(gharness.upstream, stream)
    sent = gharness.upstream.last
    assert sent.path_qs == expected_path(stream)
    parts = sent.json()["contents"][2]["parts"]
    # The SDK serialises function-response parts in snake_case (``file_data``); the image is
    # rendered in the spelling the part used.
    assert parts == [
        {"functionResponse": {"name": "shot", "response": {"ok": True}, "parts": [
            {"inline_data": {"mime_type": "image/png", "data": b64(data)}}]}},
        {"text": f'[image unavailable: not_found; "crop.png" ({short(gone)})]'},
        {"text": "what do you see?"},
    ]
    assert sent.json()["contents"][:2] == [
        {"role": "user", "parts": [{"text": "take a screenshot"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "shot", "args": {"w": 1}}}]}]
    events = await gharness.events(SID)
    assert [(e["data"]["attachment_id"], e["data"].get("name")) for e in events] == [(gone, "crop.png")]


async def test_sdk_dict_parts_in_snake_case_are_inlined_in_snake_case(gharness: Harness) -> None:
    data = make_image(color=64)
    ok = await gharness.admit(data)
    async with gclient(gharness) as client:
        await client.models.generate_content(model=MODEL, contents=[{"role": "user", "parts": [
            {"file_data": {"file_uri": f"attachment:{ok}", "mime_type": "image/png"}}]}])  # type: ignore[arg-type]
    # The SDK normalises dict parts to its own camelCase wire spelling.
    assert gharness.upstream.last.json()["contents"][0]["parts"] == [
        {"inlineData": {"mimeType": "image/png", "data": b64(data)}}]


async def test_sdk_sessionless_failures_raise_typed_errors_with_the_code(gharness: Harness) -> None:
    gone = ref_id(make_image(color=65))
    async with gclient(gharness, session=None) as client:
        with pytest.raises(errors.ClientError) as missing:
            await client.models.generate_content(
                model=MODEL, contents=image(f"attachment:{gone}"))
        assert missing.value.code == 422 and missing.value.status == "FAILED_PRECONDITION"
        assert missing.value.details["error"]["details"][0]["reason"] == NOT_FOUND
        assert short(gone) in (missing.value.message or "")

        with pytest.raises(errors.ClientError) as streamed:
            chunks = await client.models.generate_content_stream(
                model=MODEL, contents=image(f"attachment:{gone}"))
            [c async for c in chunks]
        assert streamed.value.code == 422
        assert streamed.value.details["error"]["details"][0]["reason"] == NOT_FOUND

        ok = await gharness.admit(color=66)
        gharness.store.script = fail_with(READ_FAILED)
        with pytest.raises(errors.ServerError) as flaky:
            chunks = await client.models.generate_content_stream(
                model=MODEL, contents=image(f"attachment:{ok}"))
            [c async for c in chunks]
        assert flaky.value.code == 503 and flaky.value.status == "UNAVAILABLE"
        assert flaky.value.details["error"]["details"][0]["reason"] == READ_FAILED
        assert gharness.store.reads[ok] == 2  # one immediate retry, then the error
    assert gharness.upstream.received == []


async def test_sdk_sessionless_placeholder_mode_projects_without_recording(
    make_harness: MakeHarness, upstream: FakeUpstream
) -> None:
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url},
                                    "server.sessionless": "placeholder"})
    gone = ref_id(make_image(color=71))
    async with gclient(harness, session=None) as client:
        for _ in range(2):
            text = await generate(client, image(f"attachment:{gone}?name=a%20b.png"), stream=True)
            assert text == expected_text(upstream, True)
    assert [r.json()["contents"][0]["parts"] for r in upstream.received] == 2 * [
        [{"text": f'[image unavailable: not_found; "a b.png" ({short(gone)})]'}]]
    assert harness.store.reads[gone] == 2  # nothing recorded, so each request reads again


async def test_sdk_bad_reference_is_a_400_and_never_read(gharness: Harness) -> None:
    async with gclient(gharness) as client:
        with pytest.raises(errors.ClientError) as bad:
            await client.models.generate_content(
                model=MODEL, contents=image("attachment:sha256:zz"))
    assert bad.value.code == 400 and bad.value.status == "INVALID_ARGUMENT"
    assert bad.value.details["error"]["details"][0]["reason"] == "INVALID_ATTACHMENT_REF"
    assert gharness.store.total == 0 and gharness.upstream.received == []
    assert await gharness.events(SID) == []


async def test_stream_first_chunk_is_relayed_before_the_upstream_finishes(gharness: Harness) -> None:
    ok = await gharness.admit(color=67)
    gharness.upstream.gate = asyncio.Event()
    body = {"contents": [{"role": "user", "parts": [{"fileData": {"fileUri": f"attachment:{ok}"}}]}]}
    resp = await gharness.client.post(f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", json=body,
                                      headers={"X-Session-Id": SID})
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    first = await asyncio.wait_for(resp.content.readuntil(b"\r\n\r\n"), 5)  # upstream still at the gate
    assert first.startswith(b"data: ") and b"tok0 " in first
    gharness.upstream.gate.set()
    rest = await resp.read()
    assert rest.count(b"data: ") == gharness.upstream.chunks - 1 and b'"finishReason":"STOP"' in rest
    assert "inlineData" in gharness.upstream.last.json()["contents"][0]["parts"][0]


# --- auth -------------------------------------------------------------------------------------

async def test_client_key_header_and_query_are_forwarded_unchanged(gharness: Harness) -> None:
    async with gclient(gharness, api_key="g-client-header") as client:
        await client.models.generate_content(model=MODEL, contents="hi")
    assert lower(gharness.upstream.last.headers)["x-goog-api-key"] == "g-client-header"

    resp = await gharness.client.post(f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse&key=g-client-query",
                                      json={"contents": [{"parts": [{"text": "hi"}]}]})
    assert resp.status == 200
    await resp.read()
    sent = gharness.upstream.last
    assert sent.path_qs == f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse&key=g-client-query"
    assert "x-goog-api-key" not in lower(sent.headers)


async def test_configured_key_replaces_header_and_query_and_is_never_logged(
    make_harness: MakeHarness, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_GEMINI_KEY", "g-server-secret")
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url,
                                                         "api_key_env": "TEST_GEMINI_KEY"}})
    ok = await harness.admit(color=68)
    with capture_logs() as logs:
        async with gclient(harness, api_key="g-client-header") as client:
            await client.models.generate_content(
                model=MODEL, contents=image(f"attachment:{ok}"))
        header_call = harness.upstream.last
        resp = await harness.client.post(
            f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse&key=g-client-query",
            json={"contents": [{"parts": [{"text": "hi"}]}]}, headers={"X-Session-Id": SID})
        assert resp.status == 200
        await resp.read()
        query_call = harness.upstream.last
        # A pass-through Gemini call (model listing) gets the same substitution.
        listing = await harness.client.get("/v1beta/models?key=g-client-list&pageSize=5")
        assert listing.status == 200
        list_call = harness.upstream.last
    assert lower(header_call.headers)["x-goog-api-key"] == "g-server-secret"
    assert header_call.path_qs == f"/v1beta/models/{MODEL}:generateContent"
    assert lower(query_call.headers)["x-goog-api-key"] == "g-server-secret"
    assert query_call.path_qs == f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    assert (list_call.method, list_call.path_qs) == ("GET", "/v1beta/models?pageSize=5")
    assert lower(list_call.headers)["x-goog-api-key"] == "g-server-secret"
    lines = [entry for entry in logs if entry["event"] == "request" and entry.get("upstream") == "gemini"]
    assert len(lines) == 3
    text = repr(logs)
    for secret in ("g-server-secret", "g-client-header", "g-client-query", "g-client-list"):
        assert secret not in text


# --- routing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["v1beta", "v1"])
async def test_unprefixed_sdk_request_goes_to_the_gemini_upstream(
    make_harness: MakeHarness, upstream: FakeUpstream, version: str
) -> None:
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url},
                                    "upstreams.openai": {"format": "openai", "url": DEAD},
                                    "upstreams.anthropic": {"format": "anthropic", "url": DEAD}})
    data = make_image(color=69)
    ok = await harness.admit(data)
    with capture_logs() as logs:
        async with gclient(harness, api_version=version) as client:
            text = await generate(client, image(f"attachment:{ok}"),
                                  stream=False)
    assert text == GEMINI_TEXT
    sent = harness.upstream.last
    assert sent.path_qs == expected_path(False, version)
    assert sent.json()["contents"][0]["parts"] == [{"inlineData": {"mimeType": "image/png", "data": b64(data)}}]
    [line] = [entry for entry in logs if entry["event"] == "request"]
    assert (line["route"], line["upstream"], line["adapter"], line["refs"]) == ("gemini", "gemini", "gemini", 1)


async def test_prefixed_sdk_request_goes_to_the_named_upstream(gharness: Harness) -> None:
    gone = ref_id(make_image(color=70))
    async with gclient(gharness, base="/u/gemini") as client:
        await client.models.generate_content(
            model=MODEL, contents=image(f"attachment:{gone}"))
    sent = gharness.upstream.last
    assert sent.path_qs == f"/v1beta/models/{MODEL}:generateContent"
    assert sent.json()["contents"][0]["parts"] == [{"text": f"[image unavailable: not_found ({short(gone)})]"}]
    resp = await gharness.client.get(f"/admin/sessions/{SID}/quarantine", headers=ADMIN)
    assert [q["attachment_id"] for q in (await resp.json())["quarantined"]] == [gone]


# --- other model methods that carry contents ----------------------------------------------------

async def test_count_tokens_projects_references_like_generate_content(gharness: Harness) -> None:
    """``models.count_tokens`` sends the same ``contents`` as ``generate_content``; an agent counts
    its history with it before each turn. An ``attachment:`` URI must not reach Google there."""
    data = make_image(color=72)
    ok = await gharness.admit(data)
    async with gclient(gharness) as client:
        await client.models.count_tokens(model=MODEL, contents=image(f"attachment:{ok}"))
    sent = gharness.upstream.last
    assert sent.path_qs == f"/v1beta/models/{MODEL}:countTokens"
    part = sent.json()["contents"][0]["parts"][0]
    assert part == {"inlineData": {"mimeType": "image/png", "data": b64(data)}}, (
        "PRODUCT GAP proxy/routing.py PROJECTING['gemini']: POST /v1beta/models/{m}:countTokens carries the "
        f"same contents as :generateContent but is passed through unprojected: {part}")
