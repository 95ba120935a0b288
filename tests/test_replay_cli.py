"""``projectionist replay`` on the command line, against the embedded backends' data dir."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from tests.conftest import Harness
from tests.imaging import make_image
from tests.test_replay import call, chat_body

MakeHarness = Callable[..., Awaitable[Harness]]
ROOT = Path(__file__).resolve().parent.parent


async def test_the_command_line_replays_shows_sends_and_diffs(
    make_harness: MakeHarness, make_config: Callable[..., Any]
) -> None:
    config = make_config(**{"record.mode": "full"})
    harness = await make_harness(config)
    ok = await harness.admit(make_image(color=218))
    sent = await call(harness, chat_body(ok))
    await harness.client.close()
    args = ["--data-dir", config.server.data_dir, "--session", "r"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "projectionist.proxy.ops.cli", "replay", *args, "--json", "--diff",
        "--upstream", harness.upstream.url, cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    report = msgspec.json.decode(out)
    assert proc.returncode == 0 and report["matches"] is True and report["diff"]["identical"] is True
    assert harness.upstream.last.body == sent
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "projectionist.proxy.ops.cli", "replay", *args, "--show", cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    text = (await proc.communicate())[0].decode()
    assert proc.returncode == 0 and "matches the record" in text and "base64,<sha256:" in text
