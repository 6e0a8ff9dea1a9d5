"""fish (``data/activate/fish.fish``): venv tools that write ``bin/activate.fish`` get the hook appended."""

from __future__ import annotations

import re
from collections.abc import Sequence

from envbuilder.core.shells.base import IF_PRESENT, Shell, Syntax


def _quote(text: str) -> str:
    """fish single quotes: only a backslash and a single quote are special inside."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _dq(text: str) -> str:
    """Text safe inside fish's double quotes (``$`` also starts ``$(...)`` there)."""
    return re.sub(r'(["\\$])', r"\\\1", text)


def _entry(name: str, argv: Sequence[str]) -> str:
    return f"function {name}; {' '.join(_quote(a) for a in argv)} $argv; end"


FISH = Syntax(
    "fish.fish", _quote, _dq, "fish", "activate.fish", venv=IF_PRESENT, added_later=True, entry=_entry
)


def _completer(function: str, ask: str) -> tuple[str, None]:
    """A command substitution: fish needs no function."""
    return f"({ask} 2>/dev/null)", None


SHELLS = (
    Shell("fish", FISH, completer=_completer, completion_file="~/.config/fish/completions/envbuilder.fish"),
)
