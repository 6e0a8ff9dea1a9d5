"""TOML reading on every supported Python (tomllib from 3.11, the tomli backport before)."""

from __future__ import annotations

import re
import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib as _toml  # novermin - guarded by the version check above
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as _toml  # type: ignore[import-not-found,no-redef,unused-ignore]

#: Deeper than any recipe, lockfile or table needs (they stop at 5), and far below where the parser's
#: recursion would end in an internal error.
MAX_DEPTH = 32


class TOMLDecodeError(ValueError):
    """Not valid TOML (tomllib's message, with line and column), or nested deeper than MAX_DEPTH."""


def loads(text: str) -> dict[str, Any]:
    if text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark some editors write; TOML itself does not allow it
    _check_brackets(text)
    try:
        data: dict[str, Any] = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise TOMLDecodeError(str(exc)) from None
    except RecursionError:  # pragma: no cover - _check_brackets stops every nesting the parser recurses on
        raise TOMLDecodeError(f"nested more than {MAX_DEPTH} levels deep") from None
    _check_depth(data)
    return data


#: What the bracket scan stops at, and where each kind of string ends (escapes and up to two closing quotes
#: that belong to a multi-line string's content included; an unterminated string runs to the end of its line or
#: of the text, and the parser reports it).
_SPECIAL = re.compile(r"[#\"'\[\]{}]")
_STRING_ENDS = {
    '"""': re.compile(r'"""(?:[^"\\]|\\[\s\S]|"(?!""))*(?:"{3,5}|\Z)'),
    "'''": re.compile(r"'''(?:[^']|'(?!''))*(?:'{3,5}|\Z)"),
    '"': re.compile(r'"(?:[^"\\\n]|\\.)*"?'),
    "'": re.compile(r"'[^'\n]*'?"),
}


def _check_brackets(text: str) -> None:
    """Refuse arrays and inline tables nested deeper than MAX_DEPTH before the (recursive) parser sees them.

    Brackets inside strings and comments do not count; table headers add at most 2. Malformed text is left to
    the parser, which says where it is wrong."""
    depth = 0
    i = 0
    while True:
        found = _SPECIAL.search(text, i)
        if found is None:
            return
        i = found.start()
        ch = text[i]
        if ch == "#":
            end = text.find("\n", i)
            if end < 0:
                return
            i = end + 1
        elif ch in "\"'":
            quote = ch * 3 if text.startswith(ch * 3, i) else ch
            match = _STRING_ENDS[quote].match(text, i)
            i = match.end() if match else len(text)
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, i) + 1
                column = i - (text.rfind("\n", 0, i) + 1) + 1
                raise TOMLDecodeError(
                    f"nested more than {MAX_DEPTH} levels deep (at line {line}, column {column})"
                )
            i += 1
        else:
            depth = max(depth - 1, 0)
            i += 1


def _check_depth(data: dict[str, Any]) -> None:
    """Dotted keys (a.b.c...) and table headers nest without brackets; later code walks documents recursively."""
    todo: list[tuple[Any, int, str]] = [(data, 0, "")]
    while todo:
        node, depth, path = todo.pop()
        if isinstance(node, (dict, list)) and depth > MAX_DEPTH:
            shown = path if len(path) <= 60 else path[:57].rstrip(".") + "..."
            raise TOMLDecodeError(f"nested more than {MAX_DEPTH} levels deep (at key {shown})")
        if isinstance(node, dict):
            todo.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(node))


def dumps(data: dict[str, Any]) -> str:
    """TOML for plain data (what ``loads`` returns): scalars and inline arrays first, then sub-tables, then arrays
    of tables, so ``loads(dumps(x)) == x``. Published recipes are written with it."""
    out: list[str] = []
    _table(data, [], out)
    return "\n".join(out).strip() + "\n"


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _table(data: dict[str, Any], path: list[str], out: list[str]) -> None:
    for key, value in data.items():
        if not isinstance(value, dict) and not _is_table_array(value):
            out.append(f"{_key(key)} = {_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            out.extend(["", f"[{'.'.join(_key(k) for k in [*path, key])}]"])
            _table(value, [*path, key], out)
    for key, value in data.items():
        if _is_table_array(value):
            for item in value:
                out.extend(["", f"[[{'.'.join(_key(k) for k in [*path, key])}]]"])
                _table(item, [*path, key], out)


def _key(key: str) -> str:
    if key and all(c.isalnum() or c in "-_" for c in key) and key.isascii():
        return key
    return _string(key)


def _string(text: str) -> str:
    escaped = []
    for ch in text:
        if ch in '"\\':
            escaped.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            escaped.append(f"\\u{ord(ch):04x}")
        else:
            escaped.append(ch)
    return '"' + "".join(escaped) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
