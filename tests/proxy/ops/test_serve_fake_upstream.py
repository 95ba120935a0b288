"""``projectionist serve --fake-upstream``: the proxy tried with no provider key. A real ``serve``
process answers every format the proxy speaks from its built-in fake provider (streamed too), says
on stdout that the answers are fake, and survives an image the fake refuses as a provider would:
a 200 whose model saw the image's placeholder, one ``attachment/rejected`` in the session's log,
and the next request gets the placeholder before the provider is asked."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from projectionist.proxy.ops.fake_upstream import MARKER, FakeUpstream, reply
from tests.commands import cli, served
from tests.imaging import make_image

TOKEN = "fake-admin-token"
ENV = {**os.environ, "PROJECTIONIST_ADMIN_TOKEN": TOKEN}
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
#: A PNG carrying the marker after its end, as the docs show (``printf projectionist-refuse >> shot.png``).
REFUSED = make_image(6, 5, color=99) + MARKER
ACCEPTED = make_image(5, 6, color=12)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + b64(data)


def requests(image: bytes | None) -> dict[str, tuple[str, dict[str, str], dict[str, Any]]]:
    """One request of each format (path, headers, body): a question, and ``image`` when given."""
    chat: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    responses: list[dict[str, Any]] = [{"type": "input_text", "text": "What is this?"}]
    messages: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    gemini: list[dict[str, Any]] = [{"text": "What is this?"}]
    if image is not None:
        chat.append({"type": "image_url", "image_url": {"url": data_url(image)}})
        responses.append({"type": "input_image", "image_url": data_url(image)})
        messages.append({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(image)}})
        gemini.append({"inline_data": {"mime_type": "image/png", "data": b64(image)}})
    return {
        "chat": ("/v1/chat/completions", {}, {"model": "gpt-4o", "messages": [{"role": "user", "content": chat}]}),
        "responses": ("/v1/responses", {}, {"model": "gpt-4o", "input": [{"role": "user", "content": responses}]}),
        "messages": ("/v1/messages", {"anthropic-version": "2023-06-01", "x-api-key": "no-key-needed"},
                     {"model": "claude-sonnet-4-5", "max_tokens": 100,
                      "messages": [{"role": "user", "content": messages}]}),
        "gemini": ("/v1beta/models/gemini-2.5-flash:generateContent", {},
                   {"contents": [{"role": "user", "parts": gemini}]}),
    }


def text_of(kind: str, answer: Any) -> str:
    """The model's words in an answer of each format."""
    if kind == "chat":
        return str(answer["choices"][0]["message"]["content"])
    if kind == "responses":
        return str(answer["output"][0]["content"][0]["text"])
    if kind == "messages":
        return str(answer["content"][0]["text"])
    return str(answer["candidates"][0]["content"]["parts"][0]["text"])


def streamed_text(kind: str, raw: bytes) -> str:
    """The model's words, put together from a stream's server-sent events."""
    found = []
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = msgspec.json.decode(line[6:])
        if kind == "chat":
            found += [c["delta"].get("content", "") for c in event["choices"]]
        elif kind == "responses" and event["type"] == "response.output_text.delta":
            found.append(event["delta"])
        elif kind == "messages" and event["type"] == "content_block_delta":
            found.append(event["delta"]["text"])
        elif kind == "gemini":
            found.append(event["candidates"][0]["content"]["parts"][0]["text"])
    return "".join(found)


async def post(http: aiohttp.ClientSession, base: str, path: str, headers: dict[str, str], body: dict[str, Any],
               session: str) -> tuple[int, Any]:
    async with http.post(base + path, json=body, headers={**headers, "X-Session-Id": session}) as resp:
        return resp.status, await resp.json()


async def events(http: aiohttp.ClientSession, admin_url: str, session: str) -> list[dict[str, Any]]:
    async with http.get(f"{admin_url}/admin/sessions/{session}/events", headers=ADMIN) as resp:
        assert resp.status == 200, await resp.text()
        found: list[dict[str, Any]] = (await resp.json())["events"]
        return found


async def test_every_format_is_answered_streamed_or_not_and_the_answers_say_they_are_fake(tmp_path: Path) -> None:
    async with served("--fake-upstream", "--data-dir", str(tmp_path / "data"), lines=3, env=ENV) as serve, \
            aiohttp.ClientSession() as http:
        fake_line = serve.banner[2]
        assert "FAKE UPSTREAM" in fake_line and "canned, not a model's" in fake_line, serve.banner
        assert "(openai, anthropic, gemini)" in fake_line and repr(MARKER.decode()) in fake_line
        for kind, (path, headers, body) in requests(None).items():
            status, answer = await post(http, serve.url, path, headers, body, f"plain-{kind}")
            assert status == 200, (kind, answer)
            assert text_of(kind, answer) == "I see: 'What is this?'", kind

            stream_path = path.replace(":generateContent", ":streamGenerateContent?alt=sse")
            async with http.post(serve.url + stream_path, json={**body, "stream": True} if kind != "gemini" else body,
                                 headers=headers) as resp:
                assert resp.status == 200 and resp.content_type == "text/event-stream", kind
                assert streamed_text(kind, await resp.read()) == "I see: 'What is this?'", kind
        async with http.get(serve.url + "/healthz") as resp:
            assert resp.status == 200
        log = await serve.stop()
    listening = msgspec.json.decode(log.splitlines()[0])
    assert listening["event"] == "listening" and set(listening["upstreams"].values()) == {listening["fake_upstream"]}


async def test_an_image_the_fake_refuses_is_quarantined_and_the_session_carries_on(tmp_path: Path) -> None:
    async with served("--fake-upstream", "--data-dir", str(tmp_path / "data"), lines=3, env=ENV) as serve, \
            aiohttp.ClientSession() as http:
        for kind, (path, headers, body) in requests(REFUSED).items():
            session = f"refused-{kind}"
            status, answer = await post(http, serve.url, path, headers, body, session)
            assert status == 200, (kind, answer)
            said = text_of(kind, answer)
            assert said.startswith("I see: 'What is this?', '[image unavailable: rejected") and "an image" not in said
            [rejected] = [e for e in await events(http, serve.admin_url, session) if e["type"] == "attachment/rejected"]
            assert rejected["data"]["suspects"] == 1, kind
            # again: the log's placeholder before the provider is asked, the same answer
            status, again = await post(http, serve.url, path, headers, body, session)
            assert status == 200 and text_of(kind, again) == said, kind

        # beside an image it takes, only the marked one is refused
        path, headers, body = requests(ACCEPTED)["chat"]
        body["messages"][0]["content"].append({"type": "image_url", "image_url": {"url": data_url(REFUSED)}})
        status, answer = await post(http, serve.url, path, headers, body, "mixed")
        assert status == 200 and text_of("chat", answer).startswith("I see: 'What is this?', an image, '[image unavailable")
        async with http.get(serve.url + "/healthz") as resp:
            assert resp.status == 200  # the proxy survived all of it
        assert serve.proc.returncode is None


async def test_every_configured_upstream_goes_to_the_fake_with_no_key(tmp_path: Path) -> None:
    """A named upstream whose key variable is unset would stop ``serve``; with ``--fake-upstream`` it
    is sent to the fake too, and ``--fake-refuse-images`` refuses every image."""
    config = tmp_path / "p.toml"
    config.write_text('[upstreams.deepseek]\nformat = "openai"\nurl = "https://api.deepseek.com"\n'
                      'api_key_env = "PROJECTIONIST_TEST_UNSET_KEY"\n')
    env = {k: v for k, v in ENV.items() if k != "PROJECTIONIST_TEST_UNSET_KEY"}
    rc, _, err = await cli("serve", "--config", str(config), "--data-dir", str(tmp_path / "d0"), "--port", "0", env=env)
    assert rc == 2 and "PROJECTIONIST_TEST_UNSET_KEY" in err  # without the fake: refused, as before
    async with served("--fake-upstream", "--fake-refuse-images", "--config", str(config),
                      "--data-dir", str(tmp_path / "data"), lines=3, env=env) as serve, aiohttp.ClientSession() as http:
        assert "deepseek" in serve.banner[2] and "every inlined image" in serve.banner[2]
        path, headers, body = requests(ACCEPTED)["chat"]
        status, answer = await post(http, serve.url, "/u/deepseek" + path, headers, body, "named")
        assert status == 200 and "[image unavailable: rejected" in text_of("chat", answer)


@pytest.mark.parametrize("args", [["--fake-refuse-images"], ["--fake-upstream", "--workers", "2"]])
async def test_fake_flags_that_cannot_work_are_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    rc, out, err = await cli("serve", *args, "--data-dir", str(tmp_path), "--port", "0")
    assert (rc, out) == (2, "") and err.startswith("projectionist: INVALID_CONFIG: --fake-")


def test_the_canned_answer_names_what_the_model_saw_in_each_format() -> None:
    for kind, (_, _, body) in requests(ACCEPTED).items():
        assert reply(body) == "I see: 'What is this?', an image", kind
    assert reply({"messages": [{"role": "user", "content": "hi"}]}) == "I see: 'hi'"
    assert reply({"input": "hi"}) == "I see: 'hi'"
    assert reply({}) == "I see nothing in the last turn."
    assert FakeUpstream().refuse_all is False
