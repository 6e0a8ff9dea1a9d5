"""Activate scripts written into an env, for bash/zsh, fish and csh/tcsh: the extension and the hook in
``bin/activate`` of a venv, a user-prefix env's ``bin/activate``, a conda env's activate.d/deactivate.d hooks.
``envbuilder.activate_scripts`` renders them (pure, from the templates in ``envbuilder/data/activate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Optional

from envbuilder import activate_scripts, strictmodes
from envbuilder.errors import StateError
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import CONSTRAINTS


def _write_extension(prefix: Path, act: Activation, env_var: Optional[str] = None) -> None:
    script = prefix / activate_scripts.SCRIPT_REL
    script.parent.mkdir(parents=True, exist_ok=True)
    text = activate_scripts.render_script(act, constraints=has_constraints(prefix), env_var=env_var)
    script.write_text(text, encoding="utf-8")


#: The shells ``envbuilder activate --shell`` takes, and the activate script each sources.
SHELLS = {"bash": "activate", "zsh": "activate", "fish": "activate.fish", "tcsh": "activate.csh"}
#: What each shell's activate script sources in turn (a venv's hook, a conda env's activate.d), where it exists.
SOURCED = {
    "bash": (activate_scripts.SCRIPT_REL, activate_scripts.CONDA_ACTIVATE_REL),
    "zsh": (activate_scripts.SCRIPT_REL, activate_scripts.CONDA_ACTIVATE_REL),
    "fish": (activate_scripts.FISH_SCRIPT_REL, activate_scripts.CONDA_FISH_RELS[0]),
    "tcsh": (activate_scripts.CSH_SCRIPT_REL, activate_scripts.CONDA_CSH_RELS[0]),
}


def default_shell(environ: Mapping[str, str]) -> str:
    """The user's shell by ``$SHELL``'s name (csh runs tcsh's script); anything else gets bash's line."""
    name = Path(environ.get("SHELL", "")).name
    name = "tcsh" if name == "csh" else name
    return name if name in SHELLS else "bash"


def activate_line(prefix: str, shell: str) -> str:
    """The line that activates the env at ``prefix`` in ``shell``. Envs built before fish and tcsh got theirs
    have no script for them: that is said, with the way to write it."""
    script = SHELLS[shell]
    path = Path(prefix) / "bin" / script
    if shell in ("fish", "tcsh") and not path.is_file():
        raise StateError(
            f"{prefix} has no {script}: this env has no {shell} activation (it was built before envbuilder "
            "wrote one)",
            hint="envbuilder create NAME --force rebuilds it with one; until then activate it from bash or zsh",
        )
    # Only a line that sources what no one else could have written (StrictModes, for activation).
    strictmodes.env_scripts(Path(prefix), [f"bin/{script}", *SOURCED[shell]])
    return f"source {activate_scripts.BY_NAME[shell].quote(str(path))}"


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
    """Write the extensions and ``bin/activate`` (``.fish``, ``.csh``) for a user-prefix env being built in
    ``build``."""
    _write_extension(build, act, env_var="PYTHONUSERBASE")
    (build / "bin").mkdir(exist_ok=True)
    (build / "bin" / "activate").write_text(
        activate_scripts.render_user_prefix_activate(prefix), encoding="utf-8"
    )
    shells = activate_scripts.render_user_prefix_shells(act, prefix, constraints=has_constraints(build))
    _write_all(build, shells)


def install_conda(build: Path, prefix: str, act: Activation) -> None:
    """Write a conda env's activate.d/deactivate.d hooks for bash/zsh, fish and csh/tcsh, and a
    ``bin/activate`` (``.fish``, ``.csh``) for each where the env has none of its own."""
    constraints = has_constraints(build)
    scripts = {
        activate_scripts.CONDA_ACTIVATE_REL: activate_scripts.render_script(
            act, conda=True, constraints=constraints
        ),
        activate_scripts.CONDA_DEACTIVATE_REL: activate_scripts.render_conda_deactivate(),
        **activate_scripts.render_conda_shells(act, prefix, constraints=constraints),
    }
    _write_all(build, scripts)
    own = {
        f"bin/activate{suffix}": activate_scripts.render_conda_activate(prefix, shell)
        for suffix, shell in (
            ("", activate_scripts.POSIX),
            (".fish", activate_scripts.FISH),
            (".csh", activate_scripts.CSH),
        )
    }
    # A cloned site env may ship its own activate scripts (conda's base env has bin/activate): those stay.
    _write_all(build, {rel: text for rel, text in own.items() if not (build / rel).exists()})


def _write_all(root: Path, scripts: Mapping[str, str]) -> None:
    """Each script at its path under ``root``."""
    for rel, text in scripts.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def from_plan(planned: Activation, module_init: Optional[str], recipe: str) -> Activation:
    """A planned (or recorded) Activation, for this module system and recipe."""
    return replace(planned, module_init=module_init, recipe=recipe)
