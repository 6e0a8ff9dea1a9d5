"""The module system's lines as text (pure): ``module use`` then ``module load``, every value quoted, from module
names and paths checked here. Batch scripts (:mod:`envbuilder.render.batch`), the plan's steps in words
(:mod:`envbuilder.plan.listing`) and the module system adapter (:mod:`envbuilder.system.modules`) all write them so."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from envbuilder.core.errors import RecipeError
from envbuilder.core.values import require_carriable, require_module_name


def module_lines(use: Sequence[str], load: Sequence[str]) -> list[str]:
    """`module use` then `module load` lines, every value quoted (batch scripts, plan steps, the adapter).
    Raises RecipeError for a module name that is not one, or a path with a line break (Lmod would run either)."""
    for i, path in enumerate(use):
        require_carriable(path, f"modules.use[{i}]")
        if path.startswith("-"):
            raise RecipeError(
                f"a `module use` path cannot start with '-', found {path!r}", key=f"modules.use[{i}]"
            )
    for i, name in enumerate(load):
        require_module_name(name, f"modules.load[{i}]")
    lines = [f"module use {shlex.quote(p)}" for p in use]
    if load:
        lines.append("module load " + " ".join(shlex.quote(m) for m in load))
    return lines
