"""The policy, the adapters and the proxied call stay small functions: no function in ``policy/``,
``adapters/`` or ``proxy/call/`` has a cyclomatic complexity above ``LIMIT``, as radon measures it
(each ``if``, loop, ``except``, boolean operator, comprehension and ``case`` counts; closures and
methods are measured on their own). An offender is named with its file, line and complexity: split
it into named steps rather than raise the limit; none is let through."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import add_inner_blocks, cc_visit
from radon.visitors import Function

ROOT = Path(__file__).resolve().parents[1]
#: The folders measured, from the checkout's root.
SCANNED = ("policy", "adapters", "proxy/call")
LIMIT = 15


def complexities(code: str, where: str) -> dict[str, int]:
    """Every function, method and closure of ``code`` with its complexity, as ``where:line name``."""
    blocks = add_inner_blocks(cc_visit(code))
    return {f"{where}:{b.lineno} {b.fullname}": b.complexity for b in blocks if isinstance(b, Function)}


def measured() -> dict[str, int]:
    found: dict[str, int] = {}
    for part in SCANNED:
        for path in sorted((ROOT / part).rglob("*.py")):
            found.update(complexities(path.read_text(), path.relative_to(ROOT).as_posix()))
    return found


def offenders(found: dict[str, int]) -> dict[str, int]:
    """The functions over ``LIMIT``."""
    return {name: cc for name, cc in sorted(found.items()) if cc > LIMIT}


def test_no_function_is_more_complex_than_the_limit() -> None:
    found = measured()
    seen = {f"{where.rsplit(':', 1)[0]} {function}" for where, function in (name.split(" ", 1) for name in found)}
    assert {"policy/decide.py decide", "policy/decide.py _View.__init__", "adapters/base.py part_pointer",
            "proxy/call/relay.py relay", "proxy/call/websocket.py Socket._outward", "proxy/call/body.py build"} <= seen  # the scan sees them
    assert offenders(found) == {}, f"over complexity {LIMIT}: {offenders(found)}"


def test_an_offender_is_named_with_its_complexity() -> None:
    """The measure can fail: a function of 16 branches is named, also as a closure or a method."""
    ladder = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(LIMIT))
    nested = "\n".join("    " + line for line in ladder.splitlines())
    code = (f"def ladder(x):\n{ladder}\n    return -1\n\n"
            f"def outer():\n    def inner(x):\n{nested}\n        return -1\n    return inner\n\n"
            f"class Table:\n    def rule(self, x):\n{nested}\n        return -1\n")
    found = complexities(code, "policy/example.py")
    assert offenders(found) == {
        "policy/example.py:1 ladder": LIMIT + 1, "policy/example.py:35 outer.inner": LIMIT + 1,
        "policy/example.py:70 Table.rule": LIMIT + 1}
    assert found["policy/example.py:34 outer"] == 1  # a closure's branches are its own, not its parent's

