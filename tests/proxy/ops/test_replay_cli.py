"""``projectionist replay`` on the command line, against the embedded backends' data dir."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from tests.calls import call, chat_body
from tests.conftest import Harness
from tests.imaging import make_image
from tests.paths import ROOT

MakeHarness = Callable[..., Awaitable[Harness]]


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


async def test_sending_to_an_unreachable_upstream_is_one_line_not_a_traceback(
    make_harness: MakeHarness, make_config: Callable[..., Any]
) -> None:
    config = make_config(**{"record.mode": "full"})
    harness = await make_harness(config)
    await call(harness, chat_body(harness.upstream.url and "sha256:" + "1" * 64))
    await harness.client.close()
    for target in ("http://127.0.0.1:1", "http://[::1"):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "projectionist.proxy.ops.cli", "replay", "--data-dir", config.server.data_dir,
            "--session", "r", "--send", "--upstream", target, cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        lines = err.decode().strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in err.decode(), err
        assert lines[0].startswith("projectionist: ") and ("UPSTREAM_UNAVAILABLE" in lines[0] or
                                                           "INVALID_REQUEST" in lines[0])
