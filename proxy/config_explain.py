"""A configuration mistake said so a person can act on it (proxy layer).

msgspec names a mistake by its path (``Object contains unknown field `prot` - at `$.server```).
``explain`` says it in the operator's terms instead: the file and the TOML line the key is on, or
the command-line flag it came from; for an unknown key, the nearest valid one; for a value
outside a fixed set, the valid values.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

_AT: Final = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<at>[^`]*)`)?$", re.DOTALL)
_UNKNOWN: Final = re.compile(r"Object contains unknown field `(?P<key>[^`]*)`")


def explain(error: msgspec.ValidationError, root: type[msgspec.Struct], *, path: str | Path | None = None,
            flags: Mapping[str, str] | None = None) -> str:
    """``error`` as one line: where (``FILE:LINE``, or the flag), which key, what is wrong, and
    what would be right. ``flags`` maps dotted keys to the flag that set them (``server.port`` ->
    ``--port``)."""
    found = _AT.match(str(error))
    what, at = (found["what"], found["at"] or "") if found else (str(error), "")
    # msgspec writes a table of tables' key as ``[...]``: one step, any name (``*``)
    keys = [part for part in re.split(r"\.|\[|\]", at.replace("[...]", ".*").lstrip(".")) if part]
    unknown = _UNKNOWN.match(what)
    if unknown:
        keys.append(unknown["key"])
    dotted = ".".join(keys)
    hint = ""
    owner = _struct_at(root, keys[:-1]) if keys else None
    if unknown and owner is not None:
        near = difflib.get_close_matches(unknown["key"], [f.name for f in msgspec.structs.fields(owner)], n=1)
        hint = f"; did you mean `{near[0]}`?" if near else \
            f"; valid keys: {', '.join(f.name for f in msgspec.structs.fields(owner))}"
    elif owner is not None and keys:
        choices = _choices(owner, keys[-1])
        if choices:
            hint = f"; valid values: {', '.join(choices)}"
    flag = (flags or {}).get(dotted)
    if flag is not None:
        return f"{flag}: {what}{hint}"
    where = _where(path, keys) if path is not None else None
    shown = dotted.replace(".*", ".<name>") or "(top level)"
    return f"{where or 'invalid configuration'}: `{shown}`: {what}{hint}"


def _struct_at(root: type[msgspec.Struct], keys: list[str]) -> type[msgspec.Struct] | None:
    """The Struct type that holds ``keys``' last step (a table's type), or None."""
    current: Any = root
    for key in keys:
        if key == "*":  # the name within a table of tables: its value type is current already
            continue
        if not (isinstance(current, type) and issubclass(current, msgspec.Struct)):
            return None
        field = next((f for f in msgspec.structs.fields(current) if f.name == key), None)
        if field is None:
            return None
        current = _unwrap(field.type)
        if typing.get_origin(current) is dict:  # a table of tables (upstreams): the value type
            current = _unwrap(typing.get_args(current)[1])
    return current if isinstance(current, type) and issubclass(current, msgspec.Struct) else None


def _unwrap(kind: Any) -> Any:
    while typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    return kind


def _choices(owner: type[msgspec.Struct], key: str) -> list[str]:
    field = next((f for f in msgspec.structs.fields(owner) if f.name == key), None)
    kind = _unwrap(field.type) if field is not None else None
    if typing.get_origin(kind) is typing.Literal:
        return [repr(v) if isinstance(v, str) else str(v) for v in typing.get_args(kind)]
    return []


def _where(path: str | Path, keys: list[str]) -> str | None:
    """``FILE:LINE`` of the key (its table's header, then the key in it), or ``FILE``."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return str(path)
    if not keys:
        return str(path)
    table, key = keys[:-1], keys[-1]
    start = 0
    if table:
        steps = [r"[^.\]]+" if k == "*" else re.escape(k) for k in table]
        header = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(steps) + r"\s*\]\s*(#.*)?$")
        start = next((n for n, line in enumerate(lines) if header.match(line)), -1)
        if start < 0:
            return str(path)
    assignment = re.compile(r"^\s*" + re.escape(key) + r"\s*=")
    for number in range(start, len(lines)):
        if number > start and lines[number].lstrip().startswith("["):
            break
        if assignment.match(lines[number]):
            return f"{path}:{number + 1}"
    if not table:  # a table of its own: its header
        header = re.compile(r"^\s*\[\s*" + re.escape(key) + r"\s*[\].]")
        found = next((n for n, line in enumerate(lines) if header.match(line)), None)
        return f"{path}:{found + 1}" if found is not None else str(path)
    return f"{path}:{start + 1}"
