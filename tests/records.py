"""Whole calls' records as ``metadata`` recording appends them (``CallRecords``), every field of
each call a value of its own, shared by the event and log tests."""

from __future__ import annotations

from projectionist.policy.events import CallRecords, RefRecord

#: Two routes' shared parts: a Chat call with one header, a Messages call with two and a public URL.
COMMONS = (
    ("openai_chat", "openai_chat", "openai", "POST", "/v1/chat/completions", (("User-Agent", "sdk/1"),), ()),
    ("anthropic", "anthropic", "claude", "POST", "/v1/messages",
     (("anthropic-version", "2023-06-01"), ("User-Agent", "cli/2")), ("http://proxy.test/",)),
)


def whole_calls(count: int, prefix: str = "r") -> CallRecords:
    """``count`` calls alternating between ``COMMONS``: every third has an image reference, a
    shape and a projected digest of its own; every fourth failed (no status, an error code)."""
    calls = []
    for n in range(count):
        imaged = n % 3 == 2
        refs = (RefRecord(f"$.messages[0].content[{n}]", f"sha256:{n + 5000:064x}", "inlined"),) if imaged else ()
        shape = (("messages", f"{n:08x}"),) if imaged else ()
        projected = f"sha256:{n:064x}" if imaged else ""
        failed = n % 4 == 3
        calls.append((n % 2, f"{prefix}{n}", n // 2, f"sha256:{n + 1000:064x}", projected, refs, shape,
                      None if failed else 200, 1.5 + n, None if failed else {"total_tokens": n},
                      "UPSTREAM_TIMEOUT" if failed else None, n % 5 == 4))
    return CallRecords(COMMONS, calls)
