"""The one registry of shells (pure): every shell envbuilder writes activation for, by name, read by activation
(the scripts written into an env and the line that sources them), images (the scripts beside a mount), tab
completion and the CLI's ``--shell`` choices. A shell is added by an adapter module beside this one (its
``Syntax``, quoting and ``SHELLS``, see :mod:`envbuilder.core.shells.base`), its template in ``data/activate/``, and its
module in :data:`_ADAPTERS`; nothing else names a shell (``tests/unit/test_shell_registry.py`` checks).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from envbuilder.core.shells import csh, fish, posix
from envbuilder.core.shells.base import VENV_HOOKS, Shell, Syntax

#: The adapter modules, in the order their shells are offered; each has ``SHELLS``, its shells.
_ADAPTERS = (posix, fish, csh)

#: Every shell by name, in the order offered (``envbuilder activate --shell``'s choices); the first is the
#: default where ``$SHELL`` names none of them.
SHELLS: dict[str, Shell] = {}
#: The shells with tab completion, by name (``envbuilder completion``'s choices).
COMPLETED: dict[str, Shell] = {}


def register(shell: Shell) -> None:
    """Offer ``shell``: after those registered before it."""
    taken = {name for known in SHELLS.values() for name in (known.name, *known.aliases)}
    clash = sorted(taken & {shell.name, *shell.aliases})
    if clash:
        raise ValueError(f"shell {shell.name}: {', '.join(clash)} is registered already")
    if shell.syntax.venv not in VENV_HOOKS:
        raise ValueError(f"shell {shell.name}: venv must be one of {', '.join(VENV_HOOKS)}")
    SHELLS[shell.name] = shell
    if shell.completer is not None:
        COMPLETED[shell.name] = shell


for _adapter in _ADAPTERS:
    for _shell in _adapter.SHELLS:
        register(_shell)


def get(name: str) -> Shell:
    """The shell of that name (a name from :data:`SHELLS`: the CLI's choices)."""
    return SHELLS[name]


def default() -> Shell:
    return next(iter(SHELLS.values()))


def from_program(program: str) -> Optional[Shell]:
    """The shell whose scripts a shell program of that name runs (``$SHELL``'s last part), if any."""
    for shell in SHELLS.values():
        if program == shell.name or program in shell.aliases:
            return shell
    return None


def syntaxes() -> tuple[Syntax, ...]:
    """Each script language of the registered shells once, in their order: an env holds scripts for each."""
    return tuple(dict.fromkeys(shell.syntax for shell in SHELLS.values()))


def in_every_env() -> str:
    """The shells every env has activation for, in words (``a or b``, ``a, b or c``): the way out where an
    older env lacks another's."""
    return in_words(shell.name for shell in SHELLS.values() if not shell.syntax.added_later)


def in_words(names: Iterable[str]) -> str:
    """Names as a sentence lists them: ``a``, ``a or b``, ``a, b or c``."""
    listed = list(names)
    return " or ".join([", ".join(listed[:-1]), listed[-1]] if len(listed) > 1 else listed)
