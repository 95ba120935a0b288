"""Nothing a client sends is a 500, on any route: a property test (Hypothesis) sends arbitrary
methods, headers (bytes that are not UTF-8 too), cookies, query values (thousands of digits),
bodies (bytes, JSON nested thousands deep, chat bodies with odd images and references) to the
proxy's own routes and to proxied ones, over a raw socket, and checks that no answer is a 5xx
and that every request the app answered left exactly one request log line, JSON-encodable.

The upstream behind answers 200 to anything without reading it, so a 5xx can only be the
proxy's. ``PROJECTIONIST_FUZZ_EXAMPLES`` sets the number of requests (CI: the default).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from typing import Any
from urllib.parse import quote

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings, strategies as st
from structlog.testing import capture_logs

from projectionist.proxy.edge.app import create_app, open_log, open_store
from projectionist.proxy.config import load_config
from projectionist.proxy.inbound.services import ADMIN_APP

EXAMPLES = int(os.environ.get("PROJECTIONIST_FUZZ_EXAMPLES", "300"))

PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/messages/count_tokens",
         "/v1beta/models/g:generateContent", "/v1/models", "/v1/embeddings", "/v1/files", "/v1/files/sha256-x",
         "/v1/files/" + "sha256:" + "a" * 64 + "/content", "/v1/attachments", "/v1/attachments/sha256:" + "b" * 64,
         "/v1/attachments/uploads/nope", "/upload/v1beta/files", "/admin/sessions", "/admin/sessions/s/events",
         "/admin/sessions/s/quarantine", "/admin/sessions/s/replay", "/admin/sessions/s/fork", "/admin/ui",
         "/admin/ui/login", "/admin/ui/logout", "/admin/ui/sessions/s", "/s/s1/v1/chat/completions",
         "/s/./v1/messages", "/u/openai/v1/chat/completions", "/u/nope/v1/x", "/healthz", "/readyz", "/metrics",
         "/%2e%2e/admin", "//admin", "/v1/chat/completions;x"]
NAMES = ["Content-Type", "Content-Encoding", "Accept-Encoding", "X-Session-Id", "X-Claude-Code-Session-Id",
         "session-id", "Authorization", "x-api-key", "Cookie", "Upgrade", "Connection", "anthropic-version",
         "X-Goog-Upload-Protocol", "X-Goog-Upload-Command", "X-Goog-Upload-Header-Content-Length",
         "X-Goog-Upload-Header-Content-Type", "X-CSRF-Token", "Range", "Expect", "X-Odd"]
#: Header value bytes: anything but CR, LF and NUL (which no parser takes), Latin-1 and beyond UTF-8.
header_bytes = st.binary(max_size=80).map(lambda b: bytes(c for c in b if c not in (0, 10, 13)))
digits = st.integers(1, 6000).map(lambda n: "9" * n)
query = st.dictionaries(st.sampled_from(["limit", "after", "seq", "page", "key", "next", "show", "x"]),
                        st.one_of(digits, st.text(max_size=30)), max_size=3)

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)
images = st.sampled_from(["data:image/png;base64,iVBORw0KGgo" + "A" * 40, "data:image/png;base64,@@@@not base64@@@@",
                          "attachment:sha256:" + "c" * 64, "attachment:" + "d" * 64, "attachment:sha256:zz",
                          "https://example.com/a.png", "data:;base64," + "Q" * 17, "\x00" * 20])
chat_bodies = st.builds(lambda url, extra: {"model": "m", "messages": [{"role": "user", "content": [
    {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]}], **extra},
    images, st.dictionaries(st.sampled_from(["stream", "metadata", "prompt_cache_key", "x"]), json_values, max_size=2))
anthropic_bodies = st.builds(lambda data, user: {"model": "m", "max_tokens": 5, "metadata": {"user_id": user},
                                                 "messages": [{"role": "user", "content": [{"type": "image", "source": {
                                                     "type": "base64", "media_type": "image/png", "data": data}}]}]},
                             st.text(max_size=40), st.text(max_size=60))
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: msgspec.json.encode(v)),
    st.integers(1, 6000).map(lambda n: b'{"messages": ' + b"[" * n + b"]" * n + b"}"),
    chat_bodies.map(lambda v: msgspec.json.encode(v)),
    anthropic_bodies.map(lambda v: msgspec.json.encode(v)),
    st.just(b"--b--\r\n"),
)
requests = st.tuples(
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]),
    st.sampled_from(PATHS), query,
    st.lists(st.tuples(st.sampled_from(NAMES), header_bytes), max_size=6),
    bodies,
)


def wire(method: str, path: str, params: dict[str, str], headers: list[tuple[str, bytes]], body: bytes) -> bytes:
    target = path + ("?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in params.items()) if params else "")
    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".encode()
    for name, value in headers:
        if name.lower() in ("content-length", "transfer-encoding", "host", "connection"):
            continue
        head += name.encode() + b": " + value.strip() + b"\r\n"
    return head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


async def answer_everything(request: web.Request) -> web.StreamResponse:
    return web.json_response({"ok": True})


async def exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


def test_no_request_is_a_500_and_every_answered_one_leaves_one_json_log_line(tmp_path: Any) -> None:
    stats: Counter[str] = Counter()
    loop = asyncio.new_event_loop()
    upstream_app = web.Application()
    upstream_app.router.add_route("*", "/{tail:.*}", answer_everything)
    upstream = TestServer(upstream_app, host="127.0.0.1")
    loop.run_until_complete(upstream.start_server())
    base = str(upstream.make_url("")).rstrip("/")
    config = load_config(None, **{"server.data_dir": str(tmp_path / "data"), "server.admin_token": "admintok",
                                  "upstreams.openai": {"format": "openai", "url": base},
                                  "upstreams.anthropic": {"format": "anthropic", "url": base},
                                  "upstreams.gemini": {"format": "gemini", "url": base}})
    app = create_app(config, store=open_store(config), log=open_log(config))
    proxy = TestServer(app, host="127.0.0.1")
    loop.run_until_complete(proxy.start_server())
    console = TestServer(app[ADMIN_APP], host="127.0.0.1")  # the console's own listener
    loop.run_until_complete(console.start_server())
    assert proxy.port is not None and console.port is not None

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(requests)
    def check(request: tuple[str, str, dict[str, str], list[tuple[str, bytes]], bytes]) -> None:
        with capture_logs() as logs:
            # a path under /admin goes to the console's listener (on the proxy's it is a plain 404)
            port = console.port if request[1].startswith("/admin") else proxy.port
            answer = loop.run_until_complete(exchange(port, wire(*request)))  # type: ignore[arg-type]
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0
        stats["requests"] += 1
        stats[f"{status // 100}xx"] += 1
        assert 0 < status < 500, (request[:3], answer[:600])
        head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
        if "x-projectionist-request-id:" in head:  # the app answered it (not the HTTP parser)
            lines = [entry for entry in logs if entry.get("event") == "request"]
            assert len(lines) == 1, (request[:3], lines)
            json.loads(msgspec.json.encode(lines[0]))  # a JSON line, whatever the client sent

    try:
        check()
    finally:
        loop.run_until_complete(console.close())
        loop.run_until_complete(proxy.close())
        loop.run_until_complete(upstream.close())
        loop.close()
    print(f"\nfuzz: {stats['requests']} requests, " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())
                                                            if k.endswith("xx")) + ", 0 5xx")
    assert stats["requests"] >= EXAMPLES and stats["4xx"] > 0 and stats["2xx"] > 0
