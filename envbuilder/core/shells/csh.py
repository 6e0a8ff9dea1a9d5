"""csh and tcsh (``data/activate/csh.csh``; Lmod's init for both is the same file). csh has no functions, so
``deactivate`` is an alias that sources ``envbuilder/deactivate.csh``, and envbuilder writes the whole
``bin/activate.csh`` of a venv. An interactive tcsh takes no comments."""

from __future__ import annotations

import re
from collections.abc import Sequence

from envbuilder.core.shells.base import OWN, Shell, Syntax


def _quote(text: str) -> str:
    """csh single quotes: literal but for ``'`` and ``!`` (history), each put outside them, backslashed."""
    return "'" + text.replace("'", "'\\''").replace("!", "'\\!'") + "'"


def _dq(text: str) -> str:
    """Text inside csh's double quotes: closed around a single-quoted piece (csh has no escapes inside)."""
    return '"' + _quote(text) + '"'


#: What a csh alias's double-quoted words may hold: csh has no escapes inside them (``$``, ``!``, `````, ``"``).
_WORD = re.compile(r"[^\"$!`\\\n]*")


def _entry(name: str, argv: Sequence[str]) -> str:
    """An alias (csh has no functions): its words double-quoted, the alias's arguments after them."""
    bad = [a for a in argv if not _WORD.fullmatch(a)]
    if bad:
        raise ValueError(f"csh cannot carry {bad[0]!r} in an alias")
    return f"alias {name} '{' '.join(chr(34) + a + chr(34) for a in argv)} \\!*'"


CSH = Syntax(
    "csh.csh", _quote, _dq, "csh", "activate.csh", venv=OWN, undo_script=True, added_later=True, entry=_entry
)


def _completer(function: str, ask: str) -> tuple[str, None]:
    """tcsh's ``complete`` builtin runs a backquoted command for the words; tcsh has no functions, and its
    backquotes cannot silence stderr alone (``__complete`` prints nothing there for a foreseeable error)."""
    return f"`{ask}`", None


def _recipes_first(text: str) -> str:
    """tcsh's rules name a command by the word before the cursor (``n/show/``), so shtab's rule for ``show ENV``
    also caught ``recipes show RECIPE``; tcsh takes the first rule that matches, so a rule for the word two
    back (``N/recipes/``: ``recipes show``, ``recipes diff``) goes before them all."""
    first = text.index("'n/")
    return f"{text[:first]}'N/recipes/`envbuilder __complete recipes`/' \\\n        {text[first:]}"


SHELLS = (
    Shell(
        "tcsh",
        CSH,
        aliases=("csh",),
        comments=False,
        completer=_completer,
        finish_completion=_recipes_first,
        completion_file="~/.tcsh_completion.envbuilder",
    ),
)
