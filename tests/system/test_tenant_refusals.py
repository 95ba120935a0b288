"""A refusal of an image's bytes holds for every session of the tenant (issue 41, item 2;
``proxy.call.refusals``). Once a format refused some bytes exactly, another session of the same
tenant carrying them to that format gets its own ``attachment/rejected`` and the placeholder before
the call, with no refused round trip; another tenant (or, without tenants, another credential)
gains nothing; each session's own log rebuilds its calls byte for byte; an operator's recovery
lifts it for the tenant; a guess (a refusal put down to two images) is never shared."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from projectionist.proxy.call.replay import rebuild
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import ADMIN, BACKENDS, Harness
from tests.imaging import ref_id
from tests.system.refusals.hostile import chat_body
from tests.system.test_inline_images import data_url, placeholder, png, rejected

MakeHarness = Callable[..., Awaitable[Harness]]
RECORDING = {"record.mode": "metadata"}
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}


async def send(harness: Harness, session: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    resp = await harness.client.post("/v1/chat/completions", data=msgspec.json.encode(body),
                                     headers={"Content-Type": "application/json", "X-Session-Id": session,
                                              **(headers or {})})
    assert resp.status == 200, await resp.text()
    return harness.upstream.last.json()


def refused(harness: Harness, color: int) -> tuple[bytes, str, dict[str, Any]]:
    """An image the upstream refuses (its place unnamed): its bytes, its id, a chat inlining it."""
    bad = png(color)
    harness.upstream.refused[ref_id(bad)] = False
    return bad, ref_id(bad), chat_body(inline=[data_url(bad)])


def texts(body: dict[str, Any]) -> list[str]:
    return [p.get("text") for m in body["messages"] for p in m["content"] if isinstance(m["content"], list)
            and p.get("type") == "text"]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_a_refusal_holds_for_every_session_of_the_tenant(make_harness: MakeHarness, backend: Any) -> None:
    harness = await make_harness(**RECORDING)
    _, aid, body = refused(harness, 110)
    await send(harness, "first", body)
    assert harness.upstream.refusals == 1
    # another session, the same bytes, the same format: the placeholder before the call
    sent = await send(harness, "second", body)
    assert harness.upstream.refusals == 1 and placeholder(aid) in texts(sent)
    assert rejected(await harness.events("first")) == [(aid, "openai")]
    assert rejected(await harness.events("second")) == [(aid, "openai")]  # its own event, in its own log
    # its call rebuilds byte for byte from its own log alone
    log = harness.app[SERVICES].log
    [request] = [e for e in await log.read("second") if type(e).__name__ == "RequestEvent"]
    assert (await rebuild(log, harness.store, "second", request.seq, msgspec.json.encode(body))).matches
    # a restarted proxy on the same data: the same bytes for a third session, still no refusal
    restarted = await make_harness(harness.app[SERVICES].config)
    assert await send(restarted, "third", body) == sent
    # and a fork of the second session decides the same from its own copy
    forked = await restarted.client.post("/admin/sessions/second/fork", json={"new_session_id": "forked"},
                                         headers=ADMIN)
    assert forked.status in (200, 201), await forked.text()
    assert await send(restarted, "forked", body) == sent
    assert harness.upstream.refusals == 1


async def test_another_tenant_gains_nothing(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTIONIST_TENANT_TOKENS", "alice:tok-alice bob:tok-bob")
    harness = await make_harness(**RECORDING)
    _, _, body = refused(harness, 111)
    await send(harness, "s", body, ALICE)
    await send(harness, "s2", body, ALICE)
    assert harness.upstream.refusals == 1
    await send(harness, "s", body, BOB)  # bob's call reaches the provider, refused and rescued on its own
    assert harness.upstream.refusals == 2


async def test_without_tenants_another_credential_gains_nothing(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    _, _, body = refused(harness, 112)
    await send(harness, "a1", body, {"Authorization": "Bearer sk-alice-own"})
    await send(harness, "a2", body, {"Authorization": "Bearer sk-alice-own"})
    assert harness.upstream.refusals == 1
    await send(harness, "b1", body, {"Authorization": "Bearer sk-bob-own"})
    assert harness.upstream.refusals == 2


async def test_a_refusal_holds_only_for_the_format_that_refused(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    bad = png(113)
    aid = ref_id(bad)
    harness.upstream.refused[aid] = False
    await send(harness, "chat", chat_body(inline=[data_url(bad)]))
    messages = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data_url(bad)[22:]}}]}]}
    resp = await harness.client.post("/v1/messages", json=messages, headers={"X-Session-Id": "messages"})
    assert resp.status == 200, await resp.text()
    assert harness.upstream.refusals == 2  # anthropic never refused those bytes: it was asked
    assert rejected(await harness.events("messages")) == [(aid, "anthropic")]


async def test_an_operators_recovery_lifts_it_for_the_tenant(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    bad, aid, body = refused(harness, 114)
    await send(harness, "first", body)
    await harness.app[SERVICES].recording.drain()
    await harness.admit(bad)  # the refused bytes, in the store for the operator's full verification
    resp = await harness.client.post(f"/admin/sessions/first/attachments/{aid}/recover", headers=ADMIN)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["tenant_lifted"] == 1
    del harness.upstream.refused[aid]  # the provider takes the bytes now
    sent = await send(harness, "later", body)
    assert placeholder(aid) not in texts(sent) and rejected(await harness.events("later")) == []


async def test_a_refusal_put_down_to_two_images_is_never_shared(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    one, two = png(115), png(116)
    harness.upstream.refused[ref_id(one)] = False  # an unnamed refusal: both new images are suspects
    body = chat_body(inline=[data_url(one), data_url(two)])
    await send(harness, "first", body)
    assert harness.upstream.refusals == 1 and len(rejected(await harness.events("first"))) == 2
    await send(harness, "second", body)
    assert harness.upstream.refusals == 2  # a guess about two images stays in its session


@pytest.mark.parametrize("named", ["~refusals", "~refusals@0123456789ab"])
async def test_no_client_names_the_refusals_session(make_harness: MakeHarness, named: str) -> None:
    harness = await make_harness(**RECORDING)
    for how in ({"X-Session-Id": named}, None):
        path = "/v1/chat/completions" if how else f"/s/{named}/v1/chat/completions"
        resp = await harness.client.post(path, json=chat_body(inline=[data_url(png(117))]), headers=how or {})
        assert resp.status == 400 and (await resp.json())["error"]["code"] == "INVALID_SESSION_ID"
    assert harness.upstream.received == []


async def test_a_gemini_key_in_the_query_is_a_credential_of_its_own(make_harness: MakeHarness, upstream: Any) -> None:
    from tests.system.test_inline_images import gemini_body

    harness = await make_harness(**RECORDING, **{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})
    bad = png(118)
    harness.upstream.refused[ref_id(bad)] = False
    for key, refusals in (("KEY-ALICE", 1), ("KEY-ALICE", 1), ("KEY-BOB", 2)):
        resp = await harness.client.post(f"/v1beta/models/m:generateContent?key={key}", json=gemini_body(bad),
                                         headers={"X-Session-Id": f"{key}-{refusals}-{len(harness.upstream.received)}"})
        assert resp.status == 200, await resp.text()
        assert harness.upstream.refusals == refusals, key


async def test_without_tenants_a_session_named_like_a_tenants_lifts_on_recovery(make_harness: MakeHarness) -> None:
    harness = await make_harness(**RECORDING)
    bad, aid, body = refused(harness, 119)
    await send(harness, "foo~bar", body)
    await harness.admit(bad)
    resp = await harness.client.post(f"/admin/sessions/foo~bar/attachments/{aid}/recover", headers=ADMIN)
    assert resp.status == 200 and (await resp.json())["tenant_lifted"] == 1, await resp.text()
    del harness.upstream.refused[aid]
    assert placeholder(aid) not in texts(await send(harness, "foo~bar", body))


async def test_a_shared_refusal_is_tried_again_after_the_reprobe_period(make_harness: MakeHarness) -> None:
    """No refusal hides an image for ever: past ``[policy] refusal_reprobe_after`` a session that
    has not met it sends the image once more; refused again, the refusal is recorded anew and holds
    for the next sessions; accepted, the image goes on."""
    import asyncio

    harness = await make_harness(**RECORDING, **{"policy.refusal_reprobe_after": 0.5})
    _, aid, body = refused(harness, 120)
    await send(harness, "first", body)
    await send(harness, "second", body)
    assert harness.upstream.refusals == 1
    await asyncio.sleep(0.6)
    await send(harness, "third", body)  # past the period: the provider is asked again, and refuses
    assert harness.upstream.refusals == 2
    await send(harness, "fourth", body)  # recorded anew: it holds again
    assert harness.upstream.refusals == 2
    assert rejected(await harness.events("fourth")) == [(aid, "openai")]
    await send(harness, "second", body)  # a session keeps its own decision
    assert harness.upstream.refusals == 2
    await asyncio.sleep(0.6)
    del harness.upstream.refused[aid]  # the provider takes the bytes now
    sent = await send(harness, "fifth", body)
    assert placeholder(aid) not in texts(sent) and rejected(await harness.events("fifth")) == []
