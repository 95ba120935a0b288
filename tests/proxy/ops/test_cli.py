"""The ``projectionist`` command line: ``serve`` as a real process, the admin verbs, config loading."""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from projectionist.policy.errors import InvalidRequest
from projectionist.proxy.config import Config, load_config
from tests.backends import free_port
from tests.calls import recorded_calls, state_kinds
from tests.commands import cli
from tests.fakes import FakeUpstream
from tests.imaging import make_image, ref_id
from tests.paths import ROOT


@pytest.fixture
async def served(tmp_path: Path, upstream: FakeUpstream) -> AsyncIterator[tuple[str, Path, Any]]:
    """``projectionist serve`` as its own process, in front of the fake upstream."""
    port, admin, data = free_port(), free_port(), tmp_path / "data"
    env = {**os.environ, "PROJECTIONIST_ADMIN_TOKEN": "env-token"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--port", str(port), "--data-dir", str(data),
        "--admin-listen", f"127.0.0.1:{admin}",
        "--upstream", f"openai={upstream.url}", "--upstream", f"anthropic={upstream.url}",
        cwd=ROOT, env=env, stderr=asyncio.subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            try:
                async with http.get(f"{base}/healthz") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
        else:
            proc.kill()
            pytest.fail("serve did not come up")
    try:
        proc.admin_url = f"http://127.0.0.1:{admin}"  # type: ignore[attr-defined]
        yield base, data, proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 15)


async def test_serve_projects_records_and_the_admin_verbs_see_it(served: tuple[str, Path, Any], upstream: FakeUpstream) -> None:
    base, data, proc = served
    image = make_image(color=60)
    gone = ref_id(image)
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"attachment:{gone}?name=x.png"}}]}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json=body,
                             headers={"X-Session-Id": "cli", "Authorization": "Bearer sk-live-secret"}) as resp:
            assert resp.status == 200
        async with http.get(f"{proc.admin_url}/admin/sessions/cli/events",
                            headers={"Authorization": "Bearer env-token"}) as resp:
            assert resp.status == 200
            events = (await resp.json())["events"]
        # the console is not on the proxy's origin: there /admin is a path the proxy owns, never
        # forwarded, and its answer says where the console is
        async with http.get(f"{base}/admin/sessions/cli/events", headers={"Authorization": "Bearer env-token"}) as resp:
            assert (resp.status, resp.headers["X-Projectionist-Error-Code"]) == (404, "CONSOLE_NOT_HERE")
            assert f"{proc.admin_url}/admin/ui" in (await resp.json())["error"]["message"]
        async with http.get(f"{proc.admin_url}/v1/models", headers={"Authorization": "Bearer env-token"}) as resp:
            assert resp.status == 404  # and the console's listener proxies nothing
    assert not [r for r in upstream.received if r.path_qs.startswith(("/admin", "/v1/models"))]
    # recording is on by default: the quarantine, then the call's record with its outcome
    assert state_kinds(events) == ["attachment/quarantine", "request/recorded"]
    assert [outcome is not None for _, outcome in recorded_calls(events)] == [True]
    assert upstream.last.json()["messages"][0]["content"][0]["text"] == \
        f'[image unavailable: not_found; "x.png" ({gone[:15]})]'

    rc, out, _ = await cli("events", "cli", "--data-dir", str(data))
    assert rc == 0
    event, *records = msgspec.json.decode(out)["events"]
    assert event["type"] == "attachment/quarantine" and event["data"]["name"] == "x.png"
    [(request_record, outcome)] = recorded_calls(records)
    assert request_record["data"]["refs"] == [{"path": "/messages/0/content/0", "attachment_id": gone,
                                               "outcome": "placeholder", "failure": "not_found"}]
    assert outcome is not None and outcome["status"] == 200 and outcome["usage"]["total_tokens"] == 17

    rc, out, _ = await cli("quarantine", "cli", "--data-dir", str(data))
    assert rc == 0 and msgspec.json.decode(out)["quarantined"][0]["attachment_id"] == gone

    rc, _, err = await cli("recover", "cli", gone, "--data-dir", str(data))
    assert rc == 1 and "ATTACHMENT_NOT_FOUND" in err

    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/attachments", data=image, headers={"Content-Type": "image/png"}) as resp:
            assert (await resp.json())["id"] == gone
    rc, out, _ = await cli("recover", "cli", gone, "--data-dir", str(data))
    assert rc == 0 and msgspec.json.decode(out)["recovered"] is True

    rc, out, _ = await cli("fork", "cli", "cli-2", "--at-seq", "1", "--data-dir", str(data))
    assert rc == 0 and msgspec.json.decode(out)["event"]["data"] == {"parent": "cli", "at_seq": 1}
    # the running server sees what another process appended, on its next request
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json=body, headers={"X-Session-Id": "cli"}) as resp:
            assert resp.status == 200
    assert upstream.last.json()["messages"][0]["content"][0]["type"] == "image_url"

    proc.send_signal(signal.SIGTERM)
    _, err_bytes = await asyncio.wait_for(proc.communicate(), 15)
    log = err_bytes.decode()
    lines = [msgspec.json.decode(line) for line in log.splitlines() if line.startswith("{")]
    requests = [entry for entry in lines if entry.get("event") == "request" and entry.get("route") == "openai_chat"]
    assert requests and requests[0]["quarantined"] == ["not_found"] and requests[0]["session"] == "cli"
    assert "sk-live-secret" not in log and "env-token" not in log


async def test_bad_config_is_refused_with_a_clear_code(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nport = 1\nunknown_key = true\n')
    rc, _, err = await cli("serve", "--config", str(bad))
    assert rc == 2 and "INVALID_CONFIG" in err and "unknown_key" in err


def test_documented_config_file_is_exactly_the_defaults() -> None:
    assert load_config(ROOT / "config" / "projectionist.toml") == load_config(None) == Config()


def test_replica_example_config_loads_and_opens_the_replicated_backends() -> None:
    from projectionist.proxy.edge.app import open_log, open_store
    from projectionist.proxy.sessionlog.postgres import PostgresLog
    from projectionist.proxy.stores.s3 import S3Store

    config = load_config(ROOT / "config" / "replicas.example.toml")
    assert (config.store.kind, config.log.kind, config.log.postgres.schema) == ("s3", "postgres", "projectionist")
    env = {"PROJECTIONIST_PG_DSN": "postgresql://u@db/x", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    assert isinstance(open_store(config, env), S3Store)
    assert isinstance(open_log(config, env), PostgresLog)  # the pool opens lazily: no database needed here
    with pytest.raises(InvalidRequest) as missing:
        open_log(config, {})
    assert missing.value.code == "INVALID_CONFIG"


def test_config_rejects_bad_values() -> None:
    with pytest.raises(InvalidRequest) as info:
        load_config(None, **{"server.sessionless": "maybe"})
    assert info.value.code == "INVALID_CONFIG"
    with pytest.raises(InvalidRequest):
        load_config(None, **{"upstreams.x": {"format": "openai", "url": "ftp://nope"}})


def test_secrets_come_from_the_environment_first() -> None:
    config = load_config(None, **{"server.admin_token": "file-token",
                                  "upstreams.openai": {"format": "openai", "url": "http://u", "api_key": "file-key",
                                                       "api_key_env": "MY_KEY"}})
    assert config.admin_token({}) == "file-token"
    assert config.admin_token({"PROJECTIONIST_ADMIN_TOKEN": "env"}) == "env"
    assert config.upstream_key("openai", {}) == "file-key"
    assert config.upstream_key("openai", {"MY_KEY": "env-key"}) == "env-key"
    assert config.upstreams["anthropic"].url == "https://api.anthropic.com"  # defaults stay


def test_event_loop_choice() -> None:
    import uvloop

    from projectionist.proxy.ops.serve import event_loop

    for choice, kind in (("asyncio", asyncio.AbstractEventLoop), ("auto", uvloop.Loop), ("uvloop", uvloop.Loop)):
        loop = event_loop(choice)
        try:
            assert isinstance(loop, kind)
            assert (choice == "asyncio") != isinstance(loop, uvloop.Loop)
        finally:
            loop.close()


_MALLINFO = """
import ctypes, os, sys
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
from projectionist.proxy.ops.serve import fix_malloc_thresholds
fix_malloc_thresholds()
before = libc.mallinfo2().hblks
bodies = [bytes(4 << 20) for _ in range(3)]  # image-body sized
after_bodies = libc.mallinfo2().hblks
huge = bytes(64 << 20)  # past the threshold
print(after_bodies - before, libc.mallinfo2().hblks - after_bodies)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
@pytest.mark.parametrize("environ", [{}, {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}])
def test_serving_process_takes_image_sized_buffers_from_the_heap(environ: dict[str, str]) -> None:
    """``fix_malloc_thresholds`` (in a child process: it changes process-wide malloc state): a
    4 MB buffer comes from the heap, which the periodic trim hands back, not from a mapping of its
    own made and unmade per request; a 64 MB one still gets its own. An operator's own
    ``MALLOC_MMAP_THRESHOLD_`` is left as it is."""
    out = subprocess.run([sys.executable, "-c", _MALLINFO], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, **environ})
    assert out.stdout.split() == (["0", "1"] if not environ else ["3", "1"])


def test_serving_process_freezes_startup_objects_and_raises_the_young_gc_threshold() -> None:
    """``tune_gc`` runs in a child process (it changes process-wide GC state)."""
    code = ("import gc; from projectionist.proxy.ops.serve import tune_gc, GC_YOUNG_THRESHOLD; before = gc.get_threshold(); "
            "tune_gc(); after = gc.get_threshold(); "
            "print(after[0] == GC_YOUNG_THRESHOLD > before[0], after[1:] == before[1:], gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True"]
