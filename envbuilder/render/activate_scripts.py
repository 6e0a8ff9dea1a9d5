"""Activate scripts (pure rendering): what ``source PREFIX/bin/activate`` does beyond the venv, and what
``deactivate`` undoes. ``envbuilder.backends.activation`` writes them into an env.

The shell code is package data, one template file per script language (a :class:`~envbuilder.core.shells.base.Syntax`
of :mod:`envbuilder.core.shells`, which says how a value is quoted for it and which scripts an env holds for it); this
module fills in the values. Each syntax gets every kind of env: a venv's extension, a user-prefix env's and a conda
env's activate scripts (conda's own activators run ``etc/conda/activate.d/*.SUFFIX`` by shell), and the script
that activates an env from its image's mount (written beside the mount). The extension is a script of its own
(``PREFIX/envbuilder/activate.sh``), hooked into ``bin/activate`` by one sentinel-guarded block appended at the
end, so nothing depends on the wording of the activate template (Cirrus's sed hook broke on CPython 3.11's
lowercase comment). The script:

* records which modules and ``module use`` paths were there before, loads the recipe's, and on deactivate
  unloads exactly the modules activation added (dependencies included) and unuses the paths it added;
* saves each variable it sets or unsets (and LD_LIBRARY_PATH, PYTHONPATH, which modules touch), including
  "was unset", and restores them after the unload;
* puts the recipe's directories first or last in colon-separated list variables (``prepend``/``append``) and on
  deactivate takes out exactly those entries, one each, leaving the rest of the value in order (what the user
  added meanwhile included); a variable that was unset before and holds nothing else is unset again. Such a
  variable is not restored wholesale, even where modules touch it (LD_LIBRARY_PATH): that would drop the user's
  additions, and the module system takes its own entries out on unload;
* runs ``conda activate ENV`` once the modules are loaded where the recipe says so (``activate.conda_env``, as
  ALCF's ``module load conda; conda activate``), and ``conda deactivate`` before they unload, with conda's own
  variables restored after; where the modules define no ``conda``, or it fails, sourcing returns 1 with what
  was done so far undone (the venv's own activate included);
* keeps the env's ``bin`` first on PATH after modules prepend theirs;
* wraps the venv's ``deactivate`` so one call undoes both;
* where the env has torch pins (``envbuilder/constraints.txt``), adds that file to ``PIP_CONSTRAINT`` and
  ``UV_CONSTRAINT``, so a later ``pip install X`` or ``uv pip install X`` cannot replace the env's torch build.

Every recipe value is shell-quoted; variable names are validated identifiers. Quoting is not enough for what the
module system reads: Lmod evaluates a module name, and writes a line break in a ``module use`` path unescaped into
the shell code ``module`` evaluates. So module names must be names, and no value may hold a line break or a NUL
(the loader refuses them at plan time; :class:`Activation` refuses them again, for values from a state record).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import cache
from importlib.resources import files
from typing import Optional, Union

from envbuilder.core.shells import registry
from envbuilder.core.shells.base import Syntax
from envbuilder.core.shells.posix import POSIX
from envbuilder.core.values import require_carriable
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import CONSTRAINTS

BEGIN = "# >>> envbuilder activate extension >>>"
END = "# <<< envbuilder activate extension <<<"
#: The extension of the default syntax (the one every env has): what a venv's ``bin/activate`` sources.
SCRIPT_REL = POSIX.extension_rel
#: Variables modules commonly change that must come back exactly, whatever the module system does on unload.
ALWAYS_RESTORE = ("LD_LIBRARY_PATH", "PYTHONPATH")
#: pip and uv read each of these as a whitespace-separated list of constraints files (pip splits the value of
#: a list option on whitespace, uv on spaces).
CONSTRAINT_VARS = ("PIP_CONSTRAINT", "UV_CONSTRAINT")
#: What conda activate sets for an env, saved and restored by envbuilder's own bin/activate.
_CONDA_VARS = ("PATH", "CONDA_PREFIX", "CONDA_DEFAULT_ENV")
#: conda's own bookkeeping, which ``conda deactivate`` leaves behind (CONDA_SHLVL=0 where it was unset): saved
#: and restored around ``activate.conda_env``, so deactivate gives back exactly what was there.
CONDA_STATE_VARS = ("CONDA_SHLVL", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CONDA_PROMPT_MODIFIER")

_SECTION = "#@section "
#: A line of the template that is a note on it, not part of what it renders.
_NOTE = "#%"
_PLACEHOLDER = re.compile(r"@([a-z_]+)@")

#: A placeholder's value: text (already quoted for the shell), or lines for a placeholder alone on its line.
Value = Union[str, Sequence[str]]
#: What a user-prefix env's activate saves before it sets them, and gives back on deactivate.
_USERBASE_VARS = ("PATH", "PYTHONUSERBASE")


def image_script_tails() -> tuple[str, ...]:
    """The scripts written beside an image's mount or unpacked copy (``render_image_activate``), by how their
    names end after the copy's: each syntax's activate script, and the undo of those that have one."""
    syntaxes = registry.syntaxes()
    activates = [f".activate.{s.suffix}" for s in syntaxes]
    return (*activates, *(f".deactivate.{s.suffix}" for s in syntaxes if s.undo_script))


@cache
def _templates(name: str) -> dict[str, tuple[str, ...]]:
    """The sections of one template file, each without its notes and trailing blank lines."""
    text = files("envbuilder").joinpath(f"data/activate/{name}").read_text(encoding="utf-8")
    sections: dict[str, list[str]] = {}
    current: Optional[list[str]] = None
    for line in text.splitlines():
        if line.startswith(_SECTION):
            current = sections.setdefault(line[len(_SECTION) :].strip(), [])
        elif current is not None and not line.lstrip().startswith(_NOTE):
            current.append(line)
    for lines in sections.values():
        while lines and not lines[-1]:
            lines.pop()
    return {key: tuple(lines) for key, lines in sections.items()}


def _fill(section: str, shell: Syntax = POSIX, **values: Value) -> list[str]:
    """The lines of one of ``shell``'s templates with its placeholders filled. A placeholder alone on its line
    takes lines, each indented as the placeholder is (no lines: the line goes); anywhere else it takes text."""
    out: list[str] = []
    for line in _templates(shell.template)[section]:
        alone = _PLACEHOLDER.fullmatch(line.strip())
        value = values[alone.group(1)] if alone else None
        if value is not None and not isinstance(value, str):
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + item if item else item for item in value]
        else:
            out.append(_PLACEHOLDER.sub(lambda m: _text(m.group(1), values[m.group(1)]), line))
    return out


def _text(name: str, value: Value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"@{name}@ takes lines, so it stands alone on its line")
    return value


def _render(section: str, shell: Syntax = POSIX, **values: Value) -> str:
    return "\n".join(_fill(section, shell, **values)) + "\n"


def _each(section: str, names: Iterable[str], shell: Syntax = POSIX) -> list[str]:
    """``section`` once per variable name (saves, restores)."""
    return [line for name in names for line in _fill(section, shell, var=name)]


def with_hook(activate_text: str, shell: Syntax = POSIX) -> str:
    """A venv's activate script for ``shell`` (``bin/activate`` for POSIX) with exactly one envbuilder block at
    its end, which sources the extension (idempotent)."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.DOTALL)
    text = pattern.sub("", activate_text)
    if not text.endswith("\n"):
        text += "\n"
    return text + _render("hook", shell, begin=BEGIN, end=END, extension=shell.extension_rel)


def _modules(act: Activation, shell: Syntax = POSIX) -> tuple[list[str], list[str]]:
    """The module lines of the extension: loading (with what was there before) and undoing on deactivate."""
    if not (act.modules or act.module_use):
        return [], []
    q, dq = shell.quote, shell.dquote
    state_names = _fill("state_names", shell)[0]
    uses = [line for p in act.module_use for line in _fill("module_use", shell, path=q(p), path_dq=dq(p))]
    load = (
        _fill(
            "module_load",
            shell,
            modules=" ".join(q(m) for m in act.modules),
            modules_dq=dq(" ".join(act.modules)),
        )
        if act.modules
        else []
    )
    init_dir = q(act.module_init) if act.module_init else "''"
    loading = _fill("modules", shell, init_dir=init_dir, state_names=state_names, uses=uses, load=load)
    return loading, _fill("modules_undo", shell, state_names=state_names)


def _constraints(env_var: str, shell: Syntax = POSIX) -> list[str]:
    """Add the env's constraints file to pip's and uv's lists, or say on stderr why it cannot be done."""
    pins = [
        line
        for var in CONSTRAINT_VARS
        for line in _fill("constraint", shell, var=var, env_var=env_var, constraints=CONSTRAINTS)
    ]
    return _fill("constraints", shell, env_var=env_var, constraints=CONSTRAINTS, exports=pins)


def _paths(act: Activation, shell: Syntax = POSIX) -> tuple[list[str], list[str], list[str], list[str]]:
    """The list-variable lines: saving whether each was set, adding the entries, taking them out again before the
    modules unload, and finishing (unset again, or exported) after."""
    if not (act.prepend or act.append):
        return [], [], [], []
    q = shell.quote
    names = list(dict.fromkeys([*act.prepend, *act.append]))
    adding = _fill("path_drop_function", shell)
    for how, paths in (("prepend", act.prepend), ("append", act.append)):
        adding += [
            line for k, v in paths.items() for line in _fill(how, shell, var=k, entries=":".join(map(q, v)))
        ]
    drops = [
        line
        for how, paths in (("first", act.prepend), ("last", act.append))
        for k, v in paths.items()
        for entry in v
        for line in _fill(
            "path_drop", shell, var=k, entry=q(entry), which=how, first=str(int(how == "first"))
        )
    ]
    finish = [*_each("path_finish", names, shell), *_fill("path_drop_forget", shell)]
    return _each("path_save", names, shell), adding, drops, finish


def _conda_env(
    act: Activation, shell: Syntax, undo_modules: list[str], restores: list[str]
) -> tuple[list[str], list[str]]:
    """``conda activate`` after the modules load (on failure: the modules unloaded, the variables restored, and
    sourcing returns 1), and ``conda deactivate`` before they unload. Where conda defines no function for
    ``shell``, the extension only says where it would run."""
    if not act.conda_env:
        return [], []
    q, dq = shell.quote(act.conda_env), shell.dquote(act.conda_env)
    if not shell.runs_conda:
        return _fill("conda_env", shell, conda_env_dq=dq), []
    lists = list(dict.fromkeys([*act.prepend, *act.append]))
    on = _fill(
        "conda_env",
        shell,
        conda_env=q,
        conda_env_dq=dq,
        modules_undo=undo_modules,
        path_finish=_each("path_finish", lists, shell),
        restores=restores,
    )
    return on, _fill("conda_env_undo", shell, conda_env_dq=dq)


def _extension(
    act: Activation, shell: Syntax, conda: bool, constraints: bool, env_var: Optional[str]
) -> dict[str, Value]:
    """The values of one syntax's extension and undo templates."""
    lists = {*act.prepend, *act.append}
    restored = [v for v in ALWAYS_RESTORE if v not in lists]
    names = list(dict.fromkeys([*dict(act.env), *act.unset, *restored]))
    if constraints:
        names += [v for v in CONSTRAINT_VARS if v not in names]
    if act.conda_env and shell.runs_conda:
        names += [v for v in CONDA_STATE_VARS if v not in names]
    env_var = env_var or ("CONDA_PREFIX" if conda else "VIRTUAL_ENV")
    loading, undoing = _modules(act, shell)
    conda_on, conda_off = _conda_env(act, shell, undoing, _each("restore", names, shell))
    path_saves, paths, path_drops, path_finish = _paths(act, shell)
    variables = [
        line for k, v in act.env.items() for line in _fill("set", shell, var=k, value=shell.quote(v))
    ]
    variables += [line for k in act.unset for line in _fill("unset", shell, var=k)]
    return {
        "recipe": act.recipe or "this env",
        "saves": _each("save", names, shell) + path_saves,
        "modules": loading,
        "conda": conda_on,
        "variables": variables,
        "paths": paths,
        "constraints": _constraints(env_var, shell) if constraints else [],
        "env_var": env_var,
        "path_drops": path_drops,
        "conda_undo": conda_off,
        "modules_undo": undoing,
        "path_finish": path_finish,
        "restores": _each("restore", names, shell),
        "venv_deactivate": [] if conda else _fill("venv_deactivate", shell),
    }


def render_script(
    act: Activation,
    conda: bool = False,
    *,
    constraints: bool = False,
    env_var: Optional[str] = None,
    shell: Syntax = POSIX,
) -> str:
    """The activate extension script (sourced from bin/activate; for a conda env, conda activate sources it
    from etc/conda/activate.d and its deactivate.d twin undoes it). ``constraints``: the env has torch pins in
    ``envbuilder/constraints.txt`` for pip and uv. ``env_var`` names the variable holding the env's prefix
    (``VIRTUAL_ENV``, ``CONDA_PREFIX`` for conda, ``PYTHONUSERBASE`` for a user-prefix env)."""
    return _render("extension", shell, **_extension(act, shell, conda, constraints, env_var))


def render_own_venv(
    act: Activation, prefix: str, shell: Syntax, *, constraints: bool = False
) -> dict[str, str]:
    """A venv's activation in a syntax whose activate script envbuilder writes whole (``venv`` OWN), by path in
    the env: the activate script (the venv's part, for ``prefix``, where the env is used), the extension it
    sources, and the undo that its ``deactivate`` alias sources (no function to wrap) to undo both."""
    require_carriable(prefix, "env.prefix")
    values = _extension(act, shell, False, constraints, None)
    return {
        shell.activate_rel: _render("activate", shell, prefix=shell.quote(prefix)),
        shell.extension_rel: _render("extension", shell, **values),
        shell.undo_rel: _render("deactivate", shell, undo=_fill("undo", shell, **values)),
    }


def render_user_prefix_activate(prefix: str, shell: Syntax = POSIX) -> str:
    """The activate script for a user-prefix env (PYTHONUSERBASE style, Cirrus): no venv, the site python, this
    prefix as its user base. ``deactivate`` gives PATH and PYTHONUSERBASE back; the extension hooks in as for a
    venv. The prefix is known at build time and quoted here (the file is written before the rename)."""
    require_carriable(prefix, "env.prefix")
    return _render(
        "user_prefix",
        shell,
        saves=_each("save", _USERBASE_VARS, shell),
        prefix=shell.quote(prefix),
        restores=_each("restore", _USERBASE_VARS, shell),
        extension=shell.quote(f"{prefix}/{shell.extension_rel}"),
        undo=shell.quote(f"{prefix}/{shell.undo_rel}"),
    )


def render_user_prefix(
    act: Activation, prefix: str, shell: Syntax, *, constraints: bool = False
) -> dict[str, str]:
    """A user-prefix env's activation in ``shell``, by path in the env: the activate script, the extension it
    sources (``PYTHONUSERBASE`` naming the env), and the undo a deactivate alias sources, where it has one."""
    values = _extension(act, shell, False, constraints, "PYTHONUSERBASE")
    scripts = {
        shell.activate_rel: render_user_prefix_activate(prefix, shell),
        shell.extension_rel: _render("extension", shell, **values),
    }
    if shell.undo_script:
        undo = _fill("undo", shell, **values)
        restores = _each("restore", _USERBASE_VARS, shell)
        scripts[shell.undo_rel] = _render("deactivate_saved", shell, undo=undo, restores=restores)
    return scripts


def render_conda_activate(prefix: str, shell: Syntax = POSIX) -> str:
    """The activate script for a conda env, for shells without ``conda activate`` (the embedded engine needs no
    conda binary): what conda activate does for one env, then its activate.d scripts for that shell; deactivate
    runs deactivate.d and gives the variables back (a syntax with an undo script runs the hooks from a section
    its undo shares)."""
    require_carriable(prefix, "env.prefix")
    return _render(
        "conda_activate",
        shell,
        saves=_each("save", _CONDA_VARS, shell),
        prefix=shell.quote(prefix),
        restores=_each("restore", _CONDA_VARS, shell),
        undo=shell.quote(f"{prefix}/{shell.undo_rel}"),
        hooks=_fill("conda_hooks", shell, which="activate") if shell.undo_script else [],
    )


def render_conda_deactivate() -> str:
    """A conda env's deactivate.d hook: undo what the activate.d extension did."""
    return _render("conda_deactivate")


def render_conda(act: Activation, prefix: str, shell: Syntax, *, constraints: bool = False) -> dict[str, str]:
    """A conda env's hooks in ``shell``, by path in the env: the activate.d/deactivate.d scripts that conda's
    activator for it sources (``conda activate``), and the undo that the deactivate alias of its activate script
    (:func:`render_conda_activate`) sources, where it has one."""
    require_carriable(prefix, "env.prefix")
    values = _extension(act, shell, True, constraints, None)
    activate_d, deactivate_d = shell.conda_rels
    scripts = {activate_d: _render("extension", shell, **values)}
    if not shell.undo_script:
        return {**scripts, deactivate_d: _render("conda_deactivate", shell)}
    restores = _each("restore", _CONDA_VARS, shell)
    conda_undo = _fill("conda_hooks", shell, which="deactivate")
    return {
        **scripts,
        deactivate_d: _render("conda_deactivate", shell, undo=_fill("undo", shell, **values)),
        shell.undo_rel: _render("deactivate_saved", shell, undo=conda_undo, restores=restores),
    }


def render_image_activate(path: str, fusermount: Optional[str], shell: Syntax = POSIX) -> dict[str, str]:
    """The scripts that activate the env at ``path`` (an image's mount or unpacked copy) in ``shell``, by where
    they go: beside ``path`` (the image is read-only); the first is the one to source. With ``fusermount``, its
    deactivate also unmounts ``path``. A syntax without functions (its ``deactivate`` an alias sourcing an undo
    script) gets a second script for its alias: the env's own undo, then the unmount."""
    require_carriable(path, "the image's mount point")
    q, dq = shell.quote, shell.dquote
    unmount = (
        _fill(
            "image_unmount",
            shell,
            fusermount=q(fusermount),
            fusermount_dq=dq(fusermount),
            path=q(path),
            path_dq=dq(path),
        )
        if fusermount
        else []
    )
    how = "squashfuse mount" if fusermount else "unpacked copy"
    script = f"{path}.activate.{shell.suffix}"
    if not shell.undo_script:
        return {script: _render("image", shell, path=q(path), how=how, unmount=unmount)}
    undo = f"{path}.deactivate.{shell.suffix}"
    activate = _fill("activate", shell, prefix=q(path))
    return {
        script: _render("image", shell, how=how, activate=activate, undo=q(undo)),
        undo: _render("image_deactivate", shell, path=q(path), unmount=unmount),
    }


def render_container_entry(name: str, argv: Sequence[str], shell: Syntax = POSIX) -> str:
    """How a container env is entered in ``shell``: a function (csh: an alias) named after the env, ``name``,
    that runs its arguments inside the image (``argv``: the runtime's exec up to the image; each word quoted).
    ``NAME python train.py`` runs the image's python; ``NAME bash`` opens a shell inside."""
    for arg in argv:
        require_carriable(arg, "container command")
    return shell.entry(name, argv)
