"""The plan's steps in words (pure), as ``envbuilder plan`` lists them: the modules, the build, each install
command, the activation and how the env is validated."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from envbuilder.core.modulelines import module_lines
from envbuilder.plan.activation import Activation

if TYPE_CHECKING:
    from envbuilder.recipe.loader import Recipe


def steps_in_words(
    recipe: Recipe,
    prefix: str,
    commands: Sequence[Sequence[str]],
    activate: Activation,
    launcher_name: str,
) -> list[str]:
    """The plan's steps in words, as ``envbuilder plan`` lists them."""
    mods = recipe.modules
    steps = []
    loads = module_lines(mods.use, mods.load)
    if mods.load:
        loads[-1] += f"  ({mods.system})"
    steps += loads
    extra = [m for m in mods.build_only if m not in mods.load]
    steps += [f"{line}  (build only)" for line in module_lines((), extra)]
    steps.append(
        f"build the {recipe.env.kind} env in a temporary sibling of {prefix}; move it into place once complete"
    )
    for cmd in commands:
        steps.append(" ".join(shlex.quote(c) for c in cmd))
    if (
        activate.modules
        or activate.conda_env
        or activate.env
        or activate.unset
        or activate.prepend
        or activate.append
    ):
        steps.append(
            "activate extension: "
            + ", ".join(
                [
                    *(f"module load {m}" for m in activate.modules),
                    *([f"conda activate {activate.conda_env}"] if activate.conda_env else []),
                    *(f"{k}={v}" for k, v in activate.env.items()),
                    *(f"unset {v}" for v in activate.unset),
                    *(f"{k}={':'.join(v)}:${k}" for k, v in activate.prepend.items()),
                    *(f"{k}=${k}:{':'.join(v)}" for k, v in activate.append.items()),
                ]
            )
        )
    if activate.modules or mods.build_only:
        steps.append(f"activation {activate.modules_said(mods.load, mods.build_only)}")
    steps.append(f"validate through {launcher_name}")
    return steps
