"""One registry of error codes: every code the code raises is registered once and named by
``Code``, never spelled as a string; the docs' table (docs/reference/errors.md) is the registry; a
code renders as its plain string; and a code whose message may not reach a client never leaks it."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from projectionist.adapters import anthropic_messages, openai_chat
from projectionist.policy import errors
from projectionist.policy.errors import CODES, STARTUP_CODES, Code, ProjectionistError, Unavailable
from projectionist.proxy.inbound.context import error_response

ROOT = Path(__file__).resolve().parent.parent
CODE_SHAPE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
REGISTRY = ROOT / "policy" / "errors.py"


def package_modules() -> Iterator[tuple[Path, ast.Module]]:
    """Every module of the package (the three parts and the package's own ``__init__``), parsed."""
    for path in [ROOT / "__init__.py", *sorted(p for part in ("policy", "adapters", "proxy")
                                               for p in (ROOT / part).rglob("*.py"))]:
        yield path, ast.parse(path.read_text(), filename=str(path))


def named_code(node: ast.AST) -> str | None:
    """``NAME`` of a ``Code.NAME`` (or ``errors.Code.NAME``) reference, else None."""
    if isinstance(node, ast.Attribute) and (
            getattr(node.value, "id", None) == "Code" or getattr(node.value, "attr", None) == "Code"):
        return node.attr
    return None


def codes_in_source() -> dict[str, list[str]]:
    """Every code the package gives, with where: ``Code.NAME`` references, and the strings given as
    a code (``code=...`` arguments, ``default_code`` attributes, module constants named like a code)
    that ``test_no_code_is_spelled_as_a_string`` will not let stay. Of the registry itself, only its
    classes' ``default_code`` count (it names every code, used or not)."""
    found: dict[str, list[str]] = {}
    for path, tree in package_modules():
        nodes = ast.walk(tree) if path != REGISTRY else (
            n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "default_code")
        for node in nodes:
            values: list[Any] = []
            if (name := named_code(node)) is not None:
                found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")  # type: ignore[attr-defined]
            elif isinstance(node, ast.keyword) and node.arg == "code":
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


def test_every_named_code_is_used() -> None:
    used = set(codes_in_source()) | {errors.NOT_FOUND, errors.CORRUPT, errors.READ_FAILED, errors.INVALID_REF}
    assert set(Code) - used == set()


def test_the_names_are_the_registry() -> None:
    assert set(Code) == CODES.keys() | STARTUP_CODES and not CODES.keys() & STARTUP_CODES
    assert all(code.value == code.name for code in Code)


def test_the_registry_defines_each_code_once() -> None:
    tree = ast.parse(REGISTRY.read_text())
    [registry] = [n.value for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)
                  and getattr(n.target, "id", "") == "CODES" and isinstance(n.value, ast.Dict)]
    keys = [named_code(k) or getattr(errors, getattr(k, "id", "")) for k in registry.keys]  # type: ignore[arg-type]
    assert len(keys) == len(set(keys)) == len(CODES)


def documentation(tree: ast.Module) -> set[int]:
    """The ids of the strings that are only documentation: a statement that is just a string (a
    module's, class's or function's docstring, or one under an attribute)."""
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
            and isinstance(n.value.value, str)}


def spelled_codes() -> list[str]:
    """``file:line literal`` wherever a string equal to a registered code stands outside the registry."""
    codes = {str(code) for code in Code}
    spelled: list[tuple[str, int, str]] = []
    for path, tree in package_modules():
        if path == REGISTRY:
            continue
        docs = documentation(tree)
        spelled += [(str(path.relative_to(ROOT)), n.lineno, n.value) for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in codes
                    and id(n) not in docs]
    return [f"{file}:{line} {value!r}" for file, line, value in sorted(spelled)]


def test_no_code_is_spelled_as_a_string() -> None:
    """A code in the package is ``Code.NAME``: a string is a typo waiting to be a new code."""
    spelled = spelled_codes()
    assert spelled == [], "error codes spelled as strings (use Code.NAME):\n" + "\n".join(spelled)


def test_the_spelling_check_sees_code_but_not_documentation() -> None:
    tree = ast.parse('"""LOG_UNAVAILABLE"""\nx = 1\n"""INVALID_CONFIG"""\nraise E(code="LOG_UNAVAILABLE")\n')
    docs = documentation(tree)
    assert [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in set(Code)
            and id(n) not in docs] == [4]


def test_a_code_renders_as_its_plain_string() -> None:
    """Log lines, JSON bodies, headers and reprs keep the bytes they had when codes were strings."""
    for code in Code:
        plain = code.name
        assert code == plain and hash(code) == hash(plain) and plain in CODES.keys() | STARTUP_CODES
        assert (str(code), f"{code}", "%s" % code, repr(code)) == (plain, plain, plain, repr(plain))
        assert type(str(code)) is str
        assert msgspec.json.encode({"code": code, code: [code]}) == msgspec.json.encode({"code": plain, plain: [plain]})
        assert json.dumps({"code": code, code: [code]}) == json.dumps({"code": plain, plain: [plain]})
        assert repr(ProjectionistError("x", code=code)) == repr(ProjectionistError("x", code=plain))


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
                        code=Code.LOG_UNAVAILABLE)
    body = error_response(fmt, error).body
    assert isinstance(body, bytes) and b"/srv/secret" not in body and b"LOG_UNAVAILABLE" in body
    assert error.public_message == CODES["LOG_UNAVAILABLE"].says  # looked up by the plain string


def test_status_comes_from_the_registry_unless_a_context_says_otherwise() -> None:
    assert ProjectionistError("x", code=Code.INVALID_PATH).status == 400
    assert ProjectionistError("x", code=Code.UPSTREAM_TIMEOUT).status == 504
    assert errors.Conflict("x", code=errors.CORRUPT, status=409).status == 409
