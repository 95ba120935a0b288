"""Strangers can do nothing costly or destructive: client tokens guard every route but ``/healthz``,
each SDK presents its token the way it sends its key and gets its own authentication error without
one, a client token never travels upstream, deleting an attachment takes the admin token, and upload
file names are validated."""

from __future__ import annotations

import base64

from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from tests.conftest import ADMIN, Harness
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]
TOKENS = "ct-alpha, ct-beta"


@pytest.fixture
async def guarded(make_harness: MakeHarness, upstream: Any, monkeypatch: pytest.MonkeyPatch) -> Harness:
    """Client tokens configured; ``openai`` takes the client's own key, ``anthropic`` and
    ``gemini`` have server-held keys."""
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", TOKENS)
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", "sk-ant-server")
    return await make_harness(**{
        "upstreams.anthropic": {"format": "anthropic", "url": upstream.url, "api_key_env": "TEST_ANTHROPIC_KEY"},
        "upstreams.gemini": {"format": "gemini", "url": upstream.url, "api_key": "g-server"},
    })


def chat_body(*refs: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": f"attachment:{r}"}} for r in refs]
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def no_token_anywhere(harness: Harness) -> None:
    for received in harness.upstream.received:
        seen = str(received.headers) + received.path_qs
        assert "ct-alpha" not in seen and "ct-beta" not in seen and "x-projectionist-token" not in seen.lower()


STRANGER_REQUESTS = [
    ("POST", "/v1/chat/completions", chat_body()),
    ("POST", "/v1/messages", {"model": "m", "max_tokens": 5, "messages": []}),
    ("POST", "/v1beta/models/g:generateContent", {"contents": []}),
    ("GET", "/v1/models", None),
    ("POST", "/v1/attachments", None),
    ("GET", "/v1/attachments/sha256:" + "a" * 64, None),
    ("HEAD", "/v1/attachments/sha256:" + "a" * 64, None),
    ("GET", "/v1/files/sha256:" + "a" * 64 + "/content", None),
    ("GET", "/v1/files/sha256:" + "a" * 64, None),
    ("DELETE", "/v1/files/sha256:" + "a" * 64, None),
    ("POST", "/v1/files", None),
    ("GET", "/metrics", None),
    ("GET", "/u/nope/v1/models", None),
    ("GET", "/admin/nothing-here", None),
]


@pytest.mark.parametrize(("method", "path", "body"), STRANGER_REQUESTS, ids=[f"{m} {p[:40]}" for m, p, _ in STRANGER_REQUESTS])
@pytest.mark.parametrize("presented", [{}, {"Authorization": "Bearer ct-wrong"}, {"x-api-key": "ct-alph"},
                                       {"X-Projectionist-Token": "ct-alpha "[:-2]}])
async def test_a_stranger_gets_401_everywhere_and_nothing_moves(
        guarded: Harness, method: str, path: str, body: Any, presented: dict[str, str]) -> None:
    resp = await guarded.client.request(method, path, json=body, headers=presented)
    assert resp.status == 401, await resp.text()
    assert resp.headers["x-projectionist-error-code"] == "CLIENT_UNAUTHORIZED"
    assert guarded.upstream.received == [] and guarded.store.total == 0


async def test_healthz_stays_open_for_probes(guarded: Harness) -> None:
    resp = await guarded.client.get("/healthz")
    assert resp.status == 200 and await resp.json() == {"status": "ok"}


@pytest.mark.parametrize("presented", [
    {"headers": {"Authorization": "Bearer ct-alpha"}}, {"headers": {"x-api-key": "ct-beta"}},
    {"headers": {"x-goog-api-key": "ct-alpha"}}, {"params": {"key": "ct-beta"}},
    {"headers": {"X-Projectionist-Token": "ct-alpha"}}, {"headers": {"Authorization": "Bearer admintok"}},
])
async def test_each_sdk_way_of_sending_a_key_carries_the_client_token(guarded: Harness, presented: dict[str, Any]) -> None:
    upload = await guarded.client.post("/v1/attachments", data=make_image(color=7),
                                       headers={"Content-Type": "image/png", **presented.get("headers", {})},
                                       params=presented.get("params", {}))
    assert upload.status == 200, await upload.text()
    # a server-keyed upstream (anthropic here): the upstream sees its own key and no token
    resp = await guarded.client.post("/v1/messages", json={"model": "m", "max_tokens": 5, "messages": []},
                                     headers=presented.get("headers", {}), params=presented.get("params", {}))
    assert resp.status == 200, await resp.text()
    assert guarded.upstream.last.headers["x-api-key"] == "sk-ant-server"
    assert "?" not in guarded.upstream.last.path_qs
    no_token_anywhere(guarded)


async def test_server_held_key_replaces_the_token_in_whatever_carrier_it_came(guarded: Harness) -> None:
    for carrier in ({"Authorization": "Bearer ct-alpha"}, {"x-api-key": "ct-alpha"}, {"x-goog-api-key": "ct-alpha"}):
        resp = await guarded.client.post("/v1beta/models/g:generateContent", json={"contents": []}, headers=carrier)
        assert resp.status == 200, await resp.text()
        sent = {k.lower(): v for k, v in guarded.upstream.last.headers.items()}
        assert sent["x-goog-api-key"] == "g-server" and "authorization" not in sent and "x-api-key" not in sent
    no_token_anywhere(guarded)


async def test_pass_through_upstream_gets_the_clients_own_key_and_never_the_token(guarded: Harness) -> None:
    resp = await guarded.client.post("/v1/chat/completions", json=chat_body(),
                                     headers={"Authorization": "Bearer sk-client-own", "X-Projectionist-Token": "ct-beta"})
    assert resp.status == 200
    assert guarded.upstream.last.headers["Authorization"] == "Bearer sk-client-own"
    no_token_anywhere(guarded)
    # the client's own key is not a proxy token: alone it opens nothing
    resp = await guarded.client.post("/v1/chat/completions", json=chat_body(),
                                     headers={"Authorization": "Bearer sk-client-own"})
    assert resp.status == 401


@pytest.mark.parametrize("spelled", [
    {"api-key": "ct-alpha"},  # Azure OpenAI's header: not one the check reads, still never forwarded
    {"Authorization": "Basic " + base64.b64encode(b"user:ct-alpha").decode()},
    {"Authorization": "Bearer x,ct-alpha"},
    {"X-Anything": "prefix ct-alpha suffix"},
    {"X-Foo": '"ct-alpha"'}, {"X-Foo": '{"key":"ct-alpha"}'}, {"X-Foo": "x/ct-alpha"}, {"X-Foo": "x|ct-alpha"},
    {"X-Foo": "x.ct-alpha"}, {"X-Foo": "ct%2Dalpha"},
    {"Authorization": "Basic " + base64.b64encode(b"xy:ct-alpha").decode().rstrip("=")},  # unpadded
])
async def test_a_proxy_token_is_never_forwarded_in_any_spelling(guarded: Harness, spelled: dict[str, str]) -> None:
    resp = await guarded.client.post("/v1/chat/completions", json=chat_body(),
                                     headers={"X-Projectionist-Token": "ct-beta", **spelled})
    assert resp.status == 200
    for name in spelled:
        assert name.lower() not in {k.lower() for k in guarded.upstream.last.headers}
    no_token_anywhere(guarded)


@pytest.mark.parametrize("query", ["key=x,ct-alpha", "key=Bearer%20ct-alpha", "key%00=ct-alpha", "x=ct-alpha",
                                   "ct-alpha=1", "q=%63t-alpha"])
async def test_a_proxy_token_in_any_query_parameter_is_never_forwarded(guarded: Harness, query: str) -> None:
    resp = await guarded.client.post(f"/v1/chat/completions?{query}&keep=1", json=chat_body(),
                                     headers={"X-Projectionist-Token": "ct-beta"})
    assert resp.status == 200, await resp.text()
    assert guarded.upstream.last.path_qs.endswith("keep=1")
    no_token_anywhere(guarded)


@pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")  # google-genai's own
async def test_official_sdks_raise_their_authentication_errors_and_work_with_a_token(guarded: Harness) -> None:
    base = str(guarded.client.make_url(""))
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-not-a-token", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert refused.value.code == "CLIENT_UNAUTHORIZED"
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-client-own", max_retries=0,
                                  default_headers={"X-Projectionist-Token": "ct-alpha"}) as client:
        done = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert done.choices[0].message.content == "Hello from the fake upstream."
    async with anthropic.AsyncAnthropic(base_url=base, api_key="nope", max_retries=0) as aclient:
        with pytest.raises(anthropic.AuthenticationError) as arefused:
            await aclient.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert arefused.value.body["error"]["details"]["error_code"] == "CLIENT_UNAUTHORIZED"  # type: ignore[index]
    async with anthropic.AsyncAnthropic(base_url=base, api_key="ct-beta", max_retries=0) as aclient:
        message = await aclient.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].text == "Hello from the fake upstream."  # type: ignore[union-attr]
    for key, ok in (("nope", False), ("ct-alpha", True)):
        gclient = genai.Client(api_key=key, http_options=types.HttpOptions(base_url=base, api_version="v1beta")).aio
        if ok:
            answer = await gclient.models.generate_content(model="g", contents="hi")
            assert answer.text
        else:
            with pytest.raises(genai_errors.ClientError) as grefused:
                await gclient.models.generate_content(model="g", contents="hi")
            assert grefused.value.code == 401
    no_token_anywhere(guarded)


async def test_deleting_an_attachment_takes_the_admin_token(guarded: Harness) -> None:
    token = {"Authorization": "Bearer ct-alpha"}
    resp = await guarded.client.post("/v1/attachments", data=make_image(color=9),
                                     headers={"Content-Type": "image/png", **token})
    aid = (await resp.json())["id"]
    resp = await guarded.client.delete(f"/v1/files/{aid}", headers=token)
    assert resp.status == 403 and resp.headers["x-projectionist-error-code"] == "ADMIN_REQUIRED"
    assert (await guarded.client.get(f"/v1/files/{aid}/content", headers=token)).status == 200  # still there
    async with anthropic.AsyncAnthropic(base_url=str(guarded.client.make_url("")), api_key="ct-alpha",
                                        max_retries=0) as client:
        with pytest.raises(anthropic.PermissionDeniedError):
            await client.beta.files.delete(aid)
        deleted = await client.with_options(api_key="admintok").beta.files.delete(aid)
        assert deleted.type == "file_deleted"
    assert (await guarded.client.get(f"/v1/files/{aid}/content", headers=token)).status == 404


async def test_without_client_tokens_deleting_still_takes_the_admin_token(harness: Harness) -> None:
    aid = await harness.admit(make_image(color=10))
    resp = await harness.client.delete(f"/v1/files/{aid}")
    assert resp.status == 403 and resp.headers["x-projectionist-error-code"] == "ADMIN_REQUIRED"
    resp = await harness.client.delete(f"/v1/files/{aid}", headers=ADMIN)
    assert resp.status == 200


async def test_admin_routes_take_only_the_admin_token(guarded: Harness) -> None:
    resp = await guarded.client.get("/admin/sessions/s/events", headers={"Authorization": "Bearer ct-alpha"})
    assert resp.status == 401 and resp.headers["x-projectionist-error-code"] == "ADMIN_UNAUTHORIZED"
    resp = await guarded.client.get("/admin/sessions/s/events", headers=ADMIN)  # past the token: the route's answer
    assert resp.status == 404 and resp.headers["x-projectionist-error-code"] == "SESSION_NOT_FOUND"


BAD_NAMES = ["a\x00b.png", "tab\there.png", "line\nbreak.png", "bell\x07.png", "x" * 256, "del\x7f.png"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=range(len(BAD_NAMES)))
async def test_upload_file_names_are_validated(harness: Harness, name: str) -> None:
    image = make_image(color=11)
    resp = await harness.client.post("/v1/attachments", data=image, params={"name": name},
                                     headers={"Content-Type": "image/png"})
    assert resp.status == 400 and resp.headers["x-projectionist-error-code"] == "INVALID_NAME"
    assert (await harness.client.get(f"/v1/files/{ref_id(image)}")).status == 404  # nothing was admitted


def form(filename: bytes, image: bytes, purpose: bytes | None = None) -> bytes:
    """A multipart body written by hand: SDKs escape file names before a test could send bad ones."""
    parts = b""
    if purpose is not None:
        parts += b"--b0undary\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n" + purpose + b"\r\n"
    parts += (b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"" + filename + b"\"\r\n"
              b"Content-Type: image/png\r\n\r\n" + image + b"\r\n")
    return parts + b"--b0undary--\r\n"


@pytest.mark.parametrize("filename", [b"\xff\xfe.png", b"bell\x07.png", b"x" * 256], ids=["not-utf8", "control", "long"])
@pytest.mark.parametrize("path", ["/v1/attachments", "/v1/files"])
async def test_multipart_file_names_are_validated(harness: Harness, filename: bytes, path: str) -> None:
    image = make_image(color=12)
    resp = await harness.client.post(path, data=form(filename, image, b"vision" if path == "/v1/files" else None),
                                     headers={"Content-Type": "multipart/form-data; boundary=b0undary"})
    assert resp.status == 400, await resp.text()
    # aiohttp's multipart parser refuses a control character in a part header outright
    assert resp.headers["x-projectionist-error-code"] in ("INVALID_NAME", "INVALID_MULTIPART")
    assert harness.upstream.received == [] and (await harness.client.get(f"/v1/files/{ref_id(image)}")).status == 404


async def test_a_good_unicode_name_is_kept(harness: Harness) -> None:
    resp = await harness.client.post("/v1/attachments", data=make_image(color=13), params={"name": "Grafik ü 图.png"},
                                     headers={"Content-Type": "image/png"})
    assert resp.status == 200 and (await resp.json())["name"] == "Grafik ü 图.png"


async def test_a_stranger_cannot_tell_named_upstreams_or_their_formats_apart(
        make_harness: MakeHarness, upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", TOKENS)
    harness = await make_harness(**{"upstreams.secret-claude": {"format": "anthropic", "url": upstream.url},
                                    "upstreams.internal-gem": {"format": "gemini", "url": upstream.url}})
    answers = set()
    for name in ("secret-claude", "internal-gem", "no-such-name"):
        resp = await harness.client.get(f"/u/{name}/v1/models")
        answers.add((resp.status, resp.headers["x-projectionist-error-code"], await resp.read()))
    assert len(answers) == 1 and next(iter(answers))[0] == 401


async def test_a_short_token_withholds_only_the_headers_that_carry_it(make_harness: MakeHarness,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "t")
    harness = await make_harness()
    resp = await harness.client.post("/v1/chat/completions", json=chat_body(),
                                     headers={"X-Projectionist-Token": "t", "X-Trace": "start-to-end",
                                              "Accept": "application/json"})
    assert resp.status == 200
    sent = {k.lower(): v for k, v in harness.upstream.last.headers.items()}
    assert sent["x-trace"] == "start-to-end" and sent["accept"] == "application/json"  # they only hold letters of it
    assert "x-projectionist-token" not in sent


def test_withheld_headers_looks_again_at_every_value_not_seen_clean_and_never_keeps_a_credential() -> None:
    """A call whose values were all seen clean withholds only the proxy's own headers; a token in
    a header (a known name, a credential's, a value seen clean elsewhere) is found in its place,
    every time, and a credential header's value is never remembered as clean."""
    from multidict import CIMultiDict

    from projectionist.proxy.inbound.auth import Guard

    guard = Guard({"ct-alpha-long-token"}, "admin-token-long-enough", ["X-Session-Id"])
    own = {"x-session-id", "x-projectionist-token"}
    plain = [("Content-Type", "application/json"), ("X-Trace", "abc"), ("Authorization", "Bearer sk-client")]
    assert guard.withheld_headers(CIMultiDict(plain)) == own
    assert guard.withheld_headers(CIMultiDict(plain)) == own  # every value seen before
    assert "Bearer sk-client" not in guard._clean and "abc" in guard._clean
    carried = [*plain, ("X-Other", "abc"), ("X-Trace", "ct-alpha-long-token"), ("Authorization", "ct-alpha-long-token")]
    assert guard.withheld_headers(CIMultiDict(carried)) == {*own, "x-trace", "authorization"}
    assert guard.withheld_headers(CIMultiDict(carried)) == {*own, "x-trace", "authorization"}
    assert "ct-alpha-long-token" not in guard._clean
