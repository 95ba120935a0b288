"""Credentials never go where they were not configured to go: outgoing URLs are a configured base
plus a validated path, routes the proxy owns are never forwarded, and no proxy token, credential
query parameter or URL password leaks into a forwarded request, the session log or a log line.

Every outgoing request the proxy attempts is traced (``on_request_start``), so the tests assert on
where connections would land, not only on what the fake upstream happened to receive.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from yarl import URL

from projectionist.proxy.upstream.target import Upstream
from projectionist.proxy.upstream.transport import Answer, Transport
from projectionist.proxy.observe.logger import redact_url as redact
from projectionist.proxy.upstream.urls import Base, check_path
from projectionist.policy.errors import InvalidRequest
from tests.calls import raw_request
from tests.conftest import ADMIN, Harness

MakeHarness = Callable[..., Awaitable[Harness]]


@pytest.fixture
def attempted(monkeypatch: pytest.MonkeyPatch) -> list[URL]:
    """Every URL the proxy's upstream transports are asked to send to, in order."""
    urls: list[URL] = []
    opened = Upstream.open_transport

    def traced(upstream: Upstream) -> Transport:
        transport = opened(upstream)
        send = transport.send

        async def sending(method: str, url: URL, **kwargs: Any) -> Answer:
            urls.append(url)
            return await send(method, url, **kwargs)

        transport.send = sending  # type: ignore[method-assign]
        return transport

    monkeypatch.setattr(Upstream, "open_transport", traced)
    return urls


@pytest.fixture
async def lanes(make_harness: MakeHarness, upstream: Any, attempted: list[URL]) -> Harness:
    """``openai`` and ``oai`` (the client's own key), ``vllm1`` (a server-held key, a base path)
    and ``claude`` (anthropic), all on the fake upstream."""
    return await make_harness(**{"upstreams.vllm1": {"format": "openai", "url": upstream.url + "/base",
                                                     "api_key": "sk-server-held"},
                                 "upstreams.oai": {"format": "openai", "url": upstream.url},
                                 "upstreams.claude": {"format": "anthropic", "url": upstream.url}})


def raw(path: str) -> URL:
    return URL(path, encoded=True)


REFUSED_NAMES = [
    "/u/vllm%31/v1/chat/completions",          # the reported bug: decoded name, raw tail glued on
    "/u/%76llm1/v1/models",                     # any encoded letter
    "/u/vllm%2531/v1/models",                   # double-encoded
    "/u/vllm1%2F..%2F/v1/models",               # an encoded slash inside the name
    "/u/vllm1@127.0.0.2/v1/models",             # userinfo-looking names
    "/u/vllm1:1/v1/models",                     # port-looking names
    "/u/" + "v" * 65 + "/v1/models",            # overlong
    "/u/vll%C3%A9/v1/models",                   # unicode, percent-encoded
    "/u/vllm1%00/v1/models",                    # NUL
]
REFUSED_TAILS = [
    "/u/vllm1/../admin/sessions",
    "/u/vllm1/v1/%2e%2e/%2e%2e/x",
    "/u/vllm1/v1/%2E./x",
    "/u/vllm1/v1/%252e%252e/x",                 # double-encoded dots
    "/u/vllm1/v1/%25252e%25252e/x",             # triple-encoded dots
    "/u/vllm1/v1/..%5c..%5cx",                  # backslash separators
    "/u/vllm1/v1/..%2f..%2fx",                  # encoded slash separators
    "/u/vllm1/v1/..;/x",                        # path-parameter dots
    "/u/vllm1/v1/%c0%ae%c0%ae/x",               # overlong UTF-8 dots
    "/u/vllm1/v1/%e0%80%ae%e0%80%ae/x",         # overlong UTF-8 dots, three bytes
    "/u/vllm1/v1/x%00y",                        # NUL
    "/u/vllm1/v1/x%0d%0aHost:%20evil",          # header injection attempt
    "/u/vllm1/v1/%ff",                          # not UTF-8
    "/v1/%2e%2e/admin",                         # the same rule on default routes
    "/v1/models/./x",
    "/v1/chat/completions/..",
]
LANDS = [  # (request path, path at the fake upstream)
    ("/u/vllm1/v1/models", "/base/v1/models"),
    ("/u/vllm1", "/base/"),
    ("/u/vllm1/v1/files/file%2Fweird%20id", "/base/v1/files/file%2Fweird%20id"),
    ("/u/vllm1/v1/models/ft%3Agpt-4o%3Aacme", "/base/v1/models/ft%3Agpt-4o%3Aacme"),
    ("/u/vllm1/v1/x..y/.hidden/a.b", "/base/v1/x..y/.hidden/a.b"),
    ("/u/vllm1//127.0.0.2/x", "/base//127.0.0.2/x"),  # an authority-looking path stays a path
    ("/v1/models/%C3%A9", "/v1/models/%C3%A9"),
]


@pytest.mark.parametrize("path", REFUSED_NAMES)
async def test_names_that_are_not_spelled_literally_are_refused_in_the_openai_shape(
        lanes: Harness, attempted: list[URL], path: str) -> None:
    resp = await lanes.client.post(raw(path), json={"model": "m", "messages": []},
                                   headers={"Authorization": "Bearer sk-client"})
    assert resp.status == 400, await resp.text()
    assert resp.headers["x-projectionist-error-code"] == "INVALID_UPSTREAM_NAME"
    assert (await resp.json())["error"]["code"] == "INVALID_UPSTREAM_NAME"
    assert attempted == [] and lanes.upstream.received == []


async def test_the_consoles_root_is_answered_locally_too(lanes: Harness, attempted: list[URL]) -> None:
    resp = await lanes.client.get("/admin", headers=ADMIN, allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"] == "/admin/ui"  # the console's listener's own
    assert attempted == [] and lanes.upstream.received == []


@pytest.mark.parametrize("path", REFUSED_TAILS)
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_paths_with_dot_segments_in_any_encoding_are_refused(
        lanes: Harness, attempted: list[URL], path: str, method: str) -> None:
    # sent as raw bytes: client libraries would normalise literal dot segments away first
    status, headers, body = await raw_request(
        lanes, f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode(),
        b'{"model": "m", "messages": []}')
    assert status == 400, body
    assert headers["x-projectionist-error-code"] == "INVALID_PATH"
    assert attempted == [] and lanes.upstream.received == []


@pytest.mark.parametrize(("path", "landed"), LANDS)
async def test_every_other_path_lands_on_the_configured_origin_under_its_base_path(
        lanes: Harness, attempted: list[URL], upstream: Any, path: str, landed: str) -> None:
    resp = await lanes.client.get(raw(path), headers={"Authorization": "Bearer sk-client"})
    assert resp.status == 200, await resp.text()
    [url] = attempted
    assert url.origin() == URL(upstream.url).origin()
    assert lanes.upstream.last.path_qs == landed
    # the server-held key went only to its own upstream; the client's own key only to its own
    expected = "Bearer sk-server-held" if path.startswith("/u/vllm1") else "Bearer sk-client"
    assert lanes.upstream.last.headers["Authorization"] == expected


async def test_the_reported_port_glue_request_reaches_no_host_at_all(
        make_harness: MakeHarness, attempted: list[URL]) -> None:
    """``url = "http://127.0.0.1:19"`` plus ``/u/vllm%31/...`` once went to port 1931 with the key."""
    harness = await make_harness(**{"upstreams.vllm1": {"format": "openai", "url": "http://127.0.0.1:19",
                                                        "api_key": "sk-server-held"}})
    resp = await harness.client.post(raw("/u/vllm%31/v1/chat/completions"), json={"model": "m", "messages": []})
    assert resp.status == 400
    assert attempted == []


def test_check_path_and_base_join_unit() -> None:
    assert check_path("/v1/chat/completions") == "/v1/chat/completions"
    for bad in ("v1/x", "31/v1/chat", "", "@evil/x", "/a/\u00e9"):
        with pytest.raises(InvalidRequest):
            check_path(bad)
    base = Base("http://user:pw@127.0.0.1:19/api/")
    url = base.join("/v1/x%2Fy", "a=1")
    assert (url.scheme, url.host, url.port, url.raw_path, url.raw_query_string) == \
        ("http", "127.0.0.1", 19, "/api/v1/x%2Fy", "a=1")
    assert Base("http://[::1]:8080").join("/v1").origin() == URL("http://[::1]:8080")
    with pytest.raises(InvalidRequest):
        base.join("31/v1/chat/completions")
    for configured in ("ftp://h/x", "http://h/x?key=1", "http:///x", "http://h/#frag"):
        with pytest.raises(InvalidRequest):
            Base(configured)
    assert redact("http://user:hunter2@h:1/x") == "http://***@h:1/x"
    assert redact("http://h:1/x") == "http://h:1/x"


def test_a_joined_url_kept_for_reuse_is_the_one_joined_anew_and_a_refused_path_stays_refused() -> None:
    base = Base("http://127.0.0.1:19/api")
    first = base.join("/v1/chat/completions", "a=1")
    assert base.join("/v1/chat/completions", "a=1") == first == Base("http://127.0.0.1:19/api").join(
        "/v1/chat/completions", "a=1")
    assert base.join("/v1/chat/completions", "a=2").raw_query_string == "a=2"  # the query is part of the key
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            base.join("@evil.example/v1", "")
    for n in range(Base.JOINED_KEPT * 2):  # many paths: the kept ones stay bounded, each still right
        assert base.join(f"/v1/p{n}").raw_path == f"/api/v1/p{n}"
    assert base._joined.cache_info().currsize == Base.JOINED_KEPT


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/admin/sessions"), ("DELETE", "/admin/sessions/s1"), ("POST", "/admin/sesions/s1/fork"),
    ("DELETE", "/admin/sessions/s1/events"), ("GET", "/admin/x"), ("PUT", "/admin/x/y/z"),
    ("PUT", "/v1/attachments/sha256:abc"), ("GET", "/v1/attachments/sha256:abc/x"), ("DELETE", "/v1/attachments"),
    ("POST", "/healthz"), ("PUT", "/metrics"),
    ("POST", "/readyz"), ("GET", "/readyz/x"),
])
async def test_routes_the_proxy_owns_are_answered_locally_never_forwarded(
        lanes: Harness, attempted: list[URL], method: str, path: str) -> None:
    resp = await lanes.client.request(method, path, headers=ADMIN, data=b"{}")
    assert resp.status in (404, 405)
    assert resp.headers["x-projectionist-error-code"] in ("ROUTE_NOT_FOUND", "METHOD_NOT_ALLOWED")
    assert (await resp.json())["error"]["code"] == resp.headers["x-projectionist-error-code"]
    assert attempted == [] and lanes.upstream.received == []


@pytest.mark.parametrize("carrier", [
    {"Authorization": "Bearer admintok"}, {"x-api-key": "admintok"}, {"x-goog-api-key": "admintok"},
    {"X-Projectionist-Token": "anything"},
])
async def test_the_admin_token_and_the_proxy_token_header_are_never_forwarded(
        lanes: Harness, carrier: dict[str, str]) -> None:
    for path in ("/u/oai/v1/models", "/u/oai/v1/chat/completions", "/u/vllm1/v1/models", "/u/claude/v1/messages"):
        resp = await lanes.client.post(path, json={"model": "m", "messages": []}, headers=carrier)
        assert resp.status == 200, (path, await resp.text())
        sent = {k.lower(): v for k, v in lanes.upstream.last.headers.items()}
        assert "admintok" not in str(sent) and "x-projectionist-token" not in sent
        assert sent.get("authorization") in (None, "Bearer sk-server-held")
    resp = await lanes.client.get("/u/oai/v1/models?key=admintok&other=1")
    assert resp.status == 200 and lanes.upstream.last.path_qs == "/v1/models?other=1"


async def test_an_authority_looking_path_on_a_default_route_stays_a_path(lanes: Harness, attempted: list[URL],
                                                                         upstream: Any) -> None:
    status, _, _ = await raw_request(lanes, b"GET //127.0.0.2:1/v1/models HTTP/1.1\r\nHost: x\r\n")
    assert status == 200
    [url] = attempted
    assert url.origin() == URL(upstream.url).origin() and url.raw_path == "//127.0.0.2:1/v1/models"
    assert lanes.upstream.last.path_qs.endswith("//127.0.0.2:1/v1/models")  # aiohttp's client may add slashes


GONE = "sha256:" + "0" * 64
RECORDED_ROUTES = {  # path -> a body with one reference, in that route's format
    "/u/oai/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"attachment:{GONE}"}}]}]},
    "/u/claude/v1/messages": {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": f"attachment:{GONE}"}}]}]},
    "/v1beta/models/g:generateContent": {"contents": [{"role": "user", "parts": [
        {"file_data": {"file_uri": f"attachment:{GONE}", "mime_type": "image/png"}}]}]},
}


@pytest.mark.parametrize("path", list(RECORDED_ROUTES))
@pytest.mark.parametrize("param", ["key", "api_key", "access_token", "token", "API_KEY"])
async def test_credential_query_parameters_never_reach_the_session_log(
        make_harness: MakeHarness, upstream: Any, path: str, param: str) -> None:
    harness = await make_harness(**{"record.mode": "metadata",
                                    "upstreams.oai": {"format": "openai", "url": upstream.url},
                                    "upstreams.claude": {"format": "anthropic", "url": upstream.url},
                                    "upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    resp = await harness.client.post(raw(f"{path}?{param}=sk-secret-in-query&keep=1"), json=RECORDED_ROUTES[path],
                                     headers={"X-Session-Id": "leak"})
    assert resp.status == 200, await resp.text()
    events = await harness.events("leak")
    recorded = [e for e in events if e["type"] == "request/recorded"]
    assert recorded and all("sk-secret-in-query" not in str(e) for e in events)
    assert recorded[0]["data"]["path"] == path.removeprefix("/u/oai").removeprefix("/u/claude") + "?keep=1"


async def test_an_admin_token_that_is_not_utf8_is_a_401_not_a_500(harness: Harness) -> None:
    status, _, body = await raw_request(
        harness, b"GET /admin/sessions/s/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\x80\r\n")
    assert status == 401 and b"ADMIN_UNAUTHORIZED" in body


async def test_a_files_upload_whose_content_type_is_not_latin1_is_a_400(harness: Harness) -> None:
    form = b"--\xc4\x80\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nvision\r\n--\xc4\x80--\r\n"
    status, _, body = await raw_request(
        harness, b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=\xc4\x80\r\n",
        form)
    assert status == 400 and b"INVALID_CONTENT_TYPE" in body
    assert harness.upstream.received == []


@pytest.fixture
async def evil(aiohttp_server: Any) -> Any:
    """A host nobody configured, counting what reaches it."""
    from aiohttp import web

    hits: list[dict[str, str]] = []

    async def take(request: web.Request) -> web.Response:
        hits.append(dict(request.headers))
        return web.json_response({"stolen": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", take)
    server = await aiohttp_server(app)
    server.hits = hits
    return server


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_redirects_are_relayed_never_followed_so_keys_stay_home(
        make_harness: MakeHarness, aiohttp_server: Any, evil: Any, status: int) -> None:
    """An upstream (or an open redirect on its host) answering with a Location elsewhere: the
    3xx goes back to the client as it came, and the server-held key never leaves for that host."""
    from aiohttp import web

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": str(evil.make_url("/stolen"))})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    bouncing = await aiohttp_server(app)
    harness = await make_harness(**{
        "upstreams.claude": {"format": "anthropic", "url": str(bouncing.make_url("")), "api_key": "sk-ant-held"},
        "upstreams.gem": {"format": "gemini", "url": str(bouncing.make_url("")), "api_key": "g-held"}})
    for path, body in (("/u/claude/v1/messages", {"model": "m", "max_tokens": 5, "messages": []}),
                       ("/u/gem/v1beta/models/g:generateContent", {"contents": []}),
                       ("/u/gem/v1beta/models", None)):
        resp = await harness.client.post(path, json=body, allow_redirects=False) if body is not None else \
            await harness.client.get(path, allow_redirects=False)
        assert resp.status == status and resp.headers["Location"].endswith("/stolen")
    assert evil.hits == []


@pytest.mark.parametrize("query", ["KEY=admintok", "Key=admintok&x=1", "x=1&API_KEY=admintok", "Token=admintok",
                                   "access_token=%20admintok"])
async def test_a_proxy_token_in_a_credential_parameter_of_any_case_is_never_forwarded(
        lanes: Harness, query: str) -> None:
    resp = await lanes.client.get(raw(f"/u/oai/v1/models?{query}"))
    assert resp.status == 200
    assert "admintok" not in lanes.upstream.last.path_qs


@pytest.mark.parametrize("value", ["Bearer\tadmintok", "admintok", "Bearer  admintok ", "bearer admintok",
                                   "Token admintok"])
async def test_a_proxy_token_in_an_odd_header_spelling_is_never_forwarded(lanes: Harness, value: str) -> None:
    status, _, _ = await raw_request(lanes, f"GET /u/oai/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: {value}\r\n"
                                      .encode())
    assert status == 200
    assert "admintok" not in str(lanes.upstream.last.headers)


@pytest.mark.parametrize("path", ["/metrics/", "/healthz/x", "/admin;x", "//admin/sessions/s/events",
                                  "/ADMIN/sessions/s/events", "/admin%2Fsessions%2Fs%2Fevents", "/v1/attachments;x",
                                  "/v1%2Fattachments", "/V1/Attachments/x", "/%61dmin/x", "/%2561dmin/x"])
async def test_owned_paths_in_any_spelling_are_answered_locally(
        lanes: Harness, attempted: list[URL], path: str) -> None:
    status, headers, _ = await raw_request(
        lanes, f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admintok\r\n".encode(), b"{}")
    assert status == 404 and headers["x-projectionist-error-code"] == "ROUTE_NOT_FOUND"
    assert attempted == [] and lanes.upstream.received == []


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "PROPFIND"])
async def test_unusual_methods_are_not_forwarded(lanes: Harness, attempted: list[URL], method: str) -> None:
    status, headers, _ = await raw_request(lanes, f"{method} /u/vllm1/v1/models HTTP/1.1\r\nHost: x\r\n".encode())
    if method == "CONNECT":  # its target is an authority: aiohttp itself routes it nowhere
        assert status in (400, 404, 405)
    else:
        assert status == 405 and headers["x-projectionist-error-code"] == "METHOD_NOT_ALLOWED"
    assert attempted == [] and lanes.upstream.received == []
