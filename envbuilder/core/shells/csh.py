"""csh and tcsh (``data/activate/csh.csh``; Lmod's init for both is the same file). csh has no functions, so
``deactivate`` is an alias that sources ``envbuilder/deactivate.csh``, and envbuilder writes the whole
``bin/activate.csh`` of a venv. An interactive tcsh takes no comments."""

from __future__ import annotations

from envbuilder.core.shells.base import OWN, Shell, Syntax


def _quote(text: str) -> str:
    """csh single quotes: literal but for ``'`` and ``!`` (history), each put outside them, backslashed."""
    return "'" + text.replace("'", "'\\''").replace("!", "'\\!'") + "'"


def _dq(text: str) -> str:
    """Text inside csh's double quotes: closed around a single-quoted piece (csh has no escapes inside)."""
    return '"' + _quote(text) + '"'


CSH = Syntax("csh.csh", _quote, _dq, "csh", "activate.csh", venv=OWN, undo_script=True, added_later=True)


def _completer(function: str, ask: str) -> tuple[str, None]:
    """tcsh's ``complete`` builtin runs a backquoted command for the words; tcsh has no functions, and its
    backquotes cannot silence stderr alone (``__complete`` prints nothing there for a foreseeable error)."""
    return f"`{ask}`", None


SHELLS = (
    Shell(
        "tcsh",
        CSH,
        aliases=("csh",),
        comments=False,
        completer=_completer,
        completion_file="~/.tcsh_completion.envbuilder",
    ),
)
