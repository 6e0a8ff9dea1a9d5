"""Activate scripts written into an env, for every shell of :mod:`envbuilder.core.shells.registry`: the extension and
the hook in a venv's activate script (or the whole script, for a syntax without functions), a user-prefix env's
activate scripts, a conda env's activate.d/deactivate.d hooks; and the line that activates an env.
``envbuilder.render.activate_scripts`` renders them (pure, from the templates in ``envbuilder/data/activate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from envbuilder.core.errors import StateError
from envbuilder.core.shells import registry
from envbuilder.core.shells.base import ALWAYS, OWN
from envbuilder.plan import container
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import CONSTRAINTS
from envbuilder.render import activate_scripts
from envbuilder.system import strictmodes


def default_shell(environ: Mapping[str, str]) -> str:
    """The user's shell by ``$SHELL``'s name (an alias runs its shell's script); anything else gets the
    registry's first shell's line."""
    shell = registry.from_program(Path(environ.get("SHELL", "")).name)
    return (shell or registry.default()).name


def activate_line(prefix: str, shell: Optional[str] = None) -> str:
    """The line that activates the env at ``prefix`` in ``shell`` (a registered name; default: the registry's
    first). Envs built before a shell got its scripts have none for it: that is said, with the way to write it."""
    chosen = registry.get(shell) if shell else registry.default()
    syntax = chosen.syntax
    path = Path(prefix) / syntax.activate_rel
    if syntax.added_later and not path.is_file():
        raise StateError(
            f"{prefix} has no {syntax.activate}: this env has no {chosen.name} activation (it was built before "
            "envbuilder wrote one)",
            hint="envbuilder create NAME --force rebuilds it with one; until then activate it from "
            + registry.in_every_env(),
        )
    # Only a line that sources what no one else could have written (StrictModes, for activation).
    strictmodes.env_scripts(Path(prefix), [syntax.activate_rel, *syntax.sourced])
    return syntax.line(str(path))


def container_line(name: str, prefix: str, plan: Mapping[str, Any], tools: Mapping[str, Any],
                   shell: Optional[str] = None) -> str:  # fmt: skip
    """A container env's line for ``shell``: a function named after the env that runs its arguments inside the
    image, through the runtime, with the recipe's binds and GPU flag (``plan``, ``tools``: its record's)."""
    chosen = registry.get(shell) if shell else registry.default()
    strictmodes.env_prefix(Path(prefix))  # the image it runs: only where no one else could have put it
    argv = container.entry_argv(plan.get("container") or {}, prefix, tools)
    try:
        return activate_scripts.render_container_entry(name, argv, chosen.syntax)
    except ValueError as exc:
        raise StateError(f"{name}: {exc}", hint="ask for another shell's line with --shell") from None


def has_constraints(prefix: Path) -> bool:
    """Whether the env (built in ``prefix``) has torch pins for pip and uv; envs without them export none."""
    return (prefix / CONSTRAINTS).is_file()


def install(prefix: Path, act: Activation, final: Optional[str] = None) -> None:
    """Write each syntax's extension and hook it into the venv's activate script for it (idempotent; where the
    venv tool wrote one, or always), or write the whole script where the venv's cannot be hooked, naming
    ``final`` (where the env is used; default ``prefix``): such a script cannot find where it was sourced from."""
    constraints = has_constraints(prefix)
    for syntax in registry.syntaxes():
        if syntax.venv == OWN:
            # Replaces the venv's own where it has one (virtualenv): envbuilder's deactivate undoes both parts.
            own = activate_scripts.render_own_venv(act, final or str(prefix), syntax, constraints=constraints)
            _write_all(prefix, own)
            continue
        activate = prefix / syntax.activate_rel
        if syntax.venv == ALWAYS or activate.is_file():
            text = activate_scripts.render_script(act, constraints=constraints, shell=syntax)
            _write_all(prefix, {syntax.extension_rel: text})
            activate.write_text(
                activate_scripts.with_hook(activate.read_text(encoding="utf-8"), syntax), "utf-8"
            )


def install_user_prefix(build: Path, prefix: str, act: Activation) -> None:
    """Write each syntax's extension and activate script (and undo) for a user-prefix env being built in
    ``build``."""
    constraints = has_constraints(build)
    for syntax in registry.syntaxes():
        _write_all(build, activate_scripts.render_user_prefix(act, prefix, syntax, constraints=constraints))


def install_conda(build: Path, prefix: str, act: Activation) -> None:
    """Write a conda env's activate.d/deactivate.d hooks for each syntax, and an activate script for each where
    the env has none of its own."""
    constraints = has_constraints(build)
    syntaxes = registry.syntaxes()
    for syntax in syntaxes:
        _write_all(build, activate_scripts.render_conda(act, prefix, syntax, constraints=constraints))
    own = {s.activate_rel: activate_scripts.render_conda_activate(prefix, s) for s in syntaxes}
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
