"""The backend protocol: how one kind of env is built beside its prefix, and what every backend shares (running
a plan's step in the build directory, the interpreter it starts from, the inventory of what was installed).

create makes a :class:`Build` (modules loaded, python found, the installer's and the backend's settings), then
calls the backend's ``create`` (the plan's first step, when it makes the env), ``install`` for each other step,
``activate``, ``move_in``, and ``inventory`` and ``tools`` for the record. restore does the same with a backup's
recorded create command and ``install_files`` for the wheels it stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any, Callable, Optional

from packaging.utils import canonicalize_name

from envbuilder import __version__
from envbuilder.backends import activation, toolversion
from envbuilder.backends.buildlog import BuildLog, run_logged
from envbuilder.backends.installers import Installer
from envbuilder.backends.torchbuild import metadata_name_version
from envbuilder.core import settings
from envbuilder.core.errors import BackendError
from envbuilder.core.structs import dataclass
from envbuilder.plan import expand
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import InstallStep
from envbuilder.system import progress
from envbuilder.system.modules import EnvDelta


def _silent(text: str) -> None:
    """A Build's default ``say``: tell no one."""


def _unwatched(done: int) -> None:
    """A Build's default ``moving``: tell no one."""


@dataclass
class Build:
    """One env being built at ``partial`` beside its prefix: what the backend's steps read, and what they learn."""

    #: The prefix the plan's commands name; the real one the env will have (resolved); where it is built.
    prefix: str
    final: Path
    partial: Path
    installer: Installer
    #: How the installer's own program runs here (installers.Choice.program).
    program: Sequence[str]
    #: The interpreter the env is built from (a conda env's own).
    python: str
    #: The environment without the modules' changes: a step with modules of its own starts from it.
    base_env: dict[str, str]
    #: The build's environment: the modules' changes, and the tools' settings (``tool_env``) over them.
    env: dict[str, str]
    tool_env: dict[str, str]
    log: BuildLog
    #: Progress for the user, one line a step.
    say: Callable[[str], None] = _silent
    #: Bytes the running step has downloaded and unpacked so far (progress.Growth of the env and the caches).
    moving: Callable[[int], None] = _unwatched
    #: What the running step's installer announced it downloads (progress.Downloads.summary).
    downloads: Callable[[str], None] = _silent
    #: Said at the end, and kept in the result.
    notes: list[str] = field(default_factory=list)
    #: What the base python says about itself (python_info), where the backend asked (Backend.needs_parent).
    parent: dict[str, Any] = field(default_factory=dict)
    #: What made a conda env (its engine, or ``clone``), once something has.
    engine: str = ""


class Backend:
    """Builds one kind of env. This base class is a venv-like env that the installer makes and fills; the kinds
    override where they differ (venv.py, conda.py; the registry maps kinds to them)."""

    def __init__(
        self,
        system_site_packages: bool = False,
        arch: str = "",
        locked: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.system_site_packages = system_site_packages
        #: The target's architecture, and the conda packages of the lock in use (name -> sha256).
        self.arch = arch
        self.locked = dict(locked or {})

    def python(self, command: str, env: Mapping[str, str], final: Path) -> str:
        """The interpreter the env is built from: the recipe's, on the PATH the modules give."""
        return find_python(command, env)

    def needs_parent(self) -> bool:
        """Whether the env sees the base python's packages, so the build asks that python about itself."""
        return self.system_site_packages

    def own_env(self, partial: Path, env: Mapping[str, str]) -> dict[str, str]:
        """Variables this kind sets for every step (beside the installer's)."""
        return {}

    def create(self, build: Build, step: Optional[InstallStep], env: Mapping[str, str]) -> None:
        """Make the env at ``build.partial``, with the plan's step that does (if it has one)."""
        if step is not None:
            self.run(build, step, env)

    def install(self, build: Build, step: InstallStep, env: Mapping[str, str]) -> None:
        """Run one of the plan's install steps into the env."""
        self.run(build, step, env)

    def install_files(self, build: Build, files: Sequence[str]) -> None:
        """Install exactly ``files`` into the env, offline, resolving nothing (a wheelhouse's wheels)."""
        target = str(build.partial / "bin" / "python")
        argv = [*build.installer.pip(target), *build.installer.offline, "--no-deps", *files]
        run_logged(own_program(argv, build), build.env, build.log)

    def activate(self, build: Build, act: Activation) -> None:
        """Write the activate extension into the env."""
        activation.install(build.partial, act, str(build.final))

    def move_in(self, build: Build) -> None:
        """Make the env work at ``build.final`` once renamed there (rewrite what names the build path)."""

    def site_python(self, build: Build) -> Optional[str]:
        """The python that runs the env when it has none of its own (a user prefix's)."""
        return None

    def inventory(self, build: Build) -> list[dict[str, Any]]:
        return inventory(build.partial)

    def tools(self, build: Build) -> dict[str, str]:
        """What built the env, for its record."""
        tools = {
            "envbuilder": __version__,
            "installer": build.installer.name,
            "python": python_version(build.partial, build.parent),
            "python_path": build.python,
            "host_python": platform.python_version(),
        }
        if build.installer.records_version and build.program:
            cache = settings.tool_versions_cache(settings.home(build.base_env))
            version = toolversion.version(build.program, build.env, build.log, cache)
            if version is not None:
                tools[build.installer.name] = version
        return tools

    def run(self, build: Build, step: InstallStep, env: Mapping[str, str]) -> None:
        """Run ``step`` in the build directory, with its own variables."""
        full, own = step_env(step, env)
        build.say(describe(step))
        growth = progress.Growth(written_dirs(build, full), build.moving, after=progress.MEASURE_AFTER_S)
        fetched = progress.Downloads(build.downloads)
        run_logged(step_argv(step, build), full, build.log, own, watch=growth.watch, on_line=fetched.line)
        growth.last()


# ---------------------------------------------------------------------------------------------------------------
# Steps


#: Where installers keep what they download: its growth, with the env's, is a step's progress.
_CACHE_VARS = ("UV_CACHE_DIR", "PIP_CACHE_DIR", "CONDA_PKGS_DIRS", settings.CONDA_CACHE_VAR)


def written_dirs(build: Build, env: Mapping[str, str]) -> list[Path]:
    """The directories a step writes what it downloads and installs: the partial env and the installer's caches."""
    caches = [Path(d) for var in _CACHE_VARS for d in env.get(var, "").split(",") if d]
    return [build.partial, *caches]


def describe(step: InstallStep) -> str:
    return "creating the env" if step.creates_env else f"installing {step.label or 'packages'}"


def rebase(argv: Sequence[str], old: str, new: str) -> list[str]:
    """``argv`` with the path ``old`` (and anything under it) moved to ``new``; other arguments untouched."""
    out = []
    for arg in argv:
        if arg == old:
            out.append(new)
        elif arg.startswith(old + "/"):
            out.append(new + arg[len(old) :])
        else:
            out.append(arg)
    return out


def own_program(argv: Sequence[str], build: Build) -> list[str]:
    """``argv`` with the installer's program, named as the plan names it, replaced by the one found here."""
    if build.installer.program and build.program and argv[0] == build.installer.program:
        return [*build.program, *argv[1:]]
    return list(argv)


def step_argv(step: InstallStep, build: Build) -> list[str]:
    """The argv that runs ``step`` in the build directory with the tools found here."""
    argv = list(step.argv)
    if step.site_python:
        at = argv.index("--python") + 1 if "--python" in argv else 0
        argv[at] = build.python
    return own_program(rebase(argv, build.prefix, str(build.partial)), build)


def step_env(step: InstallStep, env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The step's variables with ${VAR} expanded from the build environment, then its directories put before
    the value the modules give (LIBRARY_PATH=<stubs>:<the module's>); (full env, the step's own)."""
    own: dict[str, str] = {}
    for key, raw in step.env.items():
        own[key] = _expand_build(key, raw, {**env, **own})
    for key, entries in step.env_prepend.items():
        dirs = [_expand_build(key, raw, {**env, **own}) for raw in entries]
        current = {**env, **own}.get(key)
        own[key] = ":".join([*dirs, *([current] if current else [])])
    return {**env, **own}, own


def _expand_build(key: str, raw: str, env: Mapping[str, str]) -> str:
    value, missing = expand(raw, env, "")
    if missing:
        raise BackendError(
            f"build variable {key}={raw!r} needs {', '.join('$' + m for m in missing)}, which the recipe's "
            "modules do not set",
            hint="add the module that sets it to the package's build_modules or to modules.load",
        )
    return value


# ---------------------------------------------------------------------------------------------------------------
# The interpreter a build starts from


def find_python(command: str, env: Mapping[str, str]) -> str:
    """The absolute path of the recipe's python, looked up on the PATH the modules give."""
    if os.sep in command:
        found = command if os.access(command, os.X_OK) else None
    else:
        found = shutil.which(command, path=env.get("PATH", ""))
    if not found:
        raise BackendError(
            f"python command {command!r} was not found on the PATH the recipe's modules give",
            hint="check python.command and modules.load in the recipe (envbuilder recipes show NAME --explain)",
        )
    return found


def python_info(python: str, env: Mapping[str, str], log: BuildLog) -> dict[str, Any]:
    """What an interpreter says about itself: version, prefix, base prefix, site-packages."""
    code = (
        "import json, site, sys; print(json.dumps({'version': '%d.%d.%d' % sys.version_info[:3], "
        "'prefix': sys.prefix, 'base_prefix': sys.base_prefix, 'site_packages': site.getsitepackages()}))"
    )
    res = run_logged([python, "-c", code], env, log)
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def python_version(partial: Path, parent: Mapping[str, Any]) -> str:
    if parent.get("version"):
        return str(parent["version"])
    for line in read_text(partial / "pyvenv.cfg").splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version_info", "version"):
            return value.strip()
    return "?"


# ---------------------------------------------------------------------------------------------------------------
# What was built


def inventory(prefix: Path) -> list[dict[str, Any]]:
    """The distributions installed in the env (read from its dist-info directories): name, version, installer,
    the sha256 of the RECORD file (a fingerprint of exactly what was installed) and the bytes RECORD lists."""
    found: dict[str, dict[str, Any]] = {}
    for info in sorted(prefix.glob("lib/python*/site-packages/*.dist-info")):
        meta = metadata_name_version(info)
        if not meta or not meta[0]:
            continue
        name, version = meta
        record = read_text(info / "RECORD")
        size = 0
        for line in record.splitlines():
            last = line.rsplit(",", 1)[-1]
            size += int(last) if last.isdigit() else 0
        found[canonicalize_name(name)] = {
            "name": name,
            "version": version,
            "installer": read_text(info / "INSTALLER").strip() or None,
            "in_env": True,
            "record_sha256": hashlib.sha256(record.encode()).hexdigest() if record else None,
            "size": size,
        }
    return sorted(found.values(), key=lambda d: str(d["name"]).lower())


def loaded_modules(system: str, delta: EnvDelta) -> dict[str, Any]:
    """The record's account of the modules a build loaded: the module system, and what loading them changed."""
    return {"system": system, "delta_set": dict(sorted(delta.set.items())), "delta_unset": list(delta.unset)}


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
