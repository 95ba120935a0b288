"""A served process writes one JSON request line for every request, also those answered before
any handler runs: aiohttp's parser refusing bytes that are no HTTP, and ``Expect`` values other
than ``100-continue`` (answered 417 by the proxy's own expect handler)."""

from __future__ import annotations

import asyncio
import signal
import sys

import msgspec

from tests.backends import free_port
from tests.paths import ROOT

RAW = [
    b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",  # a path that is not UTF-8
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nCookie: " + b"9" * 10_000 + b"\r\n\r\n",  # a header over the limit
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad chunks
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nContent-Length: 2\r\n\r\n{}",
]


async def send(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    return answer


async def serve(tmp_path: object) -> tuple[asyncio.subprocess.Process, int, dict[str, object]]:
    """``serve`` on free ports, with its first stderr line. A port another test worker took between
    ``free_port`` and the bind (serve's one-line ``LISTEN_FAILED``) is a race of the test's own,
    not what it checks: that start is tried again on other ports."""
    for _ in range(5):
        port, admin = free_port(), free_port()
        if port == admin:
            continue
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--port", str(port),
            "--admin-listen", f"127.0.0.1:{admin}", "--data-dir", str(tmp_path), cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        try:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            if b"LISTEN_FAILED" in line and not line.startswith(b"{"):
                await asyncio.wait_for(proc.wait(), 30)
                continue
            return proc, port, msgspec.json.decode(line)  # any other first line must be JSON
        except BaseException:  # a silent or non-JSON start is the test's failure; the process goes
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
    raise AssertionError("no free ports for serve after 5 tries")


async def test_every_request_leaves_one_json_request_line_even_unparsed(tmp_path: object) -> None:
    proc, port, first = await serve(tmp_path)
    assert proc.stderr is not None
    try:
        assert first["event"] == "listening"
        answers = [await send(port, data) for data in RAW]
        assert all(a.split(b" ")[1].startswith(b"4") for a in answers), answers
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(proc.stderr.read(), 30)).decode()
        await proc.wait()
    lines = [msgspec.json.decode(line) for line in rest.splitlines() if line.strip()]  # every line is JSON
    requests = [line for line in lines if line["event"] == "request"]
    assert len(requests) == len(RAW), lines
    assert sorted(r["status"] for r in requests) == sorted(int(a.split(b" ")[1]) for a in answers)
    assert not [line for line in lines if "exception" in line or line["event"] == "Error handling request"], lines
