"""No credential reaches a call's record (found by a red team): not in a header whose name the
first filter did not know (X-Authorization, Cloudflare AI Gateway's cf-aig-authorization, ...)
nor in any header's value shaped like one (a scheme prefix, an sk- or AIza key), not in a query
parameter by its name, and never the proxy's own token in a query; so replay, to the configured
upstream or to an override URL, sends none of them again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from tests.calls import chat_body, recorded_calls
from tests.conftest import ADMIN, Harness
from tests.imaging import make_image
from tests.proxy.upstream.test_client import MakeServer, RawServer, serve  # noqa: F401 (a fixture)
from tests.proxy.upstream.test_replay_wire import chat_answers

MakeHarness = Callable[..., Awaitable[Harness]]

#: Headers real gateways and SDK wrappers carry credentials in, whose names the filter misses.
LEAKY = {
    "X-Authorization": "Bearer sk-leak-x-authorization",
    "cf-aig-authorization": "Bearer sk-leak-cloudflare-ai-gateway",  # Cloudflare AI Gateway's own token
    "Authentication": "sk-leak-authentication",
    "X-ApiToken": "sk-leak-apitoken",
    "X-AccessToken": "sk-leak-accesstoken",
    "X-Api-Keys": "sk-leak-api-keys",
    "X-Credential": "sk-leak-credential",
    "X-Custom": "Bearer sk-leak-in-a-value",
}


@pytest.mark.parametrize("name", list(LEAKY))
async def test_a_credential_header_is_not_recorded(make_harness: MakeHarness, make_config: Callable[..., Any],
                                                   serve: MakeServer, name: str) -> None:  # noqa: F811
    raw: RawServer = await serve(chat_answers)
    config = make_config(**{"record.mode": "metadata", "upstreams.openai": {
        "format": "openai", "url": str(raw.url), "api_key": "sk-conf"}})
    harness = await make_harness(config)
    image = await harness.admit(make_image(color=93))
    headers = {"Content-Type": "application/json", "X-Session-Id": "r", name: LEAKY[name]}
    resp = await harness.client.post("/v1/chat/completions", data=chat_body(image), headers=headers)
    assert resp.status == 200
    await resp.read()
    [(request, _)] = recorded_calls(await harness.events("r"))
    assert LEAKY[name].encode() not in msgspec.json.encode(request), f"{name} was recorded in the session log"


async def test_replay_to_an_override_url_sends_no_recorded_credential(
        make_harness: MakeHarness, make_config: Callable[..., Any], serve: MakeServer) -> None:  # noqa: F811
    configured: RawServer = await serve(chat_answers)
    elsewhere: RawServer = await serve(chat_answers)
    config = make_config(**{"record.mode": "full", "upstreams.openai": {
        "format": "openai", "url": str(configured.url), "api_key": "sk-conf"}})
    harness = await make_harness(config)
    image = await harness.admit(make_image(color=94))
    headers = {"Content-Type": "application/json", "X-Session-Id": "r",
               "X-Authorization": "Bearer sk-leak-x-authorization"}
    resp = await harness.client.post("/v1/chat/completions", data=chat_body(image), headers=headers)
    assert resp.status == 200
    await resp.read()
    replayed = await harness.client.post("/admin/sessions/r/replay", headers=ADMIN,
                                         json={"send": True, "upstream": str(elsewhere.url)})
    assert replayed.status == 200, await replayed.text()
    [(_, request)] = elsewhere.requests
    assert b"sk-conf" not in request  # held: the configured key stays home
    assert b"sk-leak-x-authorization" not in request, "a recorded credential went to the override host"


async def test_the_proxys_own_token_in_a_query_parameter_is_not_recorded_or_replayed(
        make_harness: MakeHarness, make_config: Callable[..., Any], serve: MakeServer,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The live call withholds any query parameter holding one of the proxy's tokens, whatever
    its name (``upstream_query``); the record filters the query by name only
    (``recorded_path``), so the session log keeps the client token, and replay sends it upstream."""
    monkeypatch.setenv("PROJECTIONIST_CLIENT_TOKENS", "ct-own-client-token-1")
    raw: RawServer = await serve(chat_answers)
    config = make_config(**{"record.mode": "full", "upstreams.openai": {
        "format": "openai", "url": str(raw.url), "api_key": "sk-conf"}})
    harness = await make_harness(config)
    token = {"X-Projectionist-Token": "ct-own-client-token-1"}
    resp = await harness.client.post("/v1/attachments", data=make_image(color=95), headers={**token, "Content-Type": "image/png"})
    assert resp.status == 200, await resp.text()
    image = (await resp.json())["id"]
    resp = await harness.client.post("/v1/chat/completions?auth=ct-own-client-token-1", data=chat_body(image),
                                     headers={**token, "Content-Type": "application/json", "X-Session-Id": "r"})
    assert resp.status == 200, await resp.text()
    await resp.read()
    [(_, live)] = raw.requests
    assert b"ct-own-client-token-1" not in live  # held: the live call withholds it
    listing = await harness.client.get("/admin/sessions", headers=ADMIN)
    [session] = [s["session"] for s in (await listing.json())["sessions"]]
    replayed = await harness.client.post(f"/admin/sessions/{session}/replay", headers=ADMIN, json={"send": True})
    assert replayed.status == 200, await replayed.text()
    [_, (_, again)] = raw.requests
    events = await harness.client.get(f"/admin/sessions/{session}/events", headers=ADMIN)
    in_log = b"ct-own-client-token-1" in await events.read()
    assert not in_log and b"ct-own-client-token-1" not in again, \
        f"client token in the session log: {in_log}; sent upstream by replay: {b'ct-own-client-token-1' in again}"


@pytest.mark.parametrize("name", ["auth_token", "x-api-key", "secret", "password", "client_secret"])
async def test_a_credential_query_parameter_is_not_recorded(make_harness: MakeHarness, make_config: Callable[..., Any],
                                                            serve: MakeServer, name: str) -> None:  # noqa: F811
    """``recorded_path`` drops only ``CREDENTIAL_QUERY`` (key, api_key, api-key, apikey,
    access_token, token); the header filter's own rule (a name that says key, token, secret,
    password or auth) is not applied to query names."""
    raw: RawServer = await serve(chat_answers)
    config = make_config(**{"record.mode": "metadata", "upstreams.openai": {"format": "openai", "url": str(raw.url)}})
    harness = await make_harness(config)
    image = await harness.admit(make_image(color=97))
    resp = await harness.client.post(f"/v1/chat/completions?{name}=sk-leak-in-query", data=chat_body(image),
                                     headers={"Content-Type": "application/json", "X-Session-Id": "r"})
    assert resp.status == 200
    await resp.read()
    [(request, _)] = recorded_calls(await harness.events("r"))
    assert b"sk-leak-in-query" not in msgspec.json.encode(request), f"?{name}= was recorded: {request['data']['path']}"


def test_the_recorded_headers_of_calls_seen_before_and_of_one_with_a_new_header() -> None:
    """``recordable_headers`` answers a call whose every header was seen before from what it
    remembers; a header it has not seen (harmless or a credential) is looked at, in its place."""
    from multidict import CIMultiDict

    from projectionist.proxy.call.outgoing import recordable_headers

    seen = [("Content-Type", "application/json"), ("Authorization", "Bearer sk-one"), ("X-Client", "plain")]
    expected = (("Content-Type", "application/json"), ("X-Client", "plain"))
    assert recordable_headers(CIMultiDict(seen).items()) == expected
    assert recordable_headers(CIMultiDict(seen).items()) == expected  # all seen before
    assert recordable_headers(CIMultiDict([*seen, ("Authorization", "Bearer sk-two")]).items()) == expected
    assert recordable_headers(CIMultiDict([*seen, ("X-Client", "plain")]).items()) == (*expected, ("X-Client", "plain"))
    # a new harmless header among known ones is kept, in its place; a credential in a known name's value is not
    new = [("X-New", "v1"), *seen, ("X-Client", "Bearer sk-leak-in-a-known-name")]
    assert recordable_headers(CIMultiDict(new).items()) == (("X-New", "v1"), *expected)
    assert recordable_headers(CIMultiDict(new).items()) == (("X-New", "v1"), *expected)
