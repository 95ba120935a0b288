"""Request bodies and the small HTTP checks around the load runs.

Bodies: ``text1k`` (a ~1 KB OpenAI chat body), ``sse`` (the same, streamed), ``images`` (ten
deterministic ~200 KB noise PNGs, by reference or inlined as base64) and ``quarantined`` (ten
references that were never admitted). Checks: admission, probes that a scenario really answers
200, the time to the first SSE chunk, projectionist's ``/metrics`` counters, and the mixed load.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import random
import statistics
import time
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

import aiohttp
from PIL import Image

from bench.load import AUTH_KEY

CHAT = "/v1/chat/completions"
MODEL = "fake-model"
N_IMAGES = 10
IMAGE_SIDE = 260  # 260 * 260 * 3 bytes of noise: a ~200 KB PNG that does not compress
IMAGES_SESSION = "bench-images"
TEXT_SESSION = "bench-text"
QUARANTINED_SESSION = "bench-quarantined"
OVERHEAD_HEADER = "x-projectionist-overhead-ms"
TIMEOUT = aiohttp.ClientTimeout(total=60)
JSON_HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {AUTH_KEY}"}


# --- bodies ------------------------------------------------------------------------------------


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def text_body(stream: bool = False, size: int = 1024) -> bytes:
    """An OpenAI chat body of about ``size`` bytes without any reference (``stream`` added if set)."""
    words = ("the", "proxy", "forwards", "this", "request", "unchanged", "because", "it", "carries", "no",
             "attachment", "reference")
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "temperature": 0, "messages": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": ""}]}
    text: list[str] = []
    while len(_encode(body)) < size:
        text.append(words[len(text) % len(words)])
        body["messages"][1]["content"] = " ".join(text)
    if stream:
        body["stream"] = True
    return _encode(body)


def make_images(count: int = N_IMAGES, side: int = IMAGE_SIDE) -> list[bytes]:
    """``count`` distinct PNGs of seeded RGB noise, identical on every run."""
    images = []
    for index in range(count):
        noise = random.Random(f"bench-image-{index}").randbytes(side * side * 3)
        out = io.BytesIO()
        Image.frombytes("RGB", (side, side), noise).save(out, format="PNG")
        images.append(out.getvalue())
    return images


def image_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _image_chat(urls: list[str]) -> bytes:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What changed between these ten screenshots?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return _encode({"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": parts}]})


def refs_body(ids: list[str]) -> bytes:
    return _image_chat([f"attachment:{i}" for i in ids])


def inline_body(images: list[bytes]) -> bytes:
    return _image_chat(["data:image/png;base64," + base64.b64encode(data).decode() for data in images])


def responses_body(images: Sequence[bytes] = (), size: int = 1024) -> bytes:
    """A ``POST /v1/responses`` body of about ``size`` bytes of text, with ``images`` inlined as
    ``input_image`` data URLs (as Codex attaches a screenshot)."""
    text: list[str] = []
    parts: list[dict[str, Any]] = [{"type": "input_text", "text": ""}]
    parts += [{"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(data).decode()}
              for data in images]
    body: dict[str, Any] = {"model": MODEL, "instructions": "You are a concise assistant.",
                            "input": [{"role": "user", "content": parts}]}
    while len(_encode(body)) - sum(len(p.get("image_url", "")) for p in parts) < size:
        text.append(("the", "proxy", "relays", "this", "turn")[len(text) % 5])
        parts[0]["text"] = " ".join(text)
    return _encode(body)


def quarantined_ids(count: int = N_IMAGES) -> list[str]:
    """Ids that are never admitted: every reference to them ends up quarantined."""
    return [image_id(f"bench-never-admitted-{index}".encode()) for index in range(count)]


# --- checks ------------------------------------------------------------------------------------


class ScenarioBroken(RuntimeError):
    """A target answered a scenario's request with something other than a success."""


async def admit(base: str, images: list[bytes]) -> list[str]:
    """Upload ``images`` through ``POST /v1/attachments``; their ids, checked against the digests."""
    ids = []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for index, data in enumerate(images):
            async with session.post(f"{base}/v1/attachments?name=bench-{index}.png", data=data,
                                    headers={"Content-Type": "image/png"}) as response:
                answer = await response.json(content_type=None)
                if response.status not in (200, 201) or answer.get("id") != image_id(data):
                    raise ScenarioBroken(f"admission of image {index} failed: HTTP {response.status} {answer}")
                ids.append(answer["id"])
    return ids


@dataclass
class Probe:
    requests: int
    overhead_ms: float | None  # median of the x-projectionist-overhead-ms header, when sent


async def probe(url: str, body: bytes, headers: dict[str, str], count: int = 20) -> Probe:
    """Send ``count`` sequential requests; raise unless each is a 200 with a complete answer."""
    overheads: list[float] = []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for _ in range(count):
            async with session.post(url, data=body, headers={**JSON_HEADERS, **headers}) as response:
                payload = await response.read()
                if response.status != 200 or not payload:
                    raise ScenarioBroken(f"POST {url}: HTTP {response.status}: {payload[:300]!r}")
                if b'"stream":true' in body and b"[DONE]" not in payload:
                    raise ScenarioBroken(f"POST {url}: SSE answer without [DONE]: {payload[-200:]!r}")
                value = response.headers.get(OVERHEAD_HEADER)
                if value is not None:
                    try:
                        overheads.append(float(value))
                    except ValueError:
                        pass
    return Probe(count, statistics.median(overheads) if overheads else None)


async def first_chunk(url: str, body: bytes) -> tuple[float, float]:
    """(ms to the first body byte, ms to the end) of one streamed request."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        started = time.perf_counter()
        async with session.post(url, data=body, headers=JSON_HEADERS) as response:
            first = await response.content.readany()
            ttfb = time.perf_counter() - started
            rest = [first]
            while chunk := await response.content.readany():
                rest.append(chunk)
            total = time.perf_counter() - started
            if response.status != 200 or not first or b"[DONE]" not in b"".join(rest):
                raise ScenarioBroken(f"streamed POST {url}: HTTP {response.status}, incomplete answer")
    return ttfb * 1000, total * 1000


async def ttfb_check(url: str, body: bytes, attempts: int = 3) -> dict[str, float]:
    samples = [await first_chunk(url, body) for _ in range(attempts)]
    return {"ttfb_ms": statistics.median(s[0] for s in samples),
            "total_ms": statistics.median(s[1] for s in samples)}


async def quarantine_events(base: str, session_id: str, token: str) -> int:
    """How many ``attachment/quarantine`` events the session log holds (admin API)."""
    url, headers = f"{base}/admin/sessions/{session_id}/events", {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session, session.get(url, headers=headers) as response:
        if response.status != 200:
            raise ScenarioBroken(f"admin events: HTTP {response.status}")
        events = (await response.json())["events"]
    return sum(1 for event in events if event.get("type") == "attachment/quarantine")


async def store_reads(base: str, needle: str = "store_reads") -> tuple[float | None, str]:
    """(sum of every ``*store_reads*`` sample, or of the metrics named like ``needle``, on
    ``GET /metrics``, note); None when unavailable."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session, session.get(f"{base}/metrics") as response:
        text = await response.text(errors="replace")
        status, kind = response.status, response.headers.get("Content-Type", "")
    if status != 200 or "json" in kind:
        return None, f"GET /metrics answered HTTP {status}: no Prometheus endpoint"
    total, names = 0.0, set()
    for line in text.splitlines():
        if line.startswith("#") or needle not in line:
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{")[0]
        if metric.endswith(("_created", "_bucket")):
            continue
        try:
            total += float(value)
        except ValueError:
            continue
        names.add(metric)
    if not names:
        return None, f"GET /metrics has no metric named like *{needle}*"
    return total, ", ".join(sorted(names))


async def mixed_load(url: str, plan: list[tuple[bytes, dict[str, str]]], total: int,
                     concurrency: int) -> tuple[int, float]:
    """Send ``total`` requests cycling through ``plan`` from ``concurrency`` workers; (errors, seconds)."""
    next_index, errors = 0, 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=TIMEOUT) as session:

        async def worker() -> None:
            nonlocal next_index, errors
            while next_index < total:
                body, headers = plan[next_index % len(plan)]
                next_index += 1
                try:
                    async with session.post(url, data=body, headers={**JSON_HEADERS, **headers}) as response:
                        await response.read()
                        errors += response.status != 200
                except (TimeoutError, aiohttp.ClientError):
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return errors, time.perf_counter() - started
