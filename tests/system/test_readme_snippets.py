"""The docs' SDK snippets run as written: each Python block of "With the official SDKs" in
docs/clients.md, in a fresh interpreter with no provider key in its environment, against a live
proxy whose upstreams are the fake one. Only the address changes (the page's 127.0.0.1:8787
becomes the test server's); a snippet that raises, or never reaches the upstream, fails here."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import sys
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from tests.conftest import Harness
from tests.fakes import FakeUpstream
from tests.imaging import make_image
from tests.paths import ROOT

PAGE = ROOT / "docs" / "clients.md"
SECTION = "## With the official SDKs"
ADDRESS = "http://127.0.0.1:8787"


def snippets() -> list[str]:
    text = PAGE.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end], re.S)


def test_the_section_has_a_snippet_per_sdk() -> None:
    found = snippets()
    assert len(found) == 3
    assert [next(m for m in ("openai", "anthropic", "google") if f"from {m}" in s) for s in found] == \
        ["openai", "anthropic", "google"]


async def run(snippet: str, base: str, cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.endswith("_BASE_URL")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", snippet.replace(ADDRESS, base), cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode(errors="replace")[-3000:]


@pytest.fixture
async def live(make_harness: Callable[..., Awaitable[Harness]], upstream: FakeUpstream) -> Harness:
    return await make_harness(**{"upstreams.gemini": {"format": "gemini", "url": upstream.url}})


def inlined(received: Any) -> list[str]:
    """Every base64 image payload of a received upstream body, in whatever format it came."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and (key in ("data", "url", "image_url") or value.startswith("data:")):
                    found.append(value.rsplit(",", 1)[-1])
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(msgspec.json.decode(received.body))
    return found


@pytest.mark.parametrize(("index", "model_calls"), [(0, 2), (1, 1), (2, 2)], ids=["openai", "anthropic", "gemini"])
async def test_each_snippet_runs_as_written_and_the_image_reaches_the_model(live: Harness, tmp_path: Path,
                                                                            index: int, model_calls: int) -> None:
    image = make_image(6, 4, color=170 + index)
    (tmp_path / "shot.png").write_bytes(image)
    await run(snippets()[index], str(live.client.make_url("")).rstrip("/"), tmp_path)
    calls = [r for r in live.upstream.received if r.method == "POST" and not r.path_qs.endswith("/files")]
    assert len(calls) == model_calls  # each model call of the snippet, with the image inlined
    for call in calls:
        assert base64.b64encode(image).decode() in inlined(call)
    events = await live.events("my-session")
    assert [e["type"] for e in events if e["type"].startswith("attachment/")] == []  # nothing quarantined
