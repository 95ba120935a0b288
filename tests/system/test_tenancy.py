"""Tenancy: a client token belongs to a tenant, which sees and writes only its own sessions and
lists, reads and references only the attachments it admitted; a refusal in one tenant never
quarantines anything in another; the admin token sees everything; with no tokens nothing
changes. On both backend pairs (filesystem + SQLite, S3 + PostgreSQL)."""

from __future__ import annotations

import base64
import io
from collections.abc import Awaitable, Callable
import re
from typing import Any

import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from projectionist.policy.errors import ProjectionistError
from projectionist.proxy.config import load_config
from tests.backends import BACKENDS
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]
on_both = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

ALICE = {"Authorization": "Bearer tok-alice"}
ALICE_TOO = {"x-api-key": "tok-alice-2"}  # alice's second token, as Anthropic's SDK sends it
BOB = {"Authorization": "Bearer tok-bob"}
CAROL = {"Authorization": "Bearer tok-carol"}  # a token of client_tokens_env: a tenant of its own


@pytest.fixture
async def tenants(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("PROJECTIONIST_TENANT_TOKENS", "alice:tok-alice, alice:tok-alice-2 bob:tok-bob")
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "tok-carol")
    return await make_harness()


async def admit(harness: Harness, headers: dict[str, str], data: bytes, name: str) -> str:
    resp = await harness.client.post("/v1/attachments", data=data, params={"name": name},
                                     headers={**headers, "Content-Type": "image/png"})
    assert resp.status == 200, await resp.text()
    return str((await resp.json())["id"])


def chat(*refs: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": f"attachment:{r}"}} for r in refs]
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


async def listed(harness: Harness, headers: dict[str, str]) -> dict[str, str | None]:
    # the fake upstream has no Files API (404): the list is the proxy's alone
    resp = await harness.client.get("/v1/files", headers={**headers, "x-fake-status": "404"})
    assert resp.status == 200, await resp.text()
    return {f["id"]: f["filename"] for f in (await resp.json())["data"]}


async def answer(harness: Harness, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
    resp = await harness.client.request(method, path, headers=headers)
    await resp.read()
    return resp.status, resp.headers.get("X-Projectionist-Error-Code", "")


@on_both
async def test_a_tenant_lists_and_reads_only_what_it_admitted(tenants: Harness) -> None:
    secret = await admit(tenants, ALICE, make_image(color=11), "alice-secret.png")
    never = ref_id(make_image(color=12))  # admitted by nobody
    assert await listed(tenants, ALICE) == {secret: "alice-secret.png"}
    assert await listed(tenants, ALICE_TOO) == {secret: "alice-secret.png"}  # one tenant, two tokens
    assert await listed(tenants, BOB) == {} and await listed(tenants, CAROL) == {}
    for path in (f"/v1/attachments/{secret}", f"/v1/files/{secret}", f"/v1/files/{secret}/content"):
        for method in ("GET", "HEAD") if path.startswith("/v1/attachments") else ("GET",):
            # another tenant's object answers exactly as one that is not there
            assert await answer(tenants, method, path, BOB) == \
                await answer(tenants, method, path.replace(secret, never), BOB), (method, path)
            assert (await answer(tenants, method, path, BOB))[0] == 404
            assert (await answer(tenants, method, path, ALICE_TOO))[0] == 200, (method, path)
    # a conditional GET says nothing either
    resp = await tenants.client.get(f"/v1/attachments/{secret}", headers={**BOB, "If-None-Match": f'"{secret}"'})
    assert resp.status == 404
    # the admin token sees every tenant's
    assert secret in await listed(tenants, ADMIN)
    assert (await answer(tenants, "GET", f"/v1/attachments/{secret}", ADMIN))[0] == 200


@on_both
async def test_the_same_bytes_are_one_object_and_each_tenant_sees_its_own_name(tenants: Harness) -> None:
    data = make_image(color=21)
    first = await admit(tenants, ALICE, data, "mine.png")
    again = await admit(tenants, BOB, data, "bobs.png")
    assert first == again
    assert await listed(tenants, ALICE) == {first: "mine.png"}
    assert await listed(tenants, BOB) == {first: "bobs.png"}
    resp = await tenants.client.get(f"/v1/files/{first}", headers=BOB)
    assert (await resp.json())["filename"] == "bobs.png"
    objects = [p for p in tenants.path_of(first).parent.glob("*") if p.name == first.removeprefix("sha256:")] \
        if tenants.path_of(first).parent.exists() else []
    assert len(objects) <= 1  # filesystem: one data file (S3: one key, nothing on disk)


@on_both
async def test_sessions_of_the_same_name_are_two_sessions(tenants: Harness) -> None:
    mine = await admit(tenants, ALICE, make_image(color=31), "a.png")
    for headers in (ALICE, BOB):
        resp = await tenants.client.post("/v1/chat/completions", json=chat(mine),
                                         headers={**headers, "X-Session-Id": "shared"})
        assert resp.status == 200, await resp.text()
    sent = [r.json()["messages"][0]["content"][1] for r in tenants.upstream.received[-2:]]
    assert sent[0]["type"] == "image_url" and sent[0]["image_url"]["url"].startswith("data:image/png;base64,")
    # bob named alice's image without having admitted it: to bob it is not there
    assert sent[1] == {"type": "text", "text": f'[image unavailable: not_found ({mine[:15]})]'}
    alice = await tenants.events("alice~shared")
    bob = await tenants.events("bob~shared")
    assert [e["type"] for e in alice if e["type"] == "attachment/quarantine"] == []
    assert [(e["type"], e["data"]["failure"]) for e in bob] == [("attachment/quarantine", "not_found")]
    # the name as the client gave it is nobody's session of its own: the admin sees the scoped ids
    resp = await tenants.client.get("/admin/sessions", headers=ADMIN)
    ids = {s["session"] for s in (await resp.json())["sessions"]}
    assert "bob~shared" in ids and "shared" not in ids
    # alice's next request still gets her image: bob's quarantine is his
    resp = await tenants.client.post("/v1/chat/completions", json=chat(mine), headers={**ALICE, "X-Session-Id": "shared"})
    assert resp.status == 200
    assert tenants.upstream.last.json()["messages"][0]["content"][1]["type"] == "image_url"


@on_both
async def test_a_tenant_cannot_reach_into_another_by_naming_its_scoped_id(tenants: Harness) -> None:
    mine = await admit(tenants, ALICE, make_image(color=41), "a.png")
    await tenants.client.post("/v1/chat/completions", json=chat(mine), headers={**ALICE, "X-Session-Id": "s"})
    resp = await tenants.client.post("/v1/chat/completions", json=chat(ref_id(make_image(color=42))),
                                     headers={**BOB, "X-Session-Id": "alice~s"})
    assert resp.status == 200
    assert [e["type"] for e in await tenants.events("alice~s")] == []  # untouched (recording is off here)
    assert [e["type"] for e in await tenants.events("bob~alice~s")] == ["attachment/quarantine"]


@on_both
async def test_an_unnamed_refusal_in_one_tenant_quarantines_nothing_in_another(tenants: Harness) -> None:
    data = make_image(color=51)
    shared = await admit(tenants, ALICE, data, "a.png")
    assert await admit(tenants, BOB, data, "b.png") == shared
    tenants.upstream.refused[shared] = False  # the upstream refuses it, naming no place
    resp = await tenants.client.post("/v1/chat/completions", json=chat(shared), headers={**BOB, "X-Session-Id": "s"})
    assert resp.status == 200, await resp.text()  # re-sent with the placeholder
    assert [e["type"] for e in await tenants.events("bob~s")] == ["attachment/rejected"]
    assert await tenants.events("alice~s") == []
    del tenants.upstream.refused[shared]
    resp = await tenants.client.post("/v1/chat/completions", json=chat(shared), headers={**ALICE, "X-Session-Id": "s"})
    assert resp.status == 200
    assert tenants.upstream.last.json()["messages"][0]["content"][1]["type"] == "image_url"


@on_both
async def test_sessions_clients_bring_without_naming_them_are_scoped_too(tenants: Harness) -> None:
    image = make_image(color=61)
    inline = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(image).decode()}}]}]}
    tenants.upstream.refused[ref_id(image)] = False
    for headers in (ALICE, BOB):
        resp = await tenants.client.post("/v1/messages", json=inline, headers={
            **headers, "anthropic-version": "2023-06-01", "X-Claude-Code-Session-Id": "same-uuid"})
        assert resp.status == 200, await resp.text()
    for tenant in ("alice", "bob"):
        events = await tenants.events(f"{tenant}~claude-code:same-uuid")
        assert [e["type"] for e in events] == ["attachment/rejected"]
    resp = await tenants.client.get("/admin/sessions", headers=ADMIN)
    assert "claude-code:same-uuid" not in {s["session"] for s in (await resp.json())["sessions"]}


@on_both
async def test_the_admin_token_and_no_tokens_keep_the_session_as_named(make_harness: MakeHarness,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    open_one = await make_harness()  # no client tokens: one user, nothing scoped
    await open_one.client.post("/v1/chat/completions", json=chat(ref_id(make_image(color=71))),
                               headers={"X-Session-Id": "plain"})
    assert [e["type"] for e in await open_one.events("plain")] == ["attachment/quarantine"]
    monkeypatch.setenv("PROJECTIONIST_TENANT_TOKENS", "alice:tok-alice")
    guarded = await make_harness()
    await guarded.client.post("/v1/chat/completions", json=chat(ref_id(make_image(color=72))),
                              headers={**ADMIN, "X-Session-Id": "ops"})
    assert [e["type"] for e in await guarded.events("ops")] == ["attachment/quarantine"]


def test_tenant_tokens_that_are_malformed_are_a_config_error() -> None:
    config = load_config(None)
    for value in ("alice", "Alice:sekrit", ":sekrit", "alice:sekrit bob:sekrit", "al ice:sekrit"):
        with pytest.raises(ProjectionistError) as caught:
            config.tenants({"PROJECTIONIST_TENANT_TOKENS": value})
        assert caught.value.code == "INVALID_CONFIG" and "sekrit" not in caught.value.message  # never the token
    tenants = config.tenants({"PROJECTIONIST_TENANT_TOKENS": "a:t1,a:t2", "PROJECTIONIST_CLIENT_TOKENS": "k"})
    assert tenants["t1"] == tenants["t2"] == "a"
    assert re.fullmatch(r"key-[0-9a-f]{12}", tenants["k"])  # a digest: the name says nothing of the token


@on_both
@pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")
async def test_a_gemini_upload_is_its_tenants_through_the_official_sdk(tenants: Harness) -> None:
    """google-genai's resumable upload: the bytes go to the upload URL with no key, so the tenant
    rides in the signed upload token; another tenant's ``files.get`` is a 404."""
    png = make_image(width=4, height=4, color=81)

    def client(key: str) -> Any:
        options = genai_types.HttpOptions(base_url=str(tenants.client.make_url("")), api_version="v1beta")
        return genai.Client(api_key=key, http_options=options).aio

    async with client("tok-alice") as alice:
        file = await alice.files.upload(file=io.BytesIO(png), config={"mime_type": "image/png", "display_name": "g.png"})
        assert file.name is not None and (await alice.files.get(name=file.name)).display_name == "g.png"
    async with client("tok-bob") as bob:
        with pytest.raises(genai_errors.ClientError) as caught:
            await bob.files.get(name=file.name)
        assert caught.value.code == 404
    assert await listed(tenants, ALICE) == {ref_id(png): "g.png"} and await listed(tenants, BOB) == {}


@on_both
async def test_one_tenant_cannot_take_every_upload_slot_by_varying_its_headers(tenants: Harness) -> None:
    """The per-client share of Gemini's resumable uploads is the tenant's: bob sending other keys
    beside his token gets a quarter of the slots, and alice still starts hers."""
    start = {"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
             "X-Goog-Upload-Header-Content-Type": "image/png", "X-Goog-Upload-Header-Content-Length": "100"}
    statuses = []
    for n in range(32):
        resp = await tenants.client.post("/upload/v1beta/files", json={"file": {"display_name": "x"}},
                                         headers={**start, **BOB, "x-goog-api-key": f"junk-{n}"})
        statuses.append(resp.status)
    assert statuses.count(200) == 8 and statuses.count(503) == 24, statuses
    resp = await tenants.client.post("/upload/v1beta/files", json={"file": {"display_name": "a"}},
                                     headers={**start, **ALICE})
    assert resp.status == 200, await resp.text()


@on_both
async def test_metrics_count_every_tenant_so_they_take_the_admin_token(tenants: Harness) -> None:
    await tenants.client.post("/v1beta/models/alice-private-model:generateContent", json={"contents": []},
                              headers={"x-goog-api-key": "tok-alice"})
    resp = await tenants.client.get("/metrics", headers=BOB)
    assert (resp.status, resp.headers["X-Projectionist-Error-Code"]) == (403, "ADMIN_REQUIRED")
    assert "alice-private-model" not in await resp.text()
    assert (await tenants.client.get("/metrics")).status == 401
    resp = await tenants.client.get("/metrics", headers=ADMIN)
    assert resp.status == 200 and "projectionist_requests_total" in await resp.text()
    for path in ("/u/openai/admin/ui", "/s/x/u/openai/admin/sessions", "/u/openai/v1/attachments/x"):
        resp = await tenants.client.get(path, headers=BOB)  # a path the proxy owns, behind a named upstream
        assert (resp.status, resp.headers["X-Projectionist-Error-Code"]) == (404, "ROUTE_NOT_FOUND"), path
    assert not [r for r in tenants.upstream.received if "/admin" in r.path_qs or "/attachments" in r.path_qs]
