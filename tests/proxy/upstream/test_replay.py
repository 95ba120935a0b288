"""Replay: a recorded call rebuilt from the log prefix and the store, checked, resent, diffed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from projectionist.adapters import openai_chat
from projectionist.proxy.inbound.services import SERVICES
from tests import fakes
from tests.calls import call, chat_body, recorded_calls, state_kinds
from tests.conftest import ADMIN, BACKENDS, Harness
from tests.imaging import make_image, ref_id

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
MakeHarness = Callable[..., Awaitable[Harness]]


async def replay(harness: Harness, session: str = "r", **params: Any) -> Any:
    resp = await harness.client.get(f"/admin/sessions/{session}/replay", params=params, headers=ADMIN)
    return resp.status, await resp.json()


async def test_a_full_recording_replays_byte_identically_after_a_restart(
    make_harness: MakeHarness, make_config: Callable[..., Any]
) -> None:
    config = make_config(**{"record.mode": "full"})
    first = await make_harness(config)
    ok = await first.admit(make_image(color=210))
    gone = ref_id(make_image(color=211))
    sent = await call(first, chat_body(ok, gone, ok))
    await first.client.close()

    second = await make_harness(config)  # a restarted proxy
    status, report = await replay(second, show="1")
    assert status == 200 and report["matches"] is True
    assert report["rebuilt_digest"] == report["recorded_digest"]
    assert report["inbound"].startswith("sha256:") and report["first_difference"] is None
    assert report["body"]["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,<sha256:")
    # the rebuilt bytes are the ones first sent: resend them and compare what the upstream got
    resp = await second.client.post("/admin/sessions/r/replay", json={"send": True, "diff": True}, headers=ADMIN)
    answer = await resp.json()
    assert resp.status == 200 and answer["sent"]["status"] == 200
    assert second.upstream.last.body == sent
    assert answer["diff"]["compared"] is True and answer["diff"]["identical"] is True


async def test_metadata_mode_needs_the_inbound_body_and_checks_it(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    ok = await harness.admit(make_image(color=212))
    body = chat_body(ok)
    await call(harness, body)
    status, report = await replay(harness)
    assert status == 409 and report["error"]["code"] == "REPLAY_NEEDS_BODY"
    resp = await harness.client.post("/admin/sessions/r/replay", json={"inbound": body.decode()}, headers=ADMIN)
    assert resp.status == 200 and (await resp.json())["matches"] is True
    wrong = await harness.client.post("/admin/sessions/r/replay", json={"inbound": "{}"}, headers=ADMIN)
    assert wrong.status == 400 and (await wrong.json())["error"]["code"] == "INBOUND_MISMATCH"


async def test_a_changed_store_is_reported_at_the_image_path(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    ok = await harness.admit(make_image(color=213))
    await call(harness, chat_body(ok))
    await harness.remove(ok)
    status, report = await replay(harness)
    assert status == 200 and report["matches"] is False
    assert report["first_difference"] == "/messages/0/content/1"
    assert report["reason"].startswith("ATTACHMENT_NOT_FOUND")
    events = await harness.events("r")
    assert state_kinds(events) == ["request/recorded"]  # replay appended and quarantined nothing
    assert [outcome is not None for _, outcome in recorded_calls(events)] == [True]


async def test_a_code_change_is_reported_at_the_first_differing_member(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    gone = ref_id(make_image(color=214))
    await call(harness, msgspec.json.encode({"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"attachment:{gone}"}}]}]}))
    assert (await replay(harness))[1]["matches"] is True
    monkeypatch.setattr(openai_chat, "_text_part", lambda part, text: {"type": "text", "text": text.upper()})
    status, report = await replay(harness)
    assert status == 200 and report["matches"] is False and report["first_difference"] == "/messages"
    assert report["rebuilt_digest"] != report["recorded_digest"]


async def test_replay_uses_the_log_as_the_call_saw_it(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    data = make_image(color=215)
    aid = ref_id(data)
    await call(harness, chat_body(aid))  # not admitted yet: a placeholder
    await harness.admit(data)
    resp = await harness.client.post(f"/admin/sessions/r/attachments/{aid}/recover", headers=ADMIN)
    assert (await resp.json())["recovered"] is True
    await call(harness, chat_body(aid))  # now inlined
    events = await harness.events("r")
    first, second = [e["seq"] for e in events if e["type"] == "request/recorded"]
    early = (await replay(harness, seq=str(first)))[1]
    late = (await replay(harness, seq=str(second)))[1]
    assert early["matches"] and late["matches"]
    assert [r["outcome"] for r in early["refs"]] == ["placeholder"]
    assert [r["outcome"] for r in late["refs"]] == ["inlined"]
    missing = await replay(harness, seq="999")
    assert missing[0] == 404 and missing[1]["error"]["code"] == "NOT_RECORDED"


async def test_every_adapter_replays(make_harness: MakeHarness, upstream: Any) -> None:
    harness = await make_harness(**{"record.mode": "full",
                                    "upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    ok = await harness.admit(make_image(color=216))
    gone = ref_id(make_image(color=217))
    await call(harness, msgspec.json.encode({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": ok}},
        {"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "url", "url": f"attachment:{gone}"}}]}]}]}), path="/v1/messages")
    await call(harness, msgspec.json.encode({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "file_id": ok}, {"type": "input_image", "image_url": f"attachment:{gone}"}]}]}),
        path="/v1/responses")
    await call(harness, msgspec.json.encode({"contents": [{"role": "user", "parts": [
        {"fileData": {"fileUri": f"attachment:{ok}", "mimeType": "image/png"}},
        {"functionResponse": {"name": "f", "response": {}, "parts": [
            {"file_data": {"file_uri": f"attachment:{gone}"}}]}}]}]}), path="/v1beta/models/g:generateContent")
    seqs = [e["seq"] for e in await harness.events("r") if e["type"] == "request/recorded"]
    adapters = []
    for seq in seqs:
        status, report = await replay(harness, seq=str(seq))
        assert status == 200 and report["matches"] is True, report
        adapters.append(report["adapter"])
    assert adapters == ["anthropic_messages", "openai_responses", "gemini"]


async def test_a_different_answer_is_diffed_at_its_first_differing_path(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    ok = await harness.admit(make_image(color=214))
    await call(harness, chat_body(ok))
    changed = msgspec.json.decode(msgspec.json.encode(fakes.COMPLETION))
    changed["choices"][0]["message"]["content"] = "a different answer"
    changed["id"] = "chatcmpl-other"  # volatile: never reported as the difference
    monkeypatch.setattr(fakes, "COMPLETION", changed)
    resp = await harness.client.post("/admin/sessions/r/replay", json={"send": True, "diff": True}, headers=ADMIN)
    answer = await resp.json()
    assert resp.status == 200 and answer["matches"] is True
    assert answer["diff"]["identical"] is False
    assert answer["diff"]["first_difference"] == "/choices/0/message/content"
    assert answer["diff"]["recorded_digest"] != answer["diff"]["new_digest"]


async def test_the_configured_key_goes_only_to_the_configured_upstream(make_harness: MakeHarness, upstream: Any) -> None:
    harness = await make_harness(**{"record.mode": "full", "upstreams.openai.format": "openai",
                                    "upstreams.openai.url": upstream.url, "upstreams.openai.api_key": "sk-configured"})
    await call(harness, chat_body(await harness.admit(make_image(color=215))))
    assert harness.upstream.last.headers["Authorization"] == "Bearer sk-configured"
    resp = await harness.client.post("/admin/sessions/r/replay", json={"send": True}, headers=ADMIN)
    assert resp.status == 200 and harness.upstream.last.headers["Authorization"] == "Bearer sk-configured"
    elsewhere = upstream.url.replace("127.0.0.1", "localhost")  # the same fake, under another URL
    resp = await harness.client.post("/admin/sessions/r/replay", json={"send": True, "upstream": elsewhere},
                                     headers=ADMIN)
    assert resp.status == 200 and (await resp.json())["sent"]["status"] == 200
    assert "Authorization" not in harness.upstream.last.headers


@pytest.mark.parametrize(("spec", "status", "code"), [
    ({"upstream": "http://[::1"}, 400, "INVALID_REQUEST"),
    ({"upstream": "http://127.0.0.1:99999"}, 400, "INVALID_REQUEST"),
    ({"upstream": "ftp://127.0.0.1/x"}, 400, "INVALID_REQUEST"),
    ({"upstream": "http://127.0.0.1:1"}, 502, "UPSTREAM_UNAVAILABLE"),
    ({"headers": {"X-Bad": "a\r\nInjected: 1"}}, 400, "INVALID_REQUEST"),
    ({"headers": {"Bad Name": "x"}}, 400, "INVALID_REQUEST"),
    ({"headers": {"Content-Length": "abc"}}, 400, "INVALID_REQUEST"),
])
async def test_a_replay_send_that_cannot_be_made_is_a_clean_error(
        make_harness: MakeHarness, spec: dict[str, Any], status: int, code: str) -> None:
    harness = await make_harness(**{"record.mode": "full"})
    await call(harness, chat_body(ref_id(make_image(color=230))))
    resp = await harness.client.post("/admin/sessions/r/replay", json={"send": True, **spec}, headers=ADMIN)
    assert resp.status == status, await resp.text()
    assert resp.headers["x-projectionist-error-code"] == code


async def test_checkpoints_change_no_replay_no_restart_and_no_fork(make_harness: MakeHarness,
                                                                    make_config: Callable[..., Any]) -> None:
    """With a checkpoint every two state events, every recorded call still replays byte-identically,
    a restarted proxy (folding from the latest checkpoint) and a fork send the same bodies."""
    config = make_config(**{"record.mode": "full"})
    first = await make_harness(config)
    first.app[SERVICES].log.checkpoint_every = 2
    ok = await first.admit(make_image(color=218))
    gone = [ref_id(make_image(color=c)) for c in (219, 220, 221, 222, 223)]
    bodies = [chat_body(ok, *gone[:n]) for n in range(1, len(gone) + 1)]
    sent = [await call(first, body) for body in bodies]
    kinds = [e["type"] for e in await first.events("r")]
    assert kinds.count("session/checkpoint") == 2 and kinds.count("attachment/quarantine") == 5
    for seq in [e["seq"] for e in await first.events("r") if e["type"] == "request/recorded"]:
        status, report = await replay(first, seq=str(seq))
        assert status == 200 and report["matches"] is True and report["seq"] == seq
    await first.client.close()

    second = await make_harness(config)  # restarted: a cold fold from the latest checkpoint
    assert await call(second, bodies[-1]) == sent[-1]
    resp = await second.client.post("/admin/sessions/r/fork", json={"new_session_id": "r2"}, headers=ADMIN)
    assert resp.status == 201
    assert await call(second, bodies[-1], session="r2") == sent[-1]
    status, report = await replay(second, session="r2")
    assert status == 200 and report["matches"] is True
    quarantine = await (await second.client.get("/admin/sessions/r2/quarantine", headers=ADMIN)).json()
    assert sorted(q["attachment_id"] for q in quarantine["quarantined"]) == sorted(gone)


async def test_a_body_sent_unchanged_is_recorded_without_a_shape_and_replay_still_names_the_difference(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = await make_harness(**{"record.mode": "metadata"})
    body = msgspec.json.encode({"model": "m", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "sha256 please"}]})
    await call(harness, body)
    [(request, _)] = recorded_calls(await harness.events("r"))
    assert "shape" not in request["data"] and "refs" not in request["data"]  # no digest per message paid
    resp = await harness.client.post("/admin/sessions/r/replay", json={"inbound": body.decode()}, headers=ADMIN)
    assert resp.status == 200 and (await resp.json())["matches"] is True
    # a code change that now rewrites the second message of such a body
    from projectionist.proxy.call import replay as replay_module
    real_build = replay_module.build

    async def changed(fmt: Any, raw: bytes, run: Any, **kwargs: Any) -> Any:
        tree = msgspec.json.decode(raw)
        tree["messages"][1]["content"] = "changed"
        return await real_build(fmt, msgspec.json.encode(tree), run, **kwargs)
    monkeypatch.setattr(replay_module, "build", changed)
    resp = await harness.client.post("/admin/sessions/r/replay", json={"inbound": body.decode()}, headers=ADMIN)
    report = await resp.json()
    assert resp.status == 200 and report["matches"] is False
    assert report["first_difference"] == "/messages"  # the member, from the shape of the verified inbound body
