"""Module systems: apply `module use`/`module load` to a build environment, or emit the lines for scripts.

One mechanism serves Lmod and Tcl Environment Modules: a child bash sources the system's own init script, runs
``module use``/``module load`` on *positional arguments* (recipe values never become shell text), and prints
``env -0``. The difference from the starting environment is the delta the build runs with. A recipe's conda env
(``activate.conda_env``) is entered there too, after the loads, by ``conda activate`` on a positional argument: the
``conda`` shell function exists only in a shell the conda module was loaded into. The shell function's
status is used, not Tcl ``modulecmd``'s exit code, which is 0 even when a load fails (it prints _mlstatus = False).
The caller's own environment is never changed.

Positional arguments keep values out of *our* shell text, but Lmod evaluates a module name it cannot find, and
writes a line break in a ``module use`` path unescaped into the shell code ``module`` evaluates. So every name is
checked against :data:`envbuilder.core.values.MODULE_RE` and every path for line breaks and a leading '-' before it is
applied or emitted (the loader checks the same at plan time; this guards state records and other callers).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Optional

from envbuilder.core import values
from envbuilder.core.errors import CommandFailed, ModuleSystemError
from envbuilder.core.modulelines import module_lines
from envbuilder.core.structs import dataclass
from envbuilder.system import proc

#: Variables a child shell changes by itself; never part of a module delta. Exported shell functions
#: (``BASH_FUNC_name%%``: module, ml, conda) are not either: they are shell code for bash, not settings.
_SHELL_NOISE = frozenset({"SHLVL", "_", "PWD", "OLDPWD"})
_FUNCTION_PREFIX = "BASH_FUNC_"

_LMOD_INITS = (
    "/usr/share/lmod/lmod/init/bash",
    "/opt/apps/lmod/lmod/init/bash",
    "/usr/local/lmod/lmod/init/bash",
)
_TCL_INITS = ("/usr/share/modules/init/bash", "/usr/share/Modules/init/bash", "/etc/modules/init/bash")

# $1: init script; $2: the conda env to activate after the loads ('' for none); $3: number of `module use` paths;
# then the paths; then the modules to load.
_SCRIPT = r"""
source "$1" >/dev/null 2>&1 || { echo "envbuilder: cannot source $1" >&2; exit 90; }
conda_env=$2
shift 2
n=$1
shift
while [ "$n" -gt 0 ]; do
    module use "$1" || exit 91
    shift
    n=$((n - 1))
done
if [ "$#" -gt 0 ]; then
    module load "$@" || exit 92
fi
if [ -n "$conda_env" ]; then
    type conda >/dev/null 2>&1 || exit 93
    conda activate "$conda_env" || exit 94
fi
env -0
"""


def check_args(use: Sequence[str], load: Sequence[str]) -> None:
    """Raise ModuleSystemError for a ``module use`` path or a module name a module system would misread."""
    for path in use:
        bad = values.control_problem(path)
        if bad is not None or path.startswith("-"):
            why = f"{bad[0]} in it" if bad else "it starts with '-' (an option)"
            raise ModuleSystemError(f"refusing `module use {path!r}`: {why}", hint=bad[1] if bad else None)
    for name in load:
        problem = values.module_name_problem(name)
        if problem is not None:
            raise ModuleSystemError(problem[0], hint=problem[1])


@dataclass(frozen=True)
class EnvDelta:
    """What loading modules changed: variables set (new values) and variables removed."""

    set: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        out = {k: v for k, v in env.items() if k not in self.unset}
        out.update(self.set)
        return out


@dataclass(frozen=True)
class ModuleSystem:
    """A module system found on this host. ``kind`` is lmod, environment-modules or none."""

    kind: str
    init: Optional[str] = None

    @property
    def init_dir(self) -> Optional[str]:
        """The directory of the init scripts (bash, zsh, ...): activate sources one where a shell has no ``module``."""
        return str(Path(self.init).parent) if self.init else None

    def apply(
        self,
        use: Sequence[str],
        load: Sequence[str],
        env: Mapping[str, str],
        timeout: float = 120,
        conda_env: Optional[str] = None,
    ) -> EnvDelta:
        """Load ``load`` after ``module use`` of each of ``use``, then ``conda activate conda_env`` where given, in
        a child shell started from ``env``."""
        if not use and not load and not conda_env:
            return EnvDelta()
        check_args(use, load)
        if conda_env is not None:
            problem = values.conda_env_problem(conda_env)
            if problem is not None:
                raise ModuleSystemError(problem[0], hint=problem[1])
        if self.kind == "none" or not self.init:
            raise ModuleSystemError(
                f"the recipe loads modules ({', '.join(load) or 'module use ' + ', '.join(use)}) but no module "
                "system was found on this host",
                hint="run on the cluster's nodes, or set LMOD_CMD / MODULESHOME",
            )
        argv = [
            "bash",
            "--noprofile",
            "--norc",
            "-c",
            _SCRIPT,
            "envbuilder-modules",
            self.init,
            conda_env or "",
            str(len(use)),
            *use,
            *load,
        ]
        try:
            res = proc.run(argv, env=dict(env), timeout=timeout)
        except CommandFailed as exc:
            raise self._error(exc.returncode, exc.stderr_tail, load, conda_env) from None
        after = dict(kv.split("=", 1) for kv in res.stdout.split("\0") if "=" in kv)
        changed = {k: v for k, v in after.items() if env.get(k) != v and not _noise(k)}
        removed = tuple(sorted(k for k in env if k not in after and not _noise(k)))
        return EnvDelta(changed, removed)

    def available(self, env: Mapping[str, str], timeout: float = 120) -> tuple[str, ...]:
        """Every module ``module -t avail`` lists from ``env``'s MODULEPATH, as ``name/version`` (a hierarchy's
        modules behind another module are not listed until it is loaded); empty without a module system."""
        if self.kind == "none" or not self.init:
            return ()
        argv = ["bash", "--noprofile", "--norc", "-c", _AVAIL, "envbuilder-modules", self.init]
        try:
            res = proc.run(argv, env=dict(env), timeout=timeout)
        except CommandFailed as exc:
            raise self._error(exc.returncode, exc.stderr_tail, [], None) from None
        return tuple(dict.fromkeys(_avail_names(res.stdout)))

    def _error(
        self, code: int, stderr: str, load: Sequence[str], conda_env: Optional[str]
    ) -> ModuleSystemError:
        text = " ".join(stderr.split())
        if code == 90:
            return ModuleSystemError(
                f"cannot start the module system ({self.init})", hint="check LMOD_CMD/MODULESHOME"
            )
        if code == 91:
            return ModuleSystemError(f"`module use` failed: {text}")
        if code == 93:
            return ModuleSystemError(
                f"no conda command once {' '.join(load) or 'the modules'} loaded, so `conda activate {conda_env}` "
                "(activate.conda_env) cannot run",
                hint="the recipe's modules must define conda (module show NAME tells what a module sets)",
            )
        if code == 94:
            return ModuleSystemError(f"`conda activate {conda_env}` (activate.conda_env) failed: {text}")
        unknown = _unknown_modules(stderr) or [m for m in load if m in stderr]
        if unknown:
            name = unknown[0]
            base = name.split("/")[0]
            return ModuleSystemError(
                f"module {name} is not available on this system ({self.kind}): {text}",
                hint=f"module spider {base}  (lists every version, and what must be loaded first)",
            )
        return ModuleSystemError(
            f"module load {' '.join(load)} failed: {text}",
            hint="module spider NAME tells what a module needs",
        )

    def load_lines(self, use: Sequence[str], load: Sequence[str]) -> list[str]:
        """Shell lines that load the modules (for activate scripts and batch jobs); every value quoted."""
        check_args(use, load)
        return module_lines(use, load)

    def unload_lines(self, load: Sequence[str]) -> list[str]:
        """Shell lines that unload them again, in reverse order."""
        check_args((), load)
        if not load:
            return []
        return ["module unload " + " ".join(shlex.quote(m) for m in reversed(load))]


#: ``module -t avail`` writes to stderr: one directory (``DIR:``) or module per line.
_AVAIL = r"""
source "$1" >/dev/null 2>&1 || { echo "envbuilder: cannot source $1" >&2; exit 90; }
module -t avail 2>&1
"""
#: What Lmod and Tcl modules mark a listed module with: its default, an alias, a load marker.
_MARKS = re.compile(r"\s*(\([^()]*\)|<[^<>]*>)\s*$")


def _avail_names(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        name = _MARKS.sub("", line.strip())
        if name and not name.endswith((":", "/")) and values.module_name_problem(name) is None:
            out.append(name)
    return out


def _noise(name: str) -> bool:
    return name in _SHELL_NOISE or name.startswith(_FUNCTION_PREFIX)


_UNKNOWN_RE = (
    re.compile(r"unknown:\s*((?:\"[^\"]+\"\s*)+)"),  # Lmod: The following module(s) are unknown: "x" "y"
    re.compile(r"Unable to locate a modulefile for '([^']+)'"),  # Tcl Environment Modules
)


def _unknown_modules(stderr: str) -> list[str]:
    found: list[str] = []
    match = _UNKNOWN_RE[0].search(stderr)
    if match:
        found += re.findall(r"\"([^\"]+)\"", match.group(1))
    found += _UNKNOWN_RE[1].findall(stderr)
    return found


DEFAULT_LOCATIONS: tuple[tuple[str, str], ...] = tuple(
    [("lmod", p) for p in _LMOD_INITS] + [("environment-modules", p) for p in _TCL_INITS]
)


def detect(env: Mapping[str, str], locations: Sequence[tuple[str, str]] = DEFAULT_LOCATIONS) -> ModuleSystem:
    """The host's module system, from its environment first, then the usual install locations."""
    lmod_cmd = env.get("LMOD_CMD")
    candidates: list[tuple[str, str]] = []
    if lmod_cmd:
        candidates.append(("lmod", str(Path(lmod_cmd).resolve().parent.parent / "init" / "bash")))
    if env.get("LMOD_PKG"):
        candidates.append(("lmod", str(Path(env["LMOD_PKG"]) / "init" / "bash")))
    if env.get("MODULESHOME"):
        home = Path(env["MODULESHOME"])
        kind = "lmod" if (home / "libexec" / "lmod").exists() else "environment-modules"
        candidates.append((kind, str(home / "init" / "bash")))
    candidates += list(locations)
    for kind, init in candidates:
        if Path(init).is_file():
            return ModuleSystem(kind, init)
    return ModuleSystem("none")
