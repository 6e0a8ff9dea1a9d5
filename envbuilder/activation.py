"""Activate scripts written into an env: the extension and the hook in ``bin/activate`` of a venv, a user-prefix
env's ``bin/activate``, a conda env's activate.d/deactivate.d hooks. ``envbuilder.activate_scripts`` renders
them (pure, from the templates in ``envbuilder/data/activate``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Optional

from envbuilder import activate_scripts
from envbuilder.errors import StateError
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import CONSTRAINTS


def _write_extension(prefix: Path, act: Activation, env_var: Optional[str] = None) -> None:
    script = prefix / activate_scripts.SCRIPT_REL
    script.parent.mkdir(parents=True, exist_ok=True)
    text = activate_scripts.render_script(act, constraints=has_constraints(prefix), env_var=env_var)
    script.write_text(text, encoding="utf-8")


#: The shells ``envbuilder activate --shell`` takes: the activate script each sources, and its quoting.
SHELLS = {
    "bash": ("activate", shlex.quote),
    "zsh": ("activate", shlex.quote),
    "fish": ("activate.fish", activate_scripts.FISH.quote),
    "tcsh": ("activate.csh", activate_scripts.CSH.quote),
}


def default_shell(environ: Mapping[str, str]) -> str:
    """The user's shell by ``$SHELL``'s name (csh runs tcsh's script); anything else gets bash's line."""
    name = Path(environ.get("SHELL", "")).name
    name = "tcsh" if name == "csh" else name
    return name if name in SHELLS else "bash"


def activate_line(prefix: str, shell: str) -> str:
    """The line that activates the env at ``prefix`` in ``shell``. Envs built before fish and tcsh got theirs
    have no script for them: that is said, with the way to write it."""
    script, quote = SHELLS[shell]
    path = Path(prefix) / "bin" / script
    if shell in ("fish", "tcsh") and not path.is_file():
        raise StateError(
            f"{prefix} has no {script}: this env has no {shell} activation",
            hint="venv envs get it from this release on (envbuilder create --force rebuilds one); "
            "activate other envs from bash or zsh",
        )
    return f"source {quote(str(path))}"


def has_constraints(prefix: Path) -> bool:
    """Whether the env (built in ``prefix``) has torch pins for pip and uv; envs without them export none."""
    return (prefix / CONSTRAINTS).is_file()


def install(prefix: Path, act: Activation, final: Optional[str] = None) -> None:
    """Write the extension scripts and hook them into PREFIX/bin/activate and activate.fish (idempotent), and
    write bin/activate.csh for csh and tcsh, naming ``final`` (where the env is used; default ``prefix``): a
    csh script cannot find where it was sourced from."""
    _write_extension(prefix, act)
    bin_dir = prefix / "bin"
    activate = bin_dir / "activate"
    activate.write_text(activate_scripts.with_hook(activate.read_text(encoding="utf-8")), encoding="utf-8")
    constraints = has_constraints(prefix)
    fish = bin_dir / "activate.fish"
    if fish.is_file():
        text = activate_scripts.render_script(act, constraints=constraints, shell=activate_scripts.FISH)
        (prefix / activate_scripts.FISH_SCRIPT_REL).write_text(text, encoding="utf-8")
        hooked = activate_scripts.with_hook(fish.read_text(encoding="utf-8"), activate_scripts.FISH)
        fish.write_text(hooked, encoding="utf-8")
    # Replaces the venv's own where it has one (virtualenv): envbuilder's deactivate undoes both parts.
    for rel, text in activate_scripts.render_csh(act, final or str(prefix), constraints=constraints).items():
        (prefix / rel).write_text(text, encoding="utf-8")


def install_user_prefix(build: Path, prefix: str, act: Activation) -> None:
    """Write the extension and a ``bin/activate`` for a user-prefix env being built in ``build``."""
    _write_extension(build, act, env_var="PYTHONUSERBASE")
    (build / "bin").mkdir(exist_ok=True)
    (build / "bin" / "activate").write_text(
        activate_scripts.render_user_prefix_activate(prefix), encoding="utf-8"
    )


def install_conda(build: Path, prefix: str, act: Activation) -> None:
    """Write a conda env's activate.d/deactivate.d hooks, and a ``bin/activate`` where the env has none."""
    for rel, text in (
        (
            activate_scripts.CONDA_ACTIVATE_REL,
            activate_scripts.render_script(act, conda=True, constraints=has_constraints(build)),
        ),
        (activate_scripts.CONDA_DEACTIVATE_REL, activate_scripts.render_conda_deactivate()),
    ):
        path = build / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    activate = build / "bin" / "activate"
    if not activate.exists():
        activate.write_text(activate_scripts.render_conda_activate(prefix), encoding="utf-8")


def from_plan(planned: Activation, module_init: Optional[str], recipe: str) -> Activation:
    """A planned (or recorded) Activation, for this module system and recipe."""
    return replace(planned, module_init=module_init, recipe=recipe)
