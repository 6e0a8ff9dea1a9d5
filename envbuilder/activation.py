"""Activate scripts written into an env: the extension and the hook in ``bin/activate`` of a venv, a user-prefix
env's ``bin/activate``, a conda env's activate.d/deactivate.d hooks. ``envbuilder.activate_scripts`` renders
them (pure, from the templates in ``envbuilder/data/activate``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from envbuilder import activate_scripts
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import CONSTRAINTS


def _write_extension(prefix: Path, act: Activation, env_var: Optional[str] = None) -> None:
    script = prefix / activate_scripts.SCRIPT_REL
    script.parent.mkdir(parents=True, exist_ok=True)
    text = activate_scripts.render_script(act, constraints=has_constraints(prefix), env_var=env_var)
    script.write_text(text, encoding="utf-8")


def has_constraints(prefix: Path) -> bool:
    """Whether the env (built in ``prefix``) has torch pins for pip and uv; envs without them export none."""
    return (prefix / CONSTRAINTS).is_file()


def install(prefix: Path, act: Activation) -> None:
    """Write the extension script and hook it into PREFIX/bin/activate (idempotent)."""
    _write_extension(prefix, act)
    activate = prefix / "bin" / "activate"
    activate.write_text(activate_scripts.with_hook(activate.read_text(encoding="utf-8")), encoding="utf-8")


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
