"""Sessions carried in the base URL: ``/s/{session}/...`` routes the rest as if it came without the
prefix, names the session for projection, quarantine, recording and the log line, and never
reaches the upstream; bad ids, header conflicts, dot segments and the proxy's own paths under it."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from structlog.testing import capture_logs
from yarl import URL

from projectionist.proxy.inbound.services import SERVICES

from tests.conftest import ADMIN, Harness
from tests.fakes import FakeUpstream
from tests.imaging import make_image, ref_id
from tests import calls
from tests.proxy.edge.test_routing import ROUTES, Recorder, recorder, routed, three, who  # noqa: F401  (fixtures, by name)

MakeHarness = Callable[..., Awaitable[Harness]]
SID = "path-sess"
PREFIX = f"/s/{SID}"


def raw(path_qs: str) -> URL:
    """A URL the test client sends byte for byte (no requoting or normalisation by yarl)."""
    return URL(path_qs, encoded=True)


def chat(*refs: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": f"attachment:{r}"}} for r in refs]
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def messages(*refs: str) -> dict[str, Any]:
    blocks = [{"type": "image", "source": {"type": "url", "url": f"attachment:{r}"}} for r in refs]
    return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": blocks}]}


def placeholder(attachment_id: str) -> dict[str, str]:
    return {"type": "text", "text": f"[image unavailable: not_found ({attachment_id[:15]})]"}


async def error_code(resp: Any) -> str:
    """The code, from the header and from the body in the wire shape of the format spoken."""
    body = await resp.json()
    header = resp.headers["x-projectionist-error-code"]
    in_body = (body["error"]["details"]["error_code"] if body.get("type") == "error"  # anthropic
               else body["error"]["details"][0]["reason"] if isinstance(body["error"].get("details"), list)  # gemini
               else body["error"]["code"])  # openai
    assert in_body == header
    return header


async def raw_request(harness: Harness, method: str, target: str, body: bytes = b"",
                      headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Bytes no client library would send as they are (literal dot segments): status, headers, body."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return await calls.raw_request(harness, f"{method} {target} HTTP/1.1\r\nHost: x\r\n{extra}".encode(), body)


# --- routing: the rest of the path, as without the prefix -------------------------------------------

@pytest.mark.parametrize(("expected", "method", "path_qs", "headers", "body"), ROUTES,
                         ids=[f"{e}:{m} {p} {sorted(h)}" for e, m, p, h, _ in ROUTES])
async def test_the_rest_of_the_path_is_routed_as_without_the_prefix(
    routed: Harness, three: dict[str, Recorder], expected: str, method: str, path_qs: str,
    headers: dict[str, str], body: bytes | None,
) -> None:
    resp = await routed.client.request(method, raw(PREFIX + path_qs), data=body, headers=headers)
    assert resp.status == 200, await resp.text()
    assert resp.headers["x-upstream"] == expected and who(three) == [expected]
    [hit] = three[expected].hits
    assert (hit.method, hit.path_qs) == (method, path_qs)  # the prefix never reaches the upstream
    assert hit.body == (body or b"")


async def test_a_trailing_slash_is_the_root_and_a_bare_session_is_no_route(
    routed: Harness, three: dict[str, Recorder]
) -> None:
    resp = await routed.client.get(f"{PREFIX}/")
    assert resp.status == 200 and three["openai"].hits[-1].path_qs == "/"
    for path in (PREFIX, "/s"):
        resp = await routed.client.get(raw(path))
        assert resp.status == 404 and await error_code(resp) == "ROUTE_NOT_FOUND", path
    empty = await routed.client.get("/s/")  # an empty session
    assert empty.status == 400 and await error_code(empty) == "INVALID_SESSION_ID"
    assert len(who(three)) == 1


async def test_a_named_upstream_under_the_session_prefix(make_harness: MakeHarness, aiohttp_server: Any) -> None:
    deepseek = await recorder(aiohttp_server, "deepseek")
    harness = await make_harness(**{"upstreams.deepseek": {"format": "openai", "url": deepseek.url}})
    data = make_image(color=150)
    ok = await harness.admit(data)
    gone = ref_id(make_image(color=151))
    resp = await harness.client.post(f"{PREFIX}/u/deepseek/v1/chat/completions?trace=1", json=chat(ok, gone))
    assert resp.status == 200, await resp.text()
    [hit] = deepseek.hits
    assert hit.path_qs == "/v1/chat/completions?trace=1"
    parts = hit.json()["messages"][0]["content"]
    assert parts[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(data).decode()
    assert parts[2] == placeholder(gone)  # the path's session: a placeholder, not a 422
    assert [e["type"] for e in await harness.events(SID)] == ["attachment/quarantine"]
    unknown = await harness.client.get(f"{PREFIX}/u/nope/v1/models")
    assert unknown.status == 404 and await error_code(unknown) == "UNKNOWN_UPSTREAM"
    spelled = await harness.client.get(raw(f"{PREFIX}/u/deep%73eek/v1/models"))
    assert spelled.status == 400 and await error_code(spelled) == "INVALID_UPSTREAM_NAME"
    assert len(deepseek.hits) == 1


# --- the session from the path ----------------------------------------------------------------------

async def test_a_missing_image_is_a_placeholder_with_the_path_session_and_a_422_without(harness: Harness) -> None:
    gone = ref_id(make_image(color=152))
    sessionless = await harness.client.post("/v1/chat/completions", json=chat(gone))
    assert sessionless.status == 422 and await error_code(sessionless) == "ATTACHMENT_NOT_FOUND"
    with capture_logs() as logs:
        resp = await harness.client.post(f"{PREFIX}/v1/chat/completions", json=chat(gone))
    assert resp.status == 200, await resp.text()
    sent = harness.upstream.last
    assert sent.path_qs == "/v1/chat/completions" and "x-session-id" not in {k.lower() for k in sent.headers}
    assert sent.json()["messages"][0]["content"][1] == placeholder(gone)
    [line] = [entry for entry in logs if entry["event"] == "request"]
    assert line["session"] == SID and line["route"] == "openai_chat" and line["quarantined"] == ["not_found"]
    [event] = await harness.events(SID)
    assert event["type"] == "attachment/quarantine" and event["data"]["attachment_id"] == gone
    # the same session by header sees the quarantine the path recorded: no second read
    reads = harness.store.total
    again = await harness.chat(SID, gone)
    assert again.status == 200 and harness.store.total == reads
    assert len(await harness.events(SID)) == 1


async def test_anthropic_root_base_url_and_gemini_under_the_prefix(make_harness: MakeHarness, upstream: FakeUpstream) -> None:
    harness = await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    gone = ref_id(make_image(color=153))
    resp = await harness.client.post(f"{PREFIX}/v1/messages", json=messages(gone),
                                     headers={"anthropic-version": "2023-06-01"})
    assert resp.status == 200, await resp.text()
    assert upstream.last.path_qs == "/v1/messages"
    assert upstream.last.json()["messages"][0]["content"][0] == placeholder(gone)
    body = {"contents": [{"role": "user", "parts": [{"file_data": {"file_uri": f"attachment:{gone}",
                                                                   "mime_type": "image/png"}}]}]}
    resp = await harness.client.post(f"{PREFIX}/v1beta/models/g:generateContent", json=body)
    assert resp.status == 200, await resp.text()
    assert upstream.last.path_qs == "/v1beta/models/g:generateContent"
    assert upstream.last.json()["contents"][0]["parts"][0] == {"text": placeholder(gone)["text"]}
    assert [e["type"] for e in await harness.events(SID)] == ["attachment/quarantine"]  # one failure, one fact


async def test_a_header_that_agrees_is_fine_and_one_that_differs_is_a_conflict(harness: Harness) -> None:
    gone = ref_id(make_image(color=154))
    same = await harness.client.post(f"{PREFIX}/v1/chat/completions", json=chat(gone), headers={"X-Session-Id": SID})
    assert same.status == 200
    received = len(harness.upstream.received)
    for path, body, fmt in ((f"{PREFIX}/v1/chat/completions", chat(gone), "openai"),
                            (f"{PREFIX}/v1/messages", messages(gone), "anthropic"),
                            (f"{PREFIX}/v1/models", None, "openai"),  # pass-through too: nothing is forwarded
                            (f"{PREFIX}/v1beta/models/g:generateContent", {"contents": []}, "gemini")):
        resp = await harness.client.post(path, json=body, headers={"X-Session-Id": "other"})
        assert resp.status == 400 and await error_code(resp) == "SESSION_CONFLICT", path
        shape = await resp.json()
        assert ("type" in shape) == (fmt == "anthropic") and (shape["error"].get("status") is not None) == (fmt == "gemini")
    assert len(harness.upstream.received) == received
    assert [e["type"] for e in await harness.events(SID)] == ["attachment/quarantine"]
    assert await harness.events("other") == []


async def test_a_session_header_alias_never_conflicts_the_path_wins(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"server.session_header_aliases": ["X-Conversation"], "record.mode": "metadata"})
    resp = await harness.client.post(f"{PREFIX}/v1/chat/completions", json=chat(), headers={"X-Conversation": "b"})
    assert resp.status == 200, await resp.text()  # an alias is a client's own header: never a 400
    assert "x-conversation" not in {k.lower() for k in harness.upstream.last.headers}
    await harness.app[SERVICES].recording.drain()
    assert [e["type"] for e in await harness.events(SID)] == ["request/recorded"]
    assert await harness.events("b") == []


INVALID_IDS = [
    ("/s//v1/chat/completions", "INVALID_SESSION_ID"),                   # empty
    ("/s/a%20b/v1/chat/completions", "INVALID_SESSION_ID"),              # a space is not visible ASCII
    ("/s/%C3%A9t%C3%A9/v1/chat/completions", "INVALID_SESSION_ID"),      # not ASCII once decoded
    ("/s/" + "x" * 257 + "/v1/chat/completions", "INVALID_SESSION_ID"),  # too long
    ("/s/%FF/v1/chat/completions", "INVALID_PATH"),                      # not UTF-8: no path may hold it
    ("/s/a%00b/v1/chat/completions", "INVALID_PATH"),                    # a control character, likewise
]


@pytest.mark.parametrize(("path", "code"), INVALID_IDS)
async def test_an_invalid_session_segment_is_a_400(harness: Harness, path: str, code: str) -> None:
    resp = await harness.client.post(raw(path), json=chat())
    assert resp.status == 400 and await error_code(resp) == code
    assert harness.upstream.received == []


async def test_an_invalid_session_segment_answers_in_the_anthropic_shape(harness: Harness) -> None:
    resp = await harness.client.post(raw("/s/a%09b/v1/messages"), json=messages())
    assert resp.status == 400 and (await resp.json())["type"] == "error"
    assert await error_code(resp) in ("INVALID_SESSION_ID", "INVALID_PATH")  # a tab: a control character too


async def test_the_segment_is_percent_decoded_exactly_once(harness: Harness) -> None:
    with capture_logs() as logs:
        slash = await harness.client.post(raw("/s/a%2Fb/v1/chat/completions"), json=chat(),
                                          headers={"X-Session-Id": "a/b"})
        twice = await harness.client.post(raw("/s/a%252Fb/v1/chat/completions"), json=chat(),
                                          headers={"X-Session-Id": "a/b"})
    assert slash.status == 200, await slash.text()
    assert harness.upstream.last.path_qs == "/v1/chat/completions"
    assert twice.status == 400 and await error_code(twice) == "SESSION_CONFLICT"  # it names 'a%2Fb'
    lines = [e for e in logs if e["event"] == "request"]
    assert lines[0]["session"] == "a/b" and lines[1]["error_code"] == "SESSION_CONFLICT"


DOTS = [
    "/s/../v1/chat/completions",
    "/s/./v1/chat/completions",
    "/s/%2e%2e/v1/chat/completions",
    "/s/%252e/v1/chat/completions",
    "/s/x/../v1/chat/completions",
    "/s/x/v1/%2e%2e/chat/completions",
    "/s/..%3Bx/v1/chat/completions",
]


@pytest.mark.parametrize("path", DOTS)
async def test_dot_segments_anywhere_under_the_prefix_are_refused(harness: Harness, path: str) -> None:
    status, headers, _ = await raw_request(harness, "POST", path, b"{}", {"Content-Type": "application/json"})
    assert status == 400 and headers["x-projectionist-error-code"] == "INVALID_PATH"
    assert harness.upstream.received == []


async def test_client_tokens_are_checked_before_the_session(make_harness: MakeHarness,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "ct-alpha")
    harness = await make_harness()
    for path in ("/s//v1/chat/completions", f"{PREFIX}/v1/chat/completions", f"{PREFIX}/v1/attachments",
                 f"{PREFIX}/admin/sessions/{SID}/events"):
        resp = await harness.client.post(path, json=chat(), headers={"X-Session-Id": "other"})
        assert resp.status == 401 and await error_code(resp) == "CLIENT_UNAUTHORIZED", path
    ok = await harness.client.post(f"{PREFIX}/v1/chat/completions", json=chat(),
                                   headers={"Authorization": "Bearer ct-alpha"})
    assert ok.status == 200
    assert "ct-alpha" not in str(harness.upstream.last.headers)


# --- the proxy's own paths under the prefix -------------------------------------------------------

async def test_attachment_uploads_under_the_prefix_work_as_without_it(harness: Harness) -> None:
    data = make_image(color=155)
    resp = await harness.client.post(f"{PREFIX}/v1/attachments?name=shot.png", data=data,
                                     headers={"Content-Type": "image/png"})
    assert resp.status == 200, await resp.text()
    described = await resp.json()
    plain = await harness.client.post("/v1/attachments?name=shot.png", data=data, headers={"Content-Type": "image/png"})
    assert described == await plain.json() and described["name"] == "shot.png"
    assert await harness.store.stat(described["id"]) is not None
    served = await harness.client.get(f"{PREFIX}/v1/attachments/{described['id']}")  # the HTTP form's GET
    assert served.status == 200 and await served.read() == data
    # the rest of /v1/attachments is answered as without the prefix, refusals included
    for method, path in (("GET", "/v1/attachments/nope"), ("GET", "/v1/attachments"), ("PUT", "/v1/attachments/x/y")):
        prefixed = await harness.client.request(method, f"{PREFIX}{path}")
        unprefixed = await harness.client.request(method, path)
        assert (prefixed.status, await error_code(prefixed)) == (unprefixed.status, await error_code(unprefixed))
        assert prefixed.status in (400, 404, 405)
    assert harness.upstream.received == []


OWNED_UNDER_PREFIX = [
    ("GET", f"{PREFIX}/admin/sessions/{SID}/events"),
    ("GET", f"{PREFIX}/healthz"),
    ("GET", f"{PREFIX}/readyz"),
    ("GET", f"{PREFIX}/metrics"),
    ("GET", f"{PREFIX}/ADMIN/sessions"),
    ("GET", f"{PREFIX}//admin/sessions"),
    ("POST", f"{PREFIX}/v1%2Fattachments"),
    ("POST", f"{PREFIX}/V1/attachments"),
    ("GET", f"{PREFIX}/s/other/v1/models"),      # no second prefix
    ("GET", "/S/x/v1/models"),                    # the prefix in any other spelling
    ("GET", "/s;x/y/v1/models"),
    ("GET", "/%73/x/v1/models"),
    ("GET", "//s/x/v1/models"),
]


@pytest.mark.parametrize(("method", "path"), OWNED_UNDER_PREFIX)
async def test_other_owned_paths_under_the_prefix_are_never_forwarded(harness: Harness, method: str, path: str) -> None:
    status, headers, _ = await raw_request(harness, method, path, headers=ADMIN)
    assert status == 404 and headers["x-projectionist-error-code"] == "ROUTE_NOT_FOUND"
    assert harness.upstream.received == []


# --- recording and replay ---------------------------------------------------------------------------

async def test_a_call_recorded_through_the_path_replays_the_same_upstream_request(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    ok = await harness.admit(make_image(color=156))
    gone = ref_id(make_image(color=157))
    resp = await harness.client.post(f"{PREFIX}/v1/chat/completions?trace=1&api_key=sk-leak", json=chat(ok, gone),
                                     headers={"Authorization": "Bearer sk-client"})
    assert resp.status == 200
    await resp.read()
    sent = harness.upstream.last
    assert sent.path_qs.startswith("/v1/chat/completions?trace=1")
    events = await harness.events(SID)
    [request] = [e for e in events if e["type"] == "request/recorded"]
    assert request["data"]["path"] == "/v1/chat/completions?trace=1"  # no prefix, no credential
    assert "sk-leak" not in str(events)
    replayed = await harness.client.post(f"/admin/sessions/{SID}/replay", json={"send": True, "diff": True}, headers=ADMIN)
    report = await replayed.json()
    assert replayed.status == 200 and report["matches"] is True, report
    assert report["sent"]["status"] == 200
    again = harness.upstream.last
    assert again.body == sent.body and again.path_qs == "/v1/chat/completions?trace=1"
