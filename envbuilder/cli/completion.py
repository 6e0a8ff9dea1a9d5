"""Shell completion: static scripts that shtab writes from the parser, so they cannot drift from it. Recipe and
env names change between uses, so the scripts ask ``envbuilder __complete recipes|envs`` for them as the user
presses tab; that command imports only what it needs to list them."""

from __future__ import annotations

import argparse
import os
from typing import Any

from envbuilder.cli import helptext
from envbuilder.core.errors import EnvbuilderError
from envbuilder.core.shells import registry as shells

#: What the hidden command can list.
KINDS = ("recipes", "envs")
#: Arguments (by their dest) whose values are recipe or env names, in every command that has one.
_NAMED_BY = {"recipe": "recipes", "recipes": "recipes", "env": "envs"}


def _names_completer(kind: str) -> dict[str, Any]:
    """shtab's per-shell completer for one kind of name, from each shell's adapter (a shell function, or a
    command substitution), each calling back into envbuilder; each adapter keeps errors off the user's prompt."""
    function = f"_envbuilder_{kind}"
    ask = f"envbuilder __complete {kind}"
    out: dict[str, Any] = {}
    preambles: dict[str, str] = {}
    for name, shell in shells.COMPLETED.items():
        if shell.completer is None:  # never: COMPLETED holds only shells with one
            continue
        out[name], preamble = shell.completer(function, ask)
        if preamble is not None:
            preambles[name] = preamble
    return {**out, "preamble": preambles}


def _mark_names(parser: argparse.ArgumentParser) -> None:
    """Attach the name completers to the parser's name arguments (shtab reads an action's ``complete``)."""
    parsers = [parser, *(sub for _, _, sub in helptext.subcommands(parser))]
    for each in parsers:
        for action in each._actions:
            kind = _NAMED_BY.get(action.dest)
            if kind and not action.choices:
                setattr(action, "complete", _names_completer(kind))  # noqa: B010 - Action declares no such field


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell``; it marks ``parser``, so pass one built for this."""
    import shtab  # noqa: PLC0415 - only this command needs it

    _mark_names(parser)
    text = str(shtab.complete(parser, shell=shell))
    finish = shells.COMPLETED[shell].finish_completion
    return text if finish is None else finish(text)


def names(kind: str) -> list[str]:
    """Recipe names on the user's search path, or the envs they have built; none where that cannot be read
    (a broken config must not print errors under the user's cursor)."""
    from envbuilder.core import settings  # noqa: PLC0415 - the scripts need neither: only this command
    from envbuilder.system import state  # noqa: PLC0415 - the scripts need neither: only this command

    try:
        if kind == "envs":
            return state.names(settings.home(os.environ))
        from envbuilder.recipe.catalog import Catalog  # noqa: PLC0415 - recipes only: `envs` stays fast

        return Catalog.from_env(warn=lambda _message: None).names()
    except (EnvbuilderError, OSError):
        return []
