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
#: Parts of one dotted key (a.b.c): tomllib's work on a key grows with the square of its parts, so a long one
#: is refused before it is parsed. Each part nests a table, so MAX_DEPTH bounds them anyway.
MAX_KEY_PARTS = MAX_DEPTH
#: Items of one array (no recipe or lockfile comes near: a lock lists a few hundred packages).
MAX_ARRAY = 10_000


class TOMLDecodeError(ValueError):
    """Not valid TOML (tomllib's message, with line and column), or past one of the limits above."""


class TOMLLimitError(TOMLDecodeError):
    """Valid TOML past one of the limits above: ``key`` names where (as written, shortened), ``limit`` which."""

    def __init__(self, message: str, key: str | None, limit: int) -> None:
        super().__init__(message)
        self.key = key
        self.limit = limit


def loads_shipped(text: str) -> dict[str, Any]:
    """TOML that the package itself ships (its torch table): parsed without the limits' scan, which guards what
    users, sites and registries write (tests/unit/test_loader.py checks that the shipped tables pass it). The
    scan took a third of the torch table's 30 ms parse, on every create and plan."""
    data: dict[str, Any] = _toml.loads(text)
    return data


def loads(text: str) -> dict[str, Any]:
    if text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark some editors write; TOML itself does not allow it
    _Scan(text).run()
    try:
        data: dict[str, Any] = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise TOMLDecodeError(str(exc)) from None
    except RecursionError:  # pragma: no cover - the scan stops every nesting the parser recurses on
        raise TOMLDecodeError(f"nested more than {MAX_DEPTH} levels deep") from None
    _check_depth(data)
    return data


#: Where each kind of string ends (escapes and up to two closing quotes that belong to a multi-line string's
#: content included; an unterminated string runs to the end of its line or of the text, and the parser reports
#: it).
_STRINGS = (
    r'"""(?:[^"\\]|\\[\s\S]|"(?!""))*(?:"{3,5}|\Z)',
    r"'''(?:[^']|'(?!''))*(?:'{3,5}|\Z)",
    r'"(?:[^"\\\n]|\\.)*"?',
    r"'[^'\n]*'?",
)
#: The tokens the scan tells apart; a key part is a bare word or a string, glued to the next by a dot.
_TOKEN = re.compile(
    "|".join(
        (
            r"(?P<comment>#[^\n]*)",
            "(?P<part>[A-Za-z0-9_-]+|" + "|".join(_STRINGS) + ")",
            r"(?P<dot>\.)",
            r"(?P<space>[ \t]+)",
            r"(?P<open>[\[{])",
            r"(?P<close>[\]}])",
            r"(?P<other>[^A-Za-z0-9_\-. \t\[\]{}#\"']+)",
        )
    )
)


def _shorten(key: str) -> str:
    return key if len(key) <= 60 else key[:57].rstrip(".") + "..."


class _Scan:
    """One pass over the text before the parser sees it, linear in its size: arrays and inline tables nested
    deeper than MAX_DEPTH (the parser recurses on them) and dotted keys of more than MAX_KEY_PARTS parts (the
    parser's work on one grows with the square of its parts) are refused, naming the key they belong to.

    Brackets, dots and words inside strings and comments do not count; table headers add at most 2. Malformed
    text is left to the parser, which says where it is wrong. A run of dotted parts outside strings can only be
    a key: a float or a time has two parts at most."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.depth = 0
        self.parts = 0  # parts of the dotted run being read, and where it starts and ends
        self.span = (0, 0)
        self.after_dot = False
        self.table = ""  # the last [table] header, and the last key assigned (under it)
        self.key = ""
        self.line_start = True
        self.header = False

    def run(self) -> None:
        for token in _TOKEN.finditer(self.text):
            kind = token.lastgroup
            if kind == "part":
                self._part(token.start(), token.end())
            elif kind == "dot":
                self.after_dot = self.parts > 0
            elif kind == "open":
                self._open(token.start())
            elif kind == "close":
                self._close()
            elif kind == "other":
                self._other(token.group())
            elif kind == "comment":
                self.parts, self.after_dot = 0, False

    def _part(self, start: int, end: int) -> None:
        if self.after_dot:
            self.parts += 1
            self.span = (self.span[0], end)
        else:
            self.parts, self.span = 1, (start, end)
        self.after_dot = False
        self.line_start = False
        if self.parts > MAX_KEY_PARTS:
            raise TOMLLimitError(
                f"a dotted key of more than {MAX_KEY_PARTS} parts ({self._where(self.span[0])}); "
                f"the limit is {MAX_KEY_PARTS}",
                self._full(self._spanned()),
                MAX_KEY_PARTS,
            )

    def _open(self, at: int) -> None:
        if self.line_start and self.depth == 0:
            self.header = True
        elif self.parts and not self.header:
            self.key = self._full(self._spanned())
        self.depth += 1
        self.parts, self.after_dot = 0, False
        if self.depth > MAX_DEPTH:
            raise TOMLLimitError(
                f"nested more than {MAX_DEPTH} levels deep ({self._where(at)}); the limit is {MAX_DEPTH}",
                self.key or None,
                MAX_DEPTH,
            )

    def _close(self) -> None:
        if self.header and self.parts:
            self.table = self._spanned()
        self.depth = max(self.depth - 1, 0)
        if self.depth == 0:
            self.header = False
        self.parts, self.after_dot = 0, False

    def _other(self, chars: str) -> None:
        if "=" in chars and self.parts and self.depth == 0:
            self.key = self._full(self._spanned())
        if "\n" in chars and self.depth == 0:
            self.line_start = True
        self.parts, self.after_dot = 0, False

    def _spanned(self) -> str:
        return "".join(self.text[self.span[0] : self.span[1]].split())

    def _full(self, key: str) -> str:
        return _shorten(f"{self.table}.{key}" if self.table else key)

    def _where(self, at: int) -> str:
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        return f"at line {line}, column {column}"


def _check_depth(data: dict[str, Any]) -> None:
    """Table headers and dotted keys nest without brackets (later code walks documents recursively); arrays stay
    under MAX_ARRAY items."""
    todo: list[tuple[Any, int, str]] = [(data, 0, "")]
    while todo:
        node, depth, path = todo.pop()
        if isinstance(node, (dict, list)) and depth > MAX_DEPTH:
            raise TOMLLimitError(
                f"nested more than {MAX_DEPTH} levels deep; the limit is {MAX_DEPTH}",
                _shorten(path),
                MAX_DEPTH,
            )
        if isinstance(node, dict):
            todo.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in node.items())
        elif isinstance(node, list):
            if len(node) > MAX_ARRAY:
                raise TOMLLimitError(
                    f"an array of {len(node)} items; the limit is {MAX_ARRAY}", _shorten(path), MAX_ARRAY
                )
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
