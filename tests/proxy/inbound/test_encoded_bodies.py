"""Request bodies in every encoding: a compressed body the proxy reads (a projected call, an
upload) is decoded, projected and sent on uncompressed with the right headers; a pass-through
forwards the client's bytes exactly, encoding and length included; a bomb is a 413 and an
encoding the proxy does not read a 415. And a 20 MB multipart upload never stalls the loop."""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib
from collections.abc import Awaitable, Callable

import msgspec
import pytest

from projectionist.policy.errors import ProjectionistError
from projectionist.proxy.inbound import bodies
from projectionist.proxy.inbound.bodies import MAX_MEMBERS
from tests.backends import backend_on_both  # noqa: F401  (every proxy test here on both backends)
from tests.conftest import Harness
from tests.imaging import make_image, ref_id

MakeHarness = Callable[..., Awaitable[Harness]]


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


ENCODERS = {"gzip": gzip.compress, "deflate": zlib.compress, "deflate-raw": raw_deflate}


@pytest.mark.parametrize("encoding", sorted(ENCODERS))
async def test_a_compressed_projected_body_is_decoded_projected_and_sent_plain(harness: Harness, encoding: str) -> None:
    image = make_image(color=90)
    aid = await harness.admit(image)
    gone = ref_id(make_image(color=91))
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"attachment:{aid}"}},
        {"type": "image_url", "image_url": {"url": f"attachment:{gone}"}}]}]})
    resp = await harness.client.post("/v1/chat/completions", data=ENCODERS[encoding](body), headers={
        "Content-Encoding": encoding.split("-")[0], "Content-Type": "application/json", "X-Session-Id": "zip"})
    assert resp.status == 200, await resp.text()
    sent = harness.upstream.last
    assert "content-encoding" not in {k.lower() for k in sent.headers}
    parts = sent.json()["messages"][0]["content"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,") and parts[1]["type"] == "text"
    assert [e["type"] for e in await harness.events("zip")] == ["attachment/quarantine"]


async def test_a_compressed_pass_through_body_is_forwarded_byte_for_byte(harness: Harness) -> None:
    plain = msgspec.json.encode({"model": "e", "input": ["the same words again and again"] * 5000})
    packed = gzip.compress(plain)
    resp = await harness.client.post("/v1/embeddings", data=packed, headers={
        "Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert resp.status == 200
    sent = harness.upstream.last
    assert sent.body == packed and sent.headers["Content-Encoding"] == "gzip"
    assert int(sent.headers["Content-Length"]) == len(packed)  # never the decoded length, never cut


async def test_an_encoding_the_proxy_does_not_read_is_415_on_a_projected_route_and_forwarded_elsewhere(
        harness: Harness) -> None:
    resp = await harness.client.post("/v1/chat/completions", data=b"\x1b\x00brotli?", headers={
        "Content-Encoding": "br", "Content-Type": "application/json"})
    assert resp.status == 415 and resp.headers["x-projectionist-error-code"] == "UNSUPPORTED_ENCODING"
    resp = await harness.client.post("/v1/embeddings", data=b"\x1b\x00brotli?", headers={"Content-Encoding": "br"})
    assert resp.status == 200 and harness.upstream.last.body == b"\x1b\x00brotli?"


async def test_a_decompression_bomb_is_a_413(make_harness: MakeHarness) -> None:
    harness = await make_harness(**{"server.client_max_size": 1024 * 1024})
    bomb = gzip.compress(b'{"model": "m", "messages": [' + b" " * (50 * 1024 * 1024) + b"]}")
    assert len(bomb) < 1024 * 1024
    resp = await harness.client.post("/v1/chat/completions", data=bomb, headers={
        "Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert resp.status == 413 and resp.headers["x-projectionist-error-code"] == "PAYLOAD_TOO_LARGE"


def form(image: bytes, purpose: bytes | None = None) -> bytes:
    parts = b""
    if purpose is not None:
        parts += b'--b0undary\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + purpose + b"\r\n"
    parts += (b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="z.png"\r\n'
              b"Content-Type: image/png\r\n\r\n" + image + b"\r\n")
    return parts + b"--b0undary--\r\n"


@pytest.mark.parametrize("path", ["/v1/attachments", "/v1/files"])
async def test_a_compressed_multipart_upload_is_admitted(harness: Harness, path: str) -> None:
    image = make_image(color=92)
    resp = await harness.client.post(path, data=gzip.compress(form(image, b"vision" if "files" in path else None)),
                                     headers={"Content-Encoding": "gzip",
                                              "Content-Type": "multipart/form-data; boundary=b0undary"})
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["id"] == ref_id(image) and harness.upstream.received == []


async def test_the_loop_keeps_answering_during_a_20_mb_files_upload(harness: Harness) -> None:
    """Reports, never asserts, the longest /healthz answer while a 20 MB Files API upload (not an
    image: it is parsed, then forwarded) goes through."""
    body = form(b"\x00" * (20 * 1024 * 1024 - 1024), b"vision").replace(b"image/png", b"application/octet-stream")
    stalls: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            assert (await harness.client.get("/healthz")).status == 200
            stalls.append(time.perf_counter() - started)
            await asyncio.sleep(0.005)

    prober = asyncio.create_task(probe())
    started = time.perf_counter()
    resp = await harness.client.post("/v1/files", data=body,
                                     headers={"Content-Type": "multipart/form-data; boundary=b0undary"})
    took = time.perf_counter() - started
    done.set()
    await prober
    assert resp.status == 200 and len(harness.upstream.last.body) == len(body)  # forwarded whole
    print(f"\nevent-loop stall during a 20 MB Files upload: longest /healthz {max(stalls) * 1000:.1f} ms "
          f"over {len(stalls)} probes; the upload took {took * 1000:.0f} ms")


async def test_every_gzip_member_is_decoded_and_anything_after_them_is_refused(harness: Harness) -> None:
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "two members"}]})
    half = len(body) // 2
    resp = await harness.client.post("/v1/chat/completions", data=gzip.compress(body[:half]) + gzip.compress(body[half:]),
                                     headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert resp.status == 200 and harness.upstream.last.body == body  # not cut after the first member
    resp = await harness.client.post("/v1/chat/completions", data=gzip.compress(body) + b"trailing junk",
                                     headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert resp.status == 400 and resp.headers["x-projectionist-error-code"] == "INVALID_BODY"


async def test_small_bombs_never_stall_other_requests(make_harness: MakeHarness) -> None:
    """A 65 KB body that inflates to 64 MiB is refused (413) off the loop: /healthz answers
    between them (reports the longest /healthz, asserts only that it answered each time)."""
    harness = await make_harness(**{"server.client_max_size": 8 * 1024 * 1024})
    bomb = gzip.compress(b" " * (64 * 1024 * 1024))
    stalls: list[float] = []

    async def bombard() -> None:
        for _ in range(5):
            resp = await harness.client.post("/v1/chat/completions", data=bomb, headers={
                "Content-Encoding": "gzip", "Content-Type": "application/json"})
            assert resp.status == 413

    async def probe() -> None:
        for _ in range(20):
            started = time.perf_counter()
            assert (await harness.client.get("/healthz")).status == 200
            stalls.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(bombard() for _ in range(4)), probe())
    print(f"\nlongest /healthz among 20 bombs: {max(stalls) * 1000:.1f} ms")


async def test_a_body_of_more_gzip_members_than_the_bound_is_a_400_and_the_bound_itself_is_read(
        harness: Harness) -> None:
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "x" * 640}]})
    step = len(body) // MAX_MEMBERS + 1
    pieces = [body[i:i + step] for i in range(0, len(body), step)]
    assert len(pieces) <= MAX_MEMBERS
    resp = await harness.client.post("/v1/chat/completions", data=b"".join(gzip.compress(p) for p in pieces),
                                     headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert resp.status == 200 and harness.upstream.last.body == body
    many = gzip.compress(b"") * (MAX_MEMBERS + 1) + gzip.compress(body)  # empty members: 20 bytes each
    resp = await harness.client.post("/v1/chat/completions", data=many,
                                     headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert resp.status == 400 and resp.headers["x-projectionist-error-code"] == "INVALID_BODY"
    assert str(MAX_MEMBERS) in (await resp.json())["error"]["message"]


class CountingInflater:
    """A ``zlib.decompressobj`` that counts the compressed bytes it is given, for all of them."""

    fed = 0
    make = staticmethod(zlib.decompressobj)  # the real one, kept before the test replaces it

    def __init__(self, wbits: int) -> None:
        self._inner = CountingInflater.make(wbits)

    def decompress(self, data: bytes | memoryview, max_length: int = 0) -> bytes:
        CountingInflater.fed += len(data)
        return self._inner.decompress(data, max_length)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.mark.parametrize("members", [1, 8, MAX_MEMBERS])
def test_inflating_reads_each_compressed_byte_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch,
                                                                        members: int) -> None:
    """The red team's body (many small members in 1 MB) cost 0.8 s and 4 MB 12 s: each member's
    inflater was given the whole rest of the body, whose leftover zlib then copied. Now each is
    given bounded steps from where the last ended: the bytes fed are the body plus at most one
    step per member, not the sum of the rests (members x half the body)."""
    plain = bytes(range(256)) * 4096  # 1 MiB, barely compressible
    size = len(plain) // members + 1
    raw = b"".join(gzip.compress(plain[i:i + size], compresslevel=0) for i in range(0, len(plain), size))
    monkeypatch.setattr(bodies.zlib, "decompressobj", CountingInflater)
    CountingInflater.fed = 0
    assert bodies.inflate(raw, "gzip", 2 * len(plain)) == plain
    assert CountingInflater.fed <= len(raw) + members * bodies._STEP
    if members > 8:  # the old way: every member given the rest of the body
        assert CountingInflater.fed < sum(len(raw) - len(raw) * k // members for k in range(members)) / 4


@pytest.mark.parametrize(("raw", "code"), [  # mtime=0: the ids are the same in every xdist worker
    (gzip.compress(b"x" * 1000, mtime=0)[:-9], "INVALID_BODY"),  # truncated
    (gzip.compress(b"x" * 1000, mtime=0) + b"\x1f", "INVALID_BODY"),  # a member's first byte, then nothing
    (gzip.compress(b"x" * 5000, mtime=0), "PAYLOAD_TOO_LARGE"),  # one byte past the limit at the end of a step
], ids=["truncated", "cut-second-member", "past-limit"])
def test_a_truncated_or_oversized_member_is_refused_whatever_the_steps(raw: bytes, code: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bodies, "_STEP", 7)  # member ends and limits fall inside steps and between them
    with pytest.raises(ProjectionistError) as info:
        bodies.inflate(raw, "gzip", 4999)
    assert info.value.code == code
    assert bodies.inflate(gzip.compress(b"x" * 4999) * 2, "gzip", 9998) == b"x" * 9998
