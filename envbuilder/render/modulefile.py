"""Modulefiles for envs (pure rendering), in Lua for Lmod (the default) or in Tcl for Environment Modules:
``module load NAME`` activates the env, its recipe's modules come along as dependencies, and ``module unload
NAME`` undoes it. For admins publishing shared envs.

A Lua or Tcl string can hold any byte, but the module system writes a value's line break unescaped into the
shell code that ``module load`` evaluates (the next line runs as a command), and Lmod evaluates a module name it
cannot find. So every value is refused if it holds a line break, a NUL or another control character, and module
names must be names; the loader refuses the same at plan time, and this guards values read back from a state
record. Tcl substitutes ``$``, ``[...]`` and backslashes inside a double-quoted word: :func:`tcl_string` escapes
each of them, and braces, so a value is only ever text.

An env with torch pins (``envbuilder/constraints.txt``) adds that file to pip's and uv's constraints lists, as its
activate script does, so a ``pip install X`` after ``module load`` cannot replace the env's torch build.

A recipe's ``conda activate`` step (``activate.conda_env``) has no modulefile form. ``conda`` is a shell function
the conda module defines in the user's shell, and neither module system runs shell code there in step with its own
state: Lmod's ``source_sh`` and Environment Modules' ``source-sh`` source a script in a fresh shell started from
the module command's environment (where that function does not exist) and replay the changes they saw. So the
modulefile leaves the step out and says so on load (and ``envbuilder modulefile`` warns)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import field
from typing import Optional

from envbuilder.core.structs import dataclass
from envbuilder.core.values import require_carriable
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import CONSTRAINTS
from envbuilder.render.activate_scripts import CONSTRAINT_VARS


def lua_string(text: str) -> str:
    """A Lua string literal for ``text`` (every byte that could end or bend the literal escaped)."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\{ord(ch):03d}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


@dataclass(frozen=True)
class Env:
    """The env a modulefile activates: its name (as ``module load`` takes it), prefix and recipe, what activate
    loads and sets, and whether it has torch pins for pip and uv (``constraints``)."""

    name: str
    prefix: str
    recipe: str
    activate: Activation = field(default_factory=Activation)
    description: str = ""
    constraints: bool = False
    #: A container env's: the runtime's exec of its image (plan.container.exec_prefix). The module then defines
    #: a shell function named after the env that runs its arguments inside the image, and sets no venv.
    entry: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Refuse a value no module system can be handed safely (``activate`` refused its own when made)."""
        for key, value in (
            ("name", self.name),
            ("env.prefix", self.prefix),
            ("recipe", self.recipe),
            ("description", self.description),
        ):
            require_carriable(value, key)
        for word in self.entry:
            require_carriable(word, "container command")

    @property
    def posix_entry(self) -> str:
        """The body of the env's shell function for sh-like shells."""
        return " ".join(shlex.quote(word) for word in self.entry) + ' "$@"'


def loads_said(activate: Activation) -> str:
    """Which modules ``module load`` of the env loads (those activate loads) and ``module unload`` unloads."""
    if not activate.modules:
        return "Loads no module."
    return f"Loads modules: {' '.join(activate.modules)} (unloaded again by `module unload`, where this loaded them)."


def conda_step_note(activate: Activation) -> Optional[str]:
    """What a modulefile of ``activate`` leaves out and the user must do, or None."""
    if not activate.conda_env:
        return None
    env = activate.conda_env
    return (
        f"envbuilder: this env's activate script also runs `conda activate {env}` once its modules are loaded, "
        f"which a modulefile cannot do: run `conda activate {env}` after `module load`, and `conda deactivate` "
        "before `module unload`"
    )


def render(
    *,
    name: str,
    prefix: str,
    recipe: str,
    activate: Optional[Activation] = None,
    description: str = "",
    constraints: bool = False,
    fmt: str = "lua",
    entry: Sequence[str] = (),
) -> str:
    """The modulefile in ``fmt`` (one of :data:`envbuilder.core.formats.MODULEFILE_FORMATS`); ``constraints``: the env at ``prefix`` has torch pins
    for pip and uv. Raises RecipeError for a value a module system cannot be handed safely (see the module
    docstring)."""
    env = Env(name, prefix, recipe, activate or Activation(), description, constraints, tuple(entry))
    return _tcl(env) if fmt == "tcl" else _lua(env)


#: What a module of an env at a prefix holding whitespace says on load: pip and uv split these lists on
#: whitespace, so the path would become several files that do not exist.
_UNGUARDED = (
    "envbuilder: pip install and uv pip install under this module are not kept from replacing its torch: "
    "PIP_CONSTRAINT and UV_CONSTRAINT are whitespace-separated lists and the env path holds whitespace "
    f'(pass --constraint "$VIRTUAL_ENV/{CONSTRAINTS}" yourself)'
)


def _lua(env: Env) -> str:
    name, prefix, recipe, description, activate = (
        env.name,
        env.prefix,
        env.recipe,
        env.description,
        env.activate,
    )
    q = lua_string
    lines = [
        f"-- envbuilder modulefile for {name} (recipe {recipe}).",
        "-- Generated by `envbuilder modulefile`; regenerate rather than edit.",
        f"whatis({q('Name: ' + name)})",
        f"whatis({q('Description: ' + (description or 'PyTorch environment built by envbuilder'))})",
        f"whatis({q(loads_said(activate))})",
        f"help({q('Activates the environment at ' + prefix + ' built from the envbuilder recipe ' + recipe + '. ' + loads_said(activate))})",
        f"local prefix = {q(prefix)}",
        'family("python_env")',
    ]
    for path in activate.module_use:
        lines.append(f'prepend_path("MODULEPATH", {q(path)})')
    for mod in activate.modules:
        # depends_on loads what is missing and unloads on `module unload` only what it loaded.
        lines.append(f"depends_on({q(mod)})")
    if env.entry:
        # Lmod's second body is an alias, for the shells without functions: its words in double quotes.
        alias = " ".join(f'"{word}"' for word in env.entry) + " \\!*"
        lines.append(f"set_shell_function({q(name)}, {q(env.posix_entry)}, {q(alias)})")
    else:
        lines += [
            'setenv("VIRTUAL_ENV", prefix)',
            'prepend_path("PATH", pathJoin(prefix, "bin"))',
            'pushenv("PYTHONHOME", false)',
        ]
    # pushenv, not setenv/unsetenv: on unload Lmod gives back the user's previous value (or unsets it).
    for key, value in activate.env.items():
        lines.append(f"pushenv({q(key)}, {q(value)})")
    for key in activate.unset:
        lines.append(f"pushenv({q(key)}, false)")
    # List entries: unload takes out exactly these, whatever else joined the list meanwhile. Prepending each in
    # turn reverses them, so the last goes first.
    for key, entries in activate.prepend.items():
        lines += [f"prepend_path({q(key)}, {q(entry)})" for entry in reversed(entries)]
    for key, entries in activate.append.items():
        lines += [f"append_path({q(key)}, {q(entry)})" for entry in entries]
    if env.constraints:
        lines += _lua_constraints(prefix)
    note = conda_step_note(activate)
    if note:
        lines.append(f'if (mode() == "load") then LmodMessage({q(note)}) end')
    return "\n".join(lines) + "\n"


def _lua_constraints(prefix: str) -> list[str]:
    q = lua_string
    if any(ch.isspace() for ch in prefix):
        return [f'if (mode() == "load") then LmodMessage({q(_UNGUARDED)}) end']
    # A list entry, not pushenv: unload removes only this file, whatever else joined the list meanwhile.
    return [f'append_path({q(var)}, pathJoin(prefix, {q(CONSTRAINTS)}), " ")' for var in CONSTRAINT_VARS]


def tcl_string(text: str) -> str:
    """A Tcl word for ``text`` in double quotes, with every character Tcl would substitute (``$``, ``[``,
    backslash) or that could end or bend the word (``"``, braces) escaped, and control characters as ``\\uXXXX``."""
    out = ['"']
    for ch in text:
        if ch in '\\"$[]{}':
            out.append("\\" + ch)
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _tcl_unset(key: str) -> list[str]:
    """Unset ``key`` on load and give its value back on unload. Environment Modules' ``unsetenv`` restores only a
    value written into the modulefile, so the value the user had is kept in a variable of its own meanwhile
    (``setenv`` of that variable while unloading unsets it). ``key`` is a validated identifier."""
    saved = f"__ENVBUILDER_SAVED_{key}"
    return [
        "if {[module-info mode unload]} {",
        f"    if {{[info exists ::env({saved})]}} {{",
        f"        unsetenv {key} $::env({saved})",
        f"        setenv {saved} {{}}",
        "    }",
        "} else {",
        f"    if {{[info exists ::env({key})]}} {{ setenv {saved} $::env({key}) }}",
        f"    unsetenv {key}",
        "}",
    ]


def _tcl(env: Env) -> str:
    """The Tcl modulefile: the same steps as the Lua one, in Environment Modules' commands (5.1 or later for
    ``pushenv`` and ``family``; a ``module load`` inside a modulefile is a requirement its unload takes back)."""
    name, prefix, recipe, description, activate = (
        env.name,
        env.prefix,
        env.recipe,
        env.description,
        env.activate,
    )
    q = tcl_string
    help_text = f"Activates the environment at {prefix} built from the envbuilder recipe {recipe}. {loads_said(activate)}"
    lines = [
        "#%Module1.0",
        f"## envbuilder modulefile for {name} (recipe {recipe}).",
        "## Generated by `envbuilder modulefile --format tcl`; regenerate rather than edit.",
        f"module-whatis {q('Name: ' + name)}",
        f"module-whatis {q('Description: ' + (description or 'PyTorch environment built by envbuilder'))}",
        f"module-whatis {q(loads_said(activate))}",
        f"proc ModulesHelp {{}} {{ puts stderr {q(help_text)} }}",
        f"set prefix {q(prefix)}",
        "family python_env",
    ]
    lines += [f"prepend-path MODULEPATH {q(path)}" for path in activate.module_use]
    lines += [f"module load {q(mod)}" for mod in activate.modules]
    if env.entry:  # Environment Modules 4.2+: a shell function for sh-like shells
        lines.append(f"set-function {q(name)} {q(env.posix_entry)}")
    else:
        lines += ["setenv VIRTUAL_ENV $prefix", "prepend-path PATH $prefix/bin", *_tcl_unset("PYTHONHOME")]
    lines += [f"pushenv {q(key)} {q(value)}" for key, value in activate.env.items()]
    for key in activate.unset:
        lines += _tcl_unset(key)
    for key, entries in activate.prepend.items():
        lines += [f"prepend-path {q(key)} {q(entry)}" for entry in reversed(entries)]
    for key, entries in activate.append.items():
        lines += [f"append-path {q(key)} {q(entry)}" for entry in entries]
    if env.constraints:
        if any(ch.isspace() for ch in prefix):
            lines.append(f"if {{[module-info mode load]}} {{ puts stderr {q(_UNGUARDED)} }}")
        else:
            lines += [f'append-path --delim {{ }} {var} "$prefix/{CONSTRAINTS}"' for var in CONSTRAINT_VARS]
    note = conda_step_note(activate)
    if note:
        lines.append(f"if {{[module-info mode load]}} {{ puts stderr {q(note)} }}")
    return "\n".join(lines) + "\n"
