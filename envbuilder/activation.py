"""Activate extensions: what ``source PREFIX/bin/activate`` does beyond the venv, and what ``deactivate`` undoes.

The extension is a script of its own (``PREFIX/envbuilder/activate.sh``), rendered here (pure) and hooked into
``bin/activate`` by one sentinel-guarded block appended at the end, so nothing depends on the wording of the
activate template (Cirrus's sed hook broke on CPython 3.11's lowercase comment). The script:

* records which modules and ``module use`` paths were there before, loads the recipe's, and on deactivate
  unloads exactly the modules activation added (dependencies included) and unuses the paths it added;
* saves each variable it sets or unsets (and LD_LIBRARY_PATH, PYTHONPATH, which modules touch), including
  "was unset", and restores them after the unload;
* keeps the env's ``bin`` first on PATH after modules prepend theirs;
* wraps the venv's ``deactivate`` so one call undoes both;
* where the env has torch pins (``envbuilder/constraints.txt``), adds that file to ``PIP_CONSTRAINT`` and
  ``UV_CONSTRAINT``, so a later ``pip install X`` or ``uv pip install X`` cannot replace the env's torch build.

It is plain POSIX sh that bash and zsh both run (no word splitting on unquoted variables, which zsh lacks).
Every recipe value is shell-quoted; variable names are validated identifiers. Quoting is not enough for what the
module system reads: Lmod evaluates a module name, and writes a line break in a ``module use`` path unescaped into
the shell code ``module`` evaluates. So module names must be names, and no value may hold a line break or a NUL
(the loader refuses them at plan time; :class:`Activation` refuses them again, for values from a state record).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from envbuilder.errors import RecipeError
from envbuilder.plan.steps import CONSTRAINTS
from envbuilder.recipe.schema import require_carriable, require_module_name, require_var_name

BEGIN = "# >>> envbuilder activate extension >>>"
END = "# <<< envbuilder activate extension <<<"
SCRIPT_REL = "envbuilder/activate.sh"
#: Variables modules commonly change that must come back exactly, whatever the module system does on unload.
ALWAYS_RESTORE = ("LD_LIBRARY_PATH", "PYTHONPATH")

#: pip and uv read each of these as a whitespace-separated list of constraints files (pip splits the value of
#: a list option on whitespace, uv on spaces).
CONSTRAINT_VARS = ("PIP_CONSTRAINT", "UV_CONSTRAINT")


@dataclass(frozen=True)
class Activation:
    module_use: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    #: The module system's init directory (holding bash, zsh, ...), used when the user's shell has no ``module``.
    module_init: Optional[str] = None
    recipe: str = ""

    def __post_init__(self) -> None:
        """Refuse what the script cannot carry (RecipeError, naming the key)."""
        for key, value in dict(self.env).items():
            require_var_name(key, "activate.env")
            require_carriable(value, f"activate.env.{key}")
        for i, name in enumerate(self.unset):
            require_var_name(name, f"unset[{i}]")
        for i, path in enumerate(self.module_use):
            require_carriable(path, f"modules.use[{i}]")
            if path.startswith("-"):
                raise RecipeError(
                    f"a `module use` path cannot start with '-', found {path!r}", key=f"modules.use[{i}]"
                )
        for i, name in enumerate(self.modules):
            require_module_name(name, f"activate.modules[{i}]")
        for key, value in (("module system init", self.module_init or ""), ("recipe.name", self.recipe)):
            require_carriable(value, key)


def _hook_block() -> str:
    # $VIRTUAL_ENV is set by every activate (venv, virtualenv, uv) before its end; expanded in double quotes it is
    # safe whatever the prefix holds.
    return (
        f"{BEGIN}\n"
        "# Loads the recipe's modules and variables; deactivate undoes them. Rewritten by envbuilder create.\n"
        f'if [ -f "$VIRTUAL_ENV/{SCRIPT_REL}" ]; then . "$VIRTUAL_ENV/{SCRIPT_REL}"; fi\n'
        f"{END}\n"
    )


def with_hook(activate_text: str) -> str:
    """``bin/activate`` with exactly one envbuilder block at its end (idempotent)."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.DOTALL)
    text = pattern.sub("", activate_text)
    if not text.endswith("\n"):
        text += "\n"
    return text + _hook_block()


def _save(var: str) -> str:
    return (
        f'if [ -n "${{{var}+x}}" ]; then _ENVBUILDER_OLD_{var}="${{{var}}}"; _ENVBUILDER_HAD_{var}=1; '
        f"else _ENVBUILDER_HAD_{var}=0; fi"
    )


def _restore(var: str) -> str:
    return (
        f'    if [ "${{_ENVBUILDER_HAD_{var}:-0}}" = 1 ]; then {var}="$_ENVBUILDER_OLD_{var}"; export {var}; '
        f"else unset {var}; fi\n"
        f"    unset _ENVBUILDER_OLD_{var} _ENVBUILDER_HAD_{var}"
    )


# Names of the module systems' bookkeeping variables in the environment, colon-separated (Lmod and Tcl modules).
_STATE_NAMES = (
    "env | grep -oE '^(_ModuleTable[A-Za-z0-9_]*|__LMOD_REF_COUNT_[A-Za-z0-9_]*|__MODULES_[A-Za-z0-9_]*|"
    "_LMFILES_|LOADEDMODULES)=' | tr -d '=' | tr '\\n' ':'"
)


def _each(var: str, body: str, indent: str) -> list[str]:
    """Lines iterating the colon list in ``var`` without word splitting (zsh does not split unquoted variables)."""
    return [
        f'{indent}_envbuilder_rest="${{{var}:-}}:"',
        f'{indent}while [ -n "$_envbuilder_rest" ]; do',
        f"{indent}    _envbuilder_item=${{_envbuilder_rest%%:*}}",
        f"{indent}    _envbuilder_rest=${{_envbuilder_rest#*:}}",
        f'{indent}    [ -n "$_envbuilder_item" ] || continue',
        f"{indent}    {body}",
        f"{indent}done",
    ]


def _constraint_lines(env_var: str) -> list[str]:
    """Append the env's constraints file to pip's and uv's lists, or say on stderr why it cannot be done.

    The list is whitespace-separated, so a prefix holding whitespace would be read as several files: then
    nothing is exported (a broken list would make every pip run fail) and one line says torch is unguarded."""
    path = f"${env_var}/{CONSTRAINTS}"
    why = (
        "envbuilder: pip install and uv pip install in this env are not kept from replacing its torch: "
        "PIP_CONSTRAINT and UV_CONSTRAINT are whitespace-separated lists and the env path holds whitespace "
        f'(pass --constraint "{path}" yourself)'
    )
    lines = [
        f'if [ -f "{path}" ]; then',
        f'    case "${env_var}" in',
        f"        *[[:space:]]*) printf '%s\\n' {shlex.quote(why)} >&2 ;;",
        "        *)",
    ]
    lines += [f'            {v}="${{{v}:+${v} }}{path}"; export {v}' for v in CONSTRAINT_VARS]
    return [*lines, "            ;;", "    esac", "fi"]


def render_script(
    act: Activation, conda: bool = False, *, constraints: bool = False, env_var: Optional[str] = None
) -> str:
    """The activate extension script (sourced from bin/activate; for a conda env, conda activate sources it
    from etc/conda/activate.d and its deactivate.d twin undoes it). ``constraints``: the env has torch pins in
    ``envbuilder/constraints.txt`` for pip and uv. ``env_var`` names the variable holding the env's prefix
    (``VIRTUAL_ENV``, ``CONDA_PREFIX`` for conda, ``PYTHONUSERBASE`` for a user-prefix env)."""
    names = list(dict.fromkeys([*dict(act.env), *act.unset, *ALWAYS_RESTORE]))
    if constraints:
        names += [v for v in CONSTRAINT_VARS if v not in names]
    q = shlex.quote
    env_var = env_var or ("CONDA_PREFIX" if conda else "VIRTUAL_ENV")
    lines = [
        f"# envbuilder activate extension for {act.recipe or 'this env'}: sourced by bin/activate.",
        "# Generated; envbuilder create rewrites it. deactivate undoes everything below.",
        # Sourcing activate again: the venv redefines deactivate before calling it, so undo the previous run here.
        'if [ -n "${_ENVBUILDER_ACTIVE:-}" ] && type _envbuilder_undo >/dev/null 2>&1; then _envbuilder_undo; fi',
        "_ENVBUILDER_ACTIVE=1",
        *(_save(v) for v in names),
    ]
    if act.modules or act.module_use:
        init_dir = q(act.module_init) if act.module_init else "''"
        lines += [
            # The module system's init for *this* shell, where the user's shell has no module function yet.
            'if [ -n "${ZSH_VERSION:-}" ]; then _envbuilder_shell=zsh; else _envbuilder_shell=bash; fi',
            f'if ! type module >/dev/null 2>&1 && [ -f {init_dir}/"$_envbuilder_shell" ]; then '
            f'. {init_dir}/"$_envbuilder_shell"; fi',
            "unset _envbuilder_shell",
            '_ENVBUILDER_MODULES_BEFORE=":${LOADEDMODULES:-}:"',
            # Module-system bookkeeping variables present now; deactivate removes any that activation added.
            f'_ENVBUILDER_STATE_BEFORE=":$({_STATE_NAMES}):"',
            '_ENVBUILDER_USED=""',
            "if type module >/dev/null 2>&1; then",
        ]
        for path in act.module_use:
            lines.append(
                f'    case ":${{MODULEPATH:-}}:" in *:{q(path)}:*) ;; '
                f'*) module use {q(path)} && _ENVBUILDER_USED="{_dq(path)}:$_ENVBUILDER_USED" ;; esac'
            )
        if act.modules:
            mods = " ".join(q(m) for m in act.modules)
            lines.append(
                f'    module load {mods} || echo "envbuilder: module load {_dq(" ".join(act.modules))} failed; '
                'see module spider" >&2'
            )
        lines += [
            "else",
            '    echo "envbuilder: no module command here; the env\'s modules are not loaded" >&2',
            "fi",
            # Modules this activation added (dependencies included), newest first, for deactivate.
            '_ENVBUILDER_ADDED=""',
            *_each(
                "LOADEDMODULES",
                'case "$_ENVBUILDER_MODULES_BEFORE" in *":$_envbuilder_item:"*) ;; '
                '*) _ENVBUILDER_ADDED="$_envbuilder_item:$_ENVBUILDER_ADDED" ;; esac',
                "",
            ),
            "unset _ENVBUILDER_MODULES_BEFORE _envbuilder_rest _envbuilder_item",
        ]
    for key, value in act.env.items():
        lines.append(f"{key}={q(value)}; export {key}")
    for key in act.unset:
        lines.append(f"unset {key}")
    if constraints:  # after the recipe's variables: a value the recipe sets is kept and added to
        lines += _constraint_lines(env_var)
    lines += [
        # Modules may have put their own python first; the env's must win.
        f'if [ -n "${{{env_var}:-}}" ]; then PATH="${env_var}/bin:$PATH"; export PATH; fi',
        "hash -r 2>/dev/null || true",
        "",
        "_envbuilder_undo() {",
    ]
    if act.modules or act.module_use:
        lines += [
            "    if type module >/dev/null 2>&1; then",
            *_each("_ENVBUILDER_ADDED", 'module unload "$_envbuilder_item"', "        "),
            *_each("_ENVBUILDER_USED", 'module unuse "$_envbuilder_item"', "        "),
            "    fi",
            f'    _ENVBUILDER_STATE_NOW="$({_STATE_NAMES})"',
            *_each(
                "_ENVBUILDER_STATE_NOW",
                'case "$_ENVBUILDER_STATE_BEFORE" in *":$_envbuilder_item:"*) ;; *) unset "$_envbuilder_item" ;; esac',
                "    ",
            ),
            "    unset _ENVBUILDER_ADDED _ENVBUILDER_USED _ENVBUILDER_STATE_BEFORE _ENVBUILDER_STATE_NOW",
            "    unset _envbuilder_rest _envbuilder_item",
        ]
    lines += [*(_restore(v) for v in names), "    unset _ENVBUILDER_ACTIVE", "}", ""]
    if conda:
        return "\n".join(lines) + "\n"
    lines += [
        # Wrap the venv's deactivate (whatever its body) so one call undoes both, in bash and zsh alike.
        "if type deactivate >/dev/null 2>&1; then",
        "    eval \"$(typeset -f deactivate | sed '1s/^deactivate/_envbuilder_venv_deactivate/')\"",
        "    deactivate() {",
        "        _envbuilder_undo",
        '        _envbuilder_venv_deactivate "$@"',
        '        if [ "${1:-}" != nondestructive ]; then unset -f _envbuilder_venv_deactivate _envbuilder_undo; fi',
        "    }",
        "fi",
    ]
    return "\n".join(lines) + "\n"


def _dq(text: str) -> str:
    """Text safe inside double quotes."""
    return re.sub(r'(["\\$`])', r"\\\1", text)


def _write_extension(prefix: Path, act: Activation, env_var: Optional[str] = None) -> None:
    script = prefix / SCRIPT_REL
    script.parent.mkdir(parents=True, exist_ok=True)
    text = render_script(act, constraints=has_constraints(prefix), env_var=env_var)
    script.write_text(text, encoding="utf-8")


def has_constraints(prefix: Path) -> bool:
    """Whether the env (built in ``prefix``) has torch pins for pip and uv; envs without them export none."""
    return (prefix / CONSTRAINTS).is_file()


def install(prefix: Path, act: Activation) -> None:
    """Write the extension script and hook it into PREFIX/bin/activate (idempotent)."""
    _write_extension(prefix, act)
    activate = prefix / "bin" / "activate"
    activate.write_text(with_hook(activate.read_text(encoding="utf-8")), encoding="utf-8")


def render_user_prefix_activate(prefix: str) -> str:
    """``bin/activate`` for a user-prefix env (PYTHONUSERBASE style, Cirrus): no venv, the site python, this
    prefix as its user base. ``deactivate`` gives PATH and PYTHONUSERBASE back; the extension hooks in as for a
    venv. The prefix is known at build time and quoted here (the file is written before the rename)."""
    require_carriable(prefix, "env.prefix")
    q = shlex.quote
    return "\n".join(
        [
            "# envbuilder activate for a user-prefix env: source it from bash or zsh.",
            'if [ -n "${_ENVBUILDER_USERBASE_ACTIVE:-}" ] && type deactivate >/dev/null 2>&1; then deactivate; fi',
            "_ENVBUILDER_USERBASE_ACTIVE=1",
            _save("PATH"),
            _save("PYTHONUSERBASE"),
            f"PYTHONUSERBASE={q(prefix)}; export PYTHONUSERBASE",
            'PATH="$PYTHONUSERBASE/bin:$PATH"; export PATH',
            "hash -r 2>/dev/null || true",
            "deactivate() {",
            _restore("PATH"),
            _restore("PYTHONUSERBASE"),
            "    unset _ENVBUILDER_USERBASE_ACTIVE",
            "    hash -r 2>/dev/null || true",
            '    if [ "${1:-}" != nondestructive ]; then unset -f deactivate; fi',
            "}",
            f"if [ -f {q(prefix + '/' + SCRIPT_REL)} ]; then . {q(prefix + '/' + SCRIPT_REL)}; fi",
            "",
        ]
    )


def install_user_prefix(build: Path, prefix: str, act: Activation) -> None:
    """Write the extension and a ``bin/activate`` for a user-prefix env being built in ``build``."""
    _write_extension(build, act, env_var="PYTHONUSERBASE")
    (build / "bin").mkdir(exist_ok=True)
    (build / "bin" / "activate").write_text(render_user_prefix_activate(prefix), encoding="utf-8")


CONDA_ACTIVATE_REL = "etc/conda/activate.d/envbuilder.sh"
CONDA_DEACTIVATE_REL = "etc/conda/deactivate.d/envbuilder.sh"
_CONDA_DEACTIVATE = (
    "# envbuilder: undo what etc/conda/activate.d/envbuilder.sh did (modules, variables). Generated.\n"
    "if type _envbuilder_undo >/dev/null 2>&1; then _envbuilder_undo; unset -f _envbuilder_undo; fi\n"
)
#: What conda activate sets for an env, saved and restored by envbuilder's own bin/activate.
_CONDA_VARS = ("PATH", "CONDA_PREFIX", "CONDA_DEFAULT_ENV")


def render_conda_activate(prefix: str) -> str:
    """``bin/activate`` for a conda env, for shells without ``conda activate`` (the embedded engine needs no conda
    binary): what conda activate does for one env, then its activate.d scripts; deactivate runs deactivate.d and
    gives the variables back."""
    require_carriable(prefix, "env.prefix")
    q = shlex.quote
    hooks = '"$CONDA_PREFIX"/etc/conda/{}.d/*.sh'
    return "\n".join(
        [
            "# envbuilder activate for a conda env: source it from bash or zsh (conda activate works as well).",
            'if [ -n "${_ENVBUILDER_CONDA_ACTIVE:-}" ] && type deactivate >/dev/null 2>&1; then deactivate; fi',
            "_ENVBUILDER_CONDA_ACTIVE=1",
            *(_save(v) for v in _CONDA_VARS),
            f"CONDA_PREFIX={q(prefix)}; export CONDA_PREFIX",
            f"CONDA_DEFAULT_ENV={q(prefix)}; export CONDA_DEFAULT_ENV",
            'PATH="$CONDA_PREFIX/bin:$PATH"; export PATH',
            f"for _envbuilder_hook in {hooks.format('activate')}; do",
            '    if [ -f "$_envbuilder_hook" ]; then . "$_envbuilder_hook"; fi',
            "done",
            "unset _envbuilder_hook",
            "hash -r 2>/dev/null || true",
            "deactivate() {",
            f"    for _envbuilder_hook in {hooks.format('deactivate')}; do",
            '        if [ -f "$_envbuilder_hook" ]; then . "$_envbuilder_hook"; fi',
            "    done",
            "    unset _envbuilder_hook",
            *(_restore(v) for v in _CONDA_VARS),
            "    unset _ENVBUILDER_CONDA_ACTIVE",
            "    hash -r 2>/dev/null || true",
            '    if [ "${1:-}" != nondestructive ]; then unset -f deactivate; fi',
            "}",
            "",
        ]
    )


def install_conda(build: Path, prefix: str, act: Activation) -> None:
    """Write a conda env's activate.d/deactivate.d hooks, and a ``bin/activate`` where the env has none."""
    for rel, text in (
        (CONDA_ACTIVATE_REL, render_script(act, conda=True, constraints=has_constraints(build))),
        (CONDA_DEACTIVATE_REL, _CONDA_DEACTIVATE),
    ):
        path = build / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    activate = build / "bin" / "activate"
    if not activate.exists():
        activate.write_text(render_conda_activate(prefix), encoding="utf-8")


def from_plan(activate: Mapping[str, object], module_init: Optional[str], recipe: str) -> Activation:
    """An Activation from a plan's ``activate`` table."""
    return Activation(
        module_use=tuple(activate.get("module_use", ()) or ()),  # type: ignore[arg-type]
        modules=tuple(activate.get("modules", ()) or ()),  # type: ignore[arg-type]
        env=dict(activate.get("env", {}) or {}),  # type: ignore[call-overload]
        unset=tuple(activate.get("unset", ()) or ()),  # type: ignore[arg-type]
        module_init=module_init,
        recipe=recipe,
    )
