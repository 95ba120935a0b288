"""The proxy-wide memory budget (issue 37, item 2): the bytes the requests under way hold at once
are bounded, a request past the bound is 503 ``MEMORY_BUSY`` in its client's format before its
body is read, and every byte is given back when its request ends.

A call held in flight (the fake upstream's gate) keeps its bytes; the tests size the next request
from what the budget says is held, so they do not depend on how many copies a call keeps."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from projectionist.policy.errors import ProjectionistError
from projectionist.proxy.inbound.budget import Budget, MemoryBusy
from projectionist.proxy.inbound.services import SERVICES
from tests.conftest import Harness

MakeHarness = Callable[..., Awaitable[Harness]]
KiB = 1024
#: A small budget: twice the largest body (the least the config allows).
SMALL = {"server.memory_budget": 2 * 1024 * KiB, "server.client_max_size": 1024 * KiB,
         "server.websocket_max_message": 1024 * KiB}


def chat(size: int, *, stream: bool = False) -> bytes:
    """An OpenAI chat body of exactly ``size`` bytes."""
    return _sized(size, {"model": "m", "stream": stream, "messages": [{"role": "user", "content": ""}]})


def anthropic(size: int) -> bytes:
    """An Anthropic messages body of exactly ``size`` bytes."""
    return _sized(size, {"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": ""}]})


def _sized(size: int, body: dict[str, Any]) -> bytes:
    body["messages"][0]["content"] = "x" * (size - len(msgspec.json.encode(body)))
    encoded = msgspec.json.encode(body)
    assert len(encoded) == size
    return encoded


def budget_of(harness: Harness) -> Budget:
    return harness.app[SERVICES].budget


@contextlib.asynccontextmanager
async def held_in_flight(harness: Harness, size: int) -> AsyncIterator[asyncio.Task[bytes]]:
    """A streamed call of ``size`` bytes held at its first chunk until the upstream's gate opens
    (at the block's end, if the test did not open it), beside 400 KiB other requests hold (the
    budget is at least twice the largest body: one call alone leaves room for any other)."""
    gate = harness.upstream.gate = asyncio.Event()
    budget = budget_of(harness)
    others = budget.take(400 * KiB, "body")
    body = chat(size, stream=True)

    async def call() -> bytes:
        resp = await harness.client.post("/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json", "X-Session-Id": "held"})
        assert resp.status == 200
        return await resp.read()

    task = asyncio.ensure_future(call())
    try:
        for _ in range(500):
            if len(harness.upstream.received) == 1:
                break
            await asyncio.sleep(0.01)
        assert len(harness.upstream.received) == 1 and budget.held >= others.size + len(body)
        yield task
    finally:
        gate.set()
        others.release()
        await asyncio.wait_for(task, timeout=10)


async def test_a_body_past_the_budget_is_refused_in_its_format_and_the_rest_goes_on(make_harness: MakeHarness) -> None:
    harness = await make_harness(**SMALL)
    budget = budget_of(harness)
    async with held_in_flight(harness, 800 * KiB) as first:
        too_big = anthropic(budget.limit - budget.held + 1)
        assert len(too_big) <= 1024 * KiB  # within client_max_size: only the budget refuses it
        resp = await harness.client.post("/v1/messages", data=too_big, headers={"Content-Type": "application/json"})
        assert resp.status == 503 and resp.headers["x-projectionist-error-code"] == "MEMORY_BUSY"
        assert resp.headers["Retry-After"] == "1"
        body = await resp.json()
        assert body["type"] == "error" and body["error"]["type"] == "api_error"  # Anthropic's shape
        assert "memory budget" in body["error"]["message"]
        assert len(harness.upstream.received) == 1  # it went nowhere
        small = await harness.client.post("/v1/chat/completions", data=chat(2 * KiB),
                                          headers={"Content-Type": "application/json"})
        assert small.status == 200  # what fits goes on beside the held call
        harness.upstream.gate.set()  # type: ignore[union-attr]
        assert b"[DONE]" in await first
    assert budget.held == 0  # every byte given back
    again = await harness.client.post("/v1/messages", data=too_big, headers={"Content-Type": "application/json"})
    assert again.status == 200
    samples = {(s.name, s.labels.get("what")): s.value for family in text_string_to_metric_families(
        await (await harness.client.get("/metrics")).text()) for s in family.samples}
    assert samples["projectionist_memory_refused_total", "body"] == 1
    assert samples["projectionist_memory_refused_total", "message"] == 0
    assert samples["projectionist_memory_held_bytes", None] == 0
    assert samples["projectionist_memory_budget_bytes", None] == budget.limit


async def test_a_declared_body_is_refused_before_any_of_it_is_read(make_harness: MakeHarness) -> None:
    harness = await make_harness(**SMALL)
    budget = budget_of(harness)
    never = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b"{"  # one byte of it, then the client waits for ever
        await never.wait()

    async with held_in_flight(harness, 800 * KiB):
        length = budget.limit - budget.held + 1
        resp = await asyncio.wait_for(harness.client.post(
            "/v1/chat/completions", data=stalled(),
            headers={"Content-Type": "application/json", "Content-Length": str(length)}), timeout=10)
        assert resp.status == 503 and resp.headers["x-projectionist-error-code"] == "MEMORY_BUSY"
        assert (await resp.json())["error"]["code"] == "MEMORY_BUSY"  # OpenAI's shape
    assert budget.held == 0


async def test_a_body_without_a_length_holds_the_largest_until_it_is_read(make_harness: MakeHarness) -> None:
    harness = await make_harness(**SMALL)
    budget = budget_of(harness)
    others = budget.take(512 * KiB, "body")  # what other requests hold meanwhile
    go_on = asyncio.Event()

    async def chunked() -> AsyncIterator[bytes]:
        body = chat(4 * KiB)
        yield body[:10]
        await go_on.wait()
        yield body[10:]

    call = asyncio.ensure_future(harness.client.post("/v1/chat/completions", data=chunked(),
                                                     headers={"Content-Type": "application/json"}))
    for _ in range(500):
        if budget.held > others.size:
            break
        await asyncio.sleep(0.01)
    assert budget.held == others.size + 1024 * KiB  # client_max_size while it comes
    # what would fit beside its 4 KB does not fit beside what it may still become
    refused = await harness.client.post("/v1/chat/completions", data=chat(600 * KiB),
                                        headers={"Content-Type": "application/json"})
    assert refused.status == 503 and refused.headers["x-projectionist-error-code"] == "MEMORY_BUSY"
    go_on.set()
    assert (await call).status == 200
    assert budget.held == others.size  # read, then ended: all of it given back
    fits = await harness.client.post("/v1/chat/completions", data=chat(600 * KiB),
                                     headers={"Content-Type": "application/json"})
    assert fits.status == 200
    others.release()
    assert budget.held == 0


async def test_a_gzip_body_is_refused_as_it_decodes_past_the_budget(make_harness: MakeHarness) -> None:
    harness = await make_harness(**SMALL)
    budget = budget_of(harness)
    async with held_in_flight(harness, 900 * KiB):
        free = budget.limit - budget.held
        plain = chat(free + 64 * KiB)  # under client_max_size once decoded, past what is left of the budget
        assert len(plain) <= 1024 * KiB
        packed = gzip.compress(plain, mtime=0)
        assert len(packed) < free  # the body itself fits: what it decodes to does not
        resp = await harness.client.post("/v1/chat/completions", data=packed,
                                         headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert resp.status == 503 and resp.headers["x-projectionist-error-code"] == "MEMORY_BUSY"
        assert budget.refused["decoded"] == 1 and budget.refused["body"] == 0
    assert budget.held == 0
    ok = await harness.client.post("/v1/chat/completions", data=packed,
                                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert ok.status == 200 and harness.upstream.last.json() == msgspec.json.decode(plain)
    assert budget.held == 0


@pytest.mark.parametrize("multipart", [False, True])
async def test_an_upload_past_the_budget_is_refused_and_stores_nothing(make_harness: MakeHarness,
                                                                       multipart: bool) -> None:
    import aiohttp

    from tests.imaging import make_image

    harness = await make_harness(**SMALL)
    budget = budget_of(harness)
    image = make_image(300, 300)
    others = budget.take(budget.limit - len(image) + 1, "body")  # one byte too few are left for it
    if multipart:
        form = aiohttp.FormData()
        form.add_field("file", image, filename="shot.png", content_type="image/png")
        resp = await harness.client.post("/v1/attachments", data=form)
    else:
        resp = await harness.client.post("/v1/attachments", data=image, headers={"Content-Type": "image/png"})
    assert resp.status == 503 and resp.headers["x-projectionist-error-code"] == "MEMORY_BUSY"
    assert harness.store.total == 0 and budget.held == others.size
    others.release()
    assert (await harness.client.post("/v1/attachments", data=image,
                                      headers={"Content-Type": "image/png"})).status == 200
    assert budget.held == 0


def test_held_bytes_are_counted_exactly_across_threads() -> None:
    budget = Budget(1000)
    refused = 0

    def work() -> None:
        nonlocal refused
        for _ in range(2000):
            try:
                held = budget.take(30, "body")
            except MemoryBusy:
                refused += 1
                continue
            assert budget.held <= budget.limit
            held.grow(10, "decoded") if budget.held + 10 <= budget.limit else None
            held.less(5)
            held.release()
            held.release()  # a second release gives nothing back twice

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert budget.held == 0


def test_a_held_refusal_leaves_the_count_as_it_was() -> None:
    budget = Budget(100)
    held = budget.take(60, "body")
    with pytest.raises(ProjectionistError) as info:
        held.grow(41, "decoded")
    assert info.value.code == "MEMORY_BUSY" and info.value.status == 503 and info.value.retryable
    assert budget.held == 60 and held.size == 60 and budget.refused == {"decoded": 1}
    held.less(100)  # at most what it holds
    assert held.size == 0 and budget.held == 0
    held.release()
    assert budget.held == 0


def test_a_budget_smaller_than_one_request_is_a_config_error(make_config: Callable[..., Any]) -> None:
    with pytest.raises(ProjectionistError) as info:
        make_config(**{"server.memory_budget": 64 * 1024 * KiB})  # client_max_size is 64 MiB
    assert info.value.code == "INVALID_CONFIG" and "server.memory_budget" in info.value.message


async def test_a_declared_body_that_never_comes_is_timed_out_and_gives_its_bytes_back(
        make_harness: MakeHarness) -> None:
    """A client that declares a body and sends none of it cannot keep the budget it holds (the red
    team's slow-body note): ``body_timeout`` seconds without a byte are a 408 ``BODY_TIMEOUT``."""
    harness = await make_harness(**{**SMALL, "server.body_timeout": 0.5})
    budget = budget_of(harness)
    never = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b'{"model": "m", '  # then nothing, for ever
        await never.wait()

    resp = await asyncio.wait_for(harness.client.post(
        "/v1/chat/completions", data=stalled(),
        headers={"Content-Type": "application/json", "Content-Length": str(900 * KiB)}), timeout=10)
    assert resp.status == 408 and resp.headers["x-projectionist-error-code"] == "BODY_TIMEOUT"
    assert budget.held == 0 and harness.upstream.received == []

    async def slow() -> AsyncIterator[bytes]:  # a slow client that keeps sending is not cut
        body = chat(64 * KiB)
        for at in range(0, len(body), 8 * KiB):
            yield body[at:at + 8 * KiB]
            await asyncio.sleep(0.1)

    resp = await harness.client.post("/v1/chat/completions", data=slow(),
                                     headers={"Content-Type": "application/json", "Content-Length": str(64 * KiB)})
    assert resp.status == 200 and harness.upstream.last.body == chat(64 * KiB)
    assert budget.held == 0
