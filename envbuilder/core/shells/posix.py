"""bash and zsh: both run plain POSIX sh (``data/activate/posix.sh``); conda's shell module defines ``conda`` for
both. Every venv tool writes a ``bin/activate`` for them."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from envbuilder.core.shells.base import ALWAYS, Shell, Syntax


def _dq(text: str) -> str:
    """Text safe inside double quotes."""
    return re.sub(r'(["\\$`])', r"\\\1", text)


def _entry(name: str, argv: Sequence[str]) -> str:
    return f'{name}() {{ {" ".join(shlex.quote(a) for a in argv)} "$@"; }}'


POSIX = Syntax("posix.sh", shlex.quote, _dq, "sh", "activate", venv=ALWAYS, runs_conda=True, entry=_entry)


def _bash_completer(function: str, ask: str) -> tuple[str, str]:
    return function, f'{function}() {{\n  compgen -W "$({ask} 2>/dev/null)" -- "$1"\n}}'


def _zsh_completer(function: str, ask: str) -> tuple[str, str]:
    return (
        function,
        f'{function}() {{\n  local -a names\n  names=(${{(f)"$({ask} 2>/dev/null)"}})\n  compadd -a names\n}}',
    )


BASH = Shell("bash", POSIX, completer=_bash_completer, completion_file="~/.bash_completion")
ZSH = Shell("zsh", POSIX, completer=_zsh_completer, completion_file="~/.zfunc/_envbuilder")
SHELLS = (BASH, ZSH)
