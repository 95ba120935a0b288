"""OpenAI Responses API (``POST /v1/responses``) and the OpenAI Files API, through the proxy and the
official ``openai`` SDK, unmodified. The adapter alone on the golden request:
``tests/adapters/test_responses.py``."""

from __future__ import annotations

import hashlib
from typing import Any, Final

import openai
import pytest
from pydantic import TypeAdapter

from projectionist.adapters import openai_responses
from projectionist.policy.errors import NOT_FOUND, READ_FAILED
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness
from tests.fake_responses import FILE_ID, TEXT, file_object, multipart_fields, response_object, stream_events
from tests.fakes import Received, fail_with
from tests.golden_responses import (
    A, GOLDEN_REQUEST, GONE, PNG_A, PNG_B, data_url, golden_projected, not_found_text, sha,
)


SID: Final = "resp-sess"


def openai_client(harness: Harness, session: str | None = SID, **kw: Any) -> openai.AsyncOpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.AsyncOpenAI(base_url=str(harness.client.make_url("/v1")), api_key="sk-client",
                              default_headers=headers, **kw)


def user_input(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "describe"}, *parts]}]


def url_image(attachment_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "input_image", "image_url": f"attachment:{attachment_id}", "detail": "auto", **extra}


def file_image(attachment_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "input_image", "file_id": attachment_id, "detail": "auto", **extra}


def headers_of(received: Received) -> dict[str, str]:
    return {k.lower(): v for k, v in received.headers.items()}


def upstream_parts(harness: Harness, item: int = 0, key: str = "content") -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = harness.upstream.last.json()["input"][item][key]
    return parts


async def admit_all(harness: Harness, *images: bytes) -> None:
    for data in images:
        assert await harness.admit(data) == sha(data)


async def quarantines(harness: Harness, session: str = SID) -> list[tuple[str, str, bool]]:
    return [(e["data"]["attachment_id"], e["data"]["failure"], e["data"]["retryable"])
            for e in await harness.events(session) if e["type"] == "attachment/quarantine"]


# -- the fake upstream itself speaks the SDK's wire types --------------------------------------------

def test_fake_upstream_answers_validate_against_the_sdk_types() -> None:
    from openai.types import FileObject
    from openai.types.responses import Response, ResponseStreamEvent

    assert Response.model_validate(response_object()).output_text == TEXT
    events = [TypeAdapter(ResponseStreamEvent).validate_python(e) for e in stream_events(3)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "tok0 tok1 tok2 "
    assert FileObject.model_validate(file_object("x.jsonl", 3, "batch")).id == FILE_ID
    body = (b"--bnd\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            b"--bnd\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.jsonl\"\r\n"
            b"Content-Type: application/jsonl\r\n\r\n{}\n\r\n--bnd--\r\n")
    assert multipart_fields(body) == {"purpose": (None, b"batch"), "file": ("x.jsonl", b"{}\n")}


# -- golden: the same request through the proxy ------------------------------------------------------

async def test_golden_request_through_the_proxy_is_deterministic(harness: Harness) -> None:
    await admit_all(harness, PNG_A, PNG_B)
    raw = GOLDEN_REQUEST.read_bytes()
    headers = {"Content-Type": "application/json", "X-Session-Id": SID, "Authorization": "Bearer sk-client"}
    first = await harness.client.post("/v1/responses", data=raw, headers=headers)
    assert first.status == 200, await first.text()
    assert (await first.json())["output"][0]["content"][0]["text"] == TEXT
    second = await harness.client.post("/v1/responses", data=raw, headers=headers)
    assert second.status == 200
    sent = harness.upstream.received
    assert [r.path_qs for r in sent] == ["/v1/responses", "/v1/responses"]
    assert sent[0].json() == golden_projected()
    assert sent[1].body == sent[0].body  # same log + same request -> same bytes
    assert harness.store.reads[GONE] == 1  # the quarantined object is never read again
    assert await quarantines(harness) == [(GONE, "not_found", False)]
    events = await harness.events(SID)
    assert events[0]["data"]["name"] == "gone shot.png"


# -- the official SDK: projection of Responses requests ------------------------------------------------

@pytest.mark.parametrize("mode", ["json", "sse", "stream_helper"])
async def test_sdk_healthy_reference_inlined_and_missing_one_becomes_placeholder(harness: Harness, mode: str) -> None:
    await admit_all(harness, PNG_A)
    request: dict[str, Any] = {"model": "gpt-4.1-mini", "input": user_input(url_image(A), url_image(GONE))}
    async with openai_client(harness) as client:
        if mode == "json":
            response = await client.responses.create(**request)
            assert response.output_text == TEXT
            assert response.id == "resp_fake"
        elif mode == "sse":
            stream = await client.responses.create(**request, stream=True)
            events = [event async for event in stream]
            assert events[0].type == "response.created" and events[-1].type == "response.completed"
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert deltas == "tok0 tok1 tok2 tok3 tok4 "
        else:
            async with client.responses.stream(**request) as stream:
                deltas = "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])
                final = await stream.get_final_response()
            assert deltas == "tok0 tok1 tok2 tok3 tok4 "
            assert final.output_text == "tok0 tok1 tok2 tok3 tok4 "
    sent = harness.upstream.last
    assert sent.path_qs == "/v1/responses"
    assert headers_of(sent)["authorization"] == "Bearer sk-client"
    assert "x-session-id" not in headers_of(sent)
    body = sent.json()
    assert body.get("stream", False) is (mode != "json")
    assert body["input"][0]["content"] == [
        {"type": "input_text", "text": "describe"},
        {"type": "input_image", "detail": "auto", "image_url": data_url(PNG_A)},
        {"type": "input_text", "text": f"[image unavailable: not_found (sha256:{GONE[7:15]})]"},
    ]
    assert await quarantines(harness) == [(GONE, "not_found", False)]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_image_nested_in_function_call_output(harness: Harness, stream: bool) -> None:
    await admit_all(harness, PNG_A)
    tool_output = [{"type": "input_text", "text": "screenshot"}, file_image(A, detail="high"), url_image(GONE)]
    request_input: list[dict[str, Any]] = [
        {"role": "user", "content": "take a screenshot"},
        {"type": "function_call", "call_id": "call_9", "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_9", "output": tool_output},
    ]
    async with openai_client(harness) as client:
        if stream:
            async with client.responses.stream(model="gpt-4.1-mini", input=request_input) as events:  # type: ignore[arg-type]
                final = await events.get_final_response()
            assert final.output_text == "tok0 tok1 tok2 tok3 tok4 "
        else:
            response = await client.responses.create(model="gpt-4.1-mini", input=request_input)  # type: ignore[arg-type]
            assert response.output_text == TEXT
    body = harness.upstream.last.json()
    assert body["input"][:2] == request_input[:2]
    assert {k: v for k, v in body["input"][2].items() if k != "output"} == {"type": "function_call_output",
                                                                            "call_id": "call_9"}
    assert body["input"][2]["output"] == [
        {"type": "input_text", "text": "screenshot"},
        {"type": "input_image", "detail": "high", "image_url": data_url(PNG_A)},
        {"type": "input_text", "text": not_found_text(GONE)},
    ]
    assert harness.store.reads == {A: 1, GONE: 1}
    assert await quarantines(harness) == [(GONE, "not_found", False)]


async def test_sdk_sessionless_failures_raise_typed_errors(harness: Harness) -> None:
    await admit_all(harness, PNG_A)
    async with openai_client(harness, session=None, max_retries=0) as client:
        with pytest.raises(openai.UnprocessableEntityError) as missing:
            await client.responses.create(model="m", input=user_input(url_image(GONE)))  # type: ignore[arg-type]
        with pytest.raises(openai.UnprocessableEntityError) as missing_sse:
            await client.responses.create(model="m", input=user_input(file_image(GONE)), stream=True)  # type: ignore[arg-type]
        harness.store.script = fail_with(READ_FAILED)
        with pytest.raises(openai.InternalServerError) as flaky:
            await client.responses.create(model="m", input=user_input(url_image(A)))  # type: ignore[arg-type]
    for error in (missing.value, missing_sse.value):
        assert error.status_code == 422
        assert error.code == NOT_FOUND == "ATTACHMENT_NOT_FOUND"
        assert error.response.headers["x-projectionist-error-code"] == NOT_FOUND
    assert flaky.value.status_code == 503 and flaky.value.code == READ_FAILED
    assert harness.store.reads[A] == 2  # one immediate retry, then the error
    assert harness.upstream.received == []


async def test_sdk_malformed_reference_is_a_400_and_never_a_quarantine(harness: Harness) -> None:
    async with openai_client(harness, max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as bad_url:
            await client.responses.create(model="m", input=user_input(  # type: ignore[arg-type]
                {"type": "input_image", "image_url": "attachment:sha256:XYZ", "detail": "auto"}))
        with pytest.raises(openai.BadRequestError) as bad_file:
            await client.responses.create(model="m", input=user_input(file_image("sha256:abc")))  # type: ignore[arg-type]
    assert bad_url.value.code == bad_file.value.code == "INVALID_ATTACHMENT_REF"
    assert harness.upstream.received == []
    assert harness.store.total == 0
    assert await harness.events(SID) == []


async def test_request_without_references_is_forwarded_byte_for_byte(harness: Harness) -> None:
    raw = (b'{"model":"m", "input": [{"role":"user","content":[{"type":"input_image",'
           b'"image_url":"https://example.com/x.png","detail":"auto"}]}],  "x": 1.50}')
    resp = await harness.client.post("/v1/responses", data=raw,
                                     headers={"Content-Type": "application/json", "X-Session-Id": SID})
    assert resp.status == 200
    assert harness.upstream.last.body == raw
    assert harness.store.total == 0


# -- the Files API ------------------------------------------------------------------------------------

async def test_files_api_vision_upload_reference_delete_and_quarantine(harness: Harness) -> None:
    png = PNG_A
    expected_id = "sha256:" + hashlib.sha256(png).hexdigest()
    request_input = user_input(file_image(expected_id))
    async with openai_client(harness, max_retries=0) as client:
        created = await client.files.create(file=("shot.png", png, "image/png"), purpose="vision")
        assert created.id == expected_id
        assert (created.object, created.bytes, created.filename, created.purpose) == ("file", len(png), "shot.png",
                                                                                      "vision")
        assert harness.upstream.received == []  # admitted by the proxy, not forwarded

        await client.responses.create(model="m", input=request_input)  # type: ignore[arg-type]
        assert upstream_parts(harness)[1] == {"type": "input_image", "detail": "auto", "image_url": data_url(png)}

        retrieved = await client.files.retrieve(expected_id)
        assert (retrieved.id, retrieved.bytes, retrieved.filename) == (expected_id, len(png), "shot.png")
        content = await client.files.content(expected_id)
        assert content.content == png

        deleted = await client.with_options(api_key="admintok").files.delete(expected_id)  # admin only
        assert (deleted.id, deleted.deleted) == (expected_id, True)
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve(expected_id)

        await client.responses.create(model="m", input=request_input)  # type: ignore[arg-type]
        placeholder = {"type": "input_text", "text": f"[image unavailable: not_found (sha256:{expected_id[7:15]})]"}
        assert upstream_parts(harness)[1] == placeholder
        reads = harness.store.reads[expected_id]

        await client.responses.create(model="m", input=request_input, stream=True)  # type: ignore[arg-type]
        assert upstream_parts(harness)[1] == placeholder
        assert harness.store.reads[expected_id] == reads  # quarantined: never read again

    assert [r.path_qs for r in harness.upstream.received] == ["/v1/responses"] * 3
    events = await harness.events(SID)
    assert len(events) == 1
    assert events[0]["type"] == "attachment/quarantine"
    assert events[0]["data"]["attachment_id"] == expected_id
    assert events[0]["data"]["failure"] == "not_found"


@pytest.mark.parametrize(("purpose", "filename", "data", "media_type"), [
    ("batch", "requests.jsonl", b'{"custom_id": "r1", "method": "POST", "url": "/v1/responses"}\n',
     "application/jsonl"),
    ("assistants", "shot.png", PNG_B, "image/png"),
    ("vision", "notes.txt", b"this is not an image\n", "text/plain"),
], ids=["batch", "assistants-image", "vision-non-image"])
async def test_files_api_other_uploads_are_forwarded_to_the_upstream(
    harness: Harness, purpose: str, filename: str, data: bytes, media_type: str
) -> None:
    async with openai_client(harness, max_retries=0) as client:
        created = await client.files.create(file=(filename, data, media_type), purpose=purpose)  # type: ignore[arg-type]
    assert (created.id, created.filename, created.bytes, created.purpose) == (FILE_ID, filename, len(data), purpose)
    [sent] = harness.upstream.received
    assert (sent.method, sent.path_qs) == ("POST", "/v1/files")
    assert headers_of(sent)["content-type"].startswith("multipart/form-data; boundary=")
    assert headers_of(sent)["authorization"] == "Bearer sk-client"
    assert "x-session-id" not in headers_of(sent)
    fields = multipart_fields(sent.body)
    assert fields["purpose"] == (None, purpose.encode())
    assert fields["file"] == (filename, data)
    assert await harness.store.stat(sha(data)) is None  # nothing admitted
    assert not harness.path_of(sha(data)).exists()
    assert await harness.events(SID) == []


# -- the other image slots of Responses input ----------------------------------------------------
# DESIGN §3: "A client puts a reference wherever its SDK puts an image", and adapters find
# "images nested in tool results". The openai SDK's Responses input has three more such slots.

async def test_computer_call_output_screenshot_reference_is_inlined(harness: Harness) -> None:
    await admit_all(harness, PNG_A)
    request_input: list[dict[str, Any]] = [
        {"type": "computer_call", "call_id": "cu_1", "id": "cu_1", "status": "completed", "pending_safety_checks": [],
         "action": {"type": "screenshot"}},
        {"type": "computer_call_output", "call_id": "cu_1", "output": {"type": "computer_screenshot", "file_id": A}},
    ]
    async with openai_client(harness) as client:
        await client.responses.create(model="computer-use-preview", input=request_input)  # type: ignore[arg-type]
    output = harness.upstream.last.json()["input"][1]["output"]
    assert output == {"type": "computer_screenshot", "image_url": data_url(PNG_A)}, (
        "PRODUCT GAP adapters/openai_responses.py find_slots: a computer_call_output screenshot "
        f"reference reached the upstream unprojected: {output}")


async def test_custom_tool_call_output_image_list_is_projected(harness: Harness) -> None:
    await admit_all(harness, PNG_A)
    request_input: list[dict[str, Any]] = [
        {"type": "custom_tool_call", "call_id": "ct_1", "name": "grab", "input": "window"},
        {"type": "custom_tool_call_output", "call_id": "ct_1", "output": [url_image(A), url_image(GONE)]},
    ]
    async with openai_client(harness) as client:
        await client.responses.create(model="m", input=request_input)  # type: ignore[arg-type]
    output = harness.upstream.last.json()["input"][1]["output"]
    assert output == [{"type": "input_image", "detail": "auto", "image_url": data_url(PNG_A)},
                      {"type": "input_text", "text": not_found_text(GONE)}], (
        "PRODUCT GAP adapters/openai_responses.py find_slots: custom_tool_call_output.output images "
        f"reached the upstream unprojected: {output}")


async def test_prompt_variable_image_reference_is_inlined(harness: Harness) -> None:
    await admit_all(harness, PNG_A)
    prompt = {"id": "pmpt_1", "variables": {"screen": url_image(A), "topic": "diffs"}}
    async with openai_client(harness) as client:
        await client.responses.create(model="m", prompt=prompt, input="compare")  # type: ignore[call-overload]
    variables = harness.upstream.last.json()["prompt"]["variables"]
    assert variables == {"screen": {"type": "input_image", "detail": "auto", "image_url": data_url(PNG_A)},
                         "topic": "diffs"}, (
        "PRODUCT GAP adapters/openai_responses.py find_slots: an input_image prompt variable "
        f"reached the upstream unprojected: {variables}")


@pytest.mark.parametrize("endpoint", ["compact", "input_tokens"])
async def test_other_responses_endpoints_that_take_input_are_projected(harness: Harness, endpoint: str) -> None:
    await admit_all(harness, PNG_A)
    async with openai_client(harness) as client:
        if endpoint == "compact":
            await client.responses.compact(model="gpt-5.2", input=user_input(url_image(A)))  # type: ignore[arg-type]
        else:
            await client.responses.input_tokens.count(model="m", input=user_input(url_image(A)))  # type: ignore[arg-type]
    sent = harness.upstream.last
    assert sent.path_qs == f"/v1/responses/{endpoint}"
    image = sent.json()["input"][0]["content"][1]
    assert image == {"type": "input_image", "detail": "auto", "image_url": data_url(PNG_A)}, (
        f"PRODUCT GAP proxy/routing.py PROJECTING: POST /v1/responses/{endpoint} carries the same `input` "
        f"as /v1/responses but is passed through unprojected: {image}")


async def test_missing_computer_screenshot_becomes_a_blank_image_and_a_following_note(harness: Harness) -> None:
    request_input: list[dict[str, Any]] = [
        {"type": "computer_call", "call_id": "cu_1", "id": "cu_1", "status": "completed", "pending_safety_checks": [],
         "action": {"type": "screenshot"}},
        {"type": "computer_call_output", "call_id": "cu_1", "output": {"type": "computer_screenshot", "file_id": GONE}},
        {"role": "user", "content": "what next?"},
    ]
    async with openai_client(harness) as client:
        await client.responses.create(model="computer-use-preview", input=request_input)  # type: ignore[arg-type]
    sent = harness.upstream.last.json()["input"]
    assert sent[1]["output"] == {"type": "computer_screenshot", "image_url": openai_responses.BLANK_PNG}
    assert sent[2] == {"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": not_found_text(GONE)}]}
    assert sent[3] == {"role": "user", "content": "what next?"}
    assert await quarantines(harness) == [(GONE, "not_found", False)]
