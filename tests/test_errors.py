"""One registry of error codes: every code the code raises is registered once, the docs' table
(docs/reference/errors.md) is the registry, and a code whose message may not reach a client never leaks it."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from projectionist.adapters import anthropic_messages, openai_chat
from projectionist.policy import errors
from projectionist.policy.errors import CODES, STARTUP_CODES, ProjectionistError, Unavailable
from projectionist.proxy.inbound.context import error_response

ROOT = Path(__file__).resolve().parent.parent
CODE_SHAPE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


def codes_in_source() -> dict[str, list[str]]:
    """Every string given as an error code in policy/, adapters/, proxy/: ``code=...`` arguments,
    ``default_code`` attributes, and module constants named like a code, with where they stand."""
    found: dict[str, list[str]] = {}
    for path in [*ROOT.glob("policy/**/*.py"), *ROOT.glob("adapters/**/*.py"), *ROOT.glob("proxy/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            values: list[Any] = []
            if isinstance(node, ast.keyword) and node.arg == "code":
                values.append(node.value)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id if isinstance(t, ast.Name) else getattr(t, "attr", "") for t in targets]
                if any(n == "default_code" or (n.isupper() and n in (node.value.value if isinstance(
                        node.value, ast.Constant) and isinstance(node.value.value, str) else "")) for n in names):
                    values.append(node.value)
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str) and CODE_SHAPE.fullmatch(value.value):
                    found.setdefault(value.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")  # type: ignore[attr-defined]
    return found


def test_the_scanner_finds_codes() -> None:
    found = codes_in_source()
    assert {"INVALID_PATH", "CLIENT_UNAUTHORIZED", "ADMIN_REQUIRED", "INVALID_CONFIG", "ATTACHMENT_WRITE_FAILED"} <= set(found)


def test_every_code_raised_is_registered() -> None:
    unregistered = {code: where for code, where in codes_in_source().items() if code not in CODES | dict.fromkeys(STARTUP_CODES)}
    assert unregistered == {}


def test_every_registered_code_is_used() -> None:
    used = set(codes_in_source()) | {errors.NOT_FOUND, errors.CORRUPT, errors.READ_FAILED, errors.INVALID_REF}
    assert set(CODES) - used == set()


def test_the_registry_defines_each_code_once() -> None:
    tree = ast.parse((ROOT / "policy" / "errors.py").read_text())
    [registry] = [n.value for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)
                  and getattr(n.target, "id", "") == "CODES" and isinstance(n.value, ast.Dict)]
    keys = [k.value if isinstance(k, ast.Constant) else k.id for k in registry.keys]  # type: ignore[union-attr]
    assert len(keys) == len(set(keys))


def readme_table() -> set[tuple[int, str]]:
    text = (ROOT / "docs" / "reference" / "errors.md").read_text()
    section = text[text.index("## By status"):]
    section = section[:section.index("\n## ")]
    pairs: set[tuple[int, str]] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].isdigit():
            pairs |= {(int(cells[0]), code) for code in re.findall(r"`([A-Z_]+)`", cells[1]) if code in CODES
                      or CODE_SHAPE.fullmatch(code)}
    return pairs


def test_the_readme_error_table_is_the_registry() -> None:
    registered = {(code.status, name) for name, code in CODES.items()}
    registered |= {(also, name) for name, code in CODES.items() for also in code.also}
    assert readme_table() == registered


@pytest.mark.parametrize("fmt", [openai_chat, anthropic_messages])
def test_a_private_message_never_reaches_the_client(fmt: Any) -> None:
    error = Unavailable("session log unavailable: unable to open /srv/secret/path/sessions.sqlite3",
                        code="LOG_UNAVAILABLE")
    body = error_response(fmt, error).body
    assert isinstance(body, bytes) and b"/srv/secret" not in body and b"LOG_UNAVAILABLE" in body
    assert error.public_message == CODES["LOG_UNAVAILABLE"].says


def test_status_comes_from_the_registry_unless_a_context_says_otherwise() -> None:
    assert ProjectionistError("x", code="INVALID_PATH").status == 400
    assert ProjectionistError("x", code="UPSTREAM_TIMEOUT").status == 504
    assert errors.Conflict("x", code=errors.CORRUPT, status=409).status == 409
