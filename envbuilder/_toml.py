"""TOML reading on every supported Python (tomllib from 3.11, the tomli backport before)."""

from __future__ import annotations

import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib as _toml  # novermin - guarded by the version check above
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as _toml  # type: ignore[import-not-found,no-redef,unused-ignore]

TOMLDecodeError = _toml.TOMLDecodeError


def loads(text: str) -> dict[str, Any]:
    data: dict[str, Any] = _toml.loads(text)
    return data


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
