"""The conda backend: a conda env made by a conda engine, filled by the installer, and moved into place; and the
overlay clone (``env.overlay = 'clone'``), a copy of the site python's own env moved into place the same way.

The plan's create step is conda's own command line (``ENGINE create --yes --prefix P --override-channels --channel
URL ... python=X.Y pip ...``). Here it gets its engine: the recipe's, or with ``auto`` the first of mamba, conda and
micromamba on PATH once the recipe's modules are loaded (a site's miniforge3 module), else the embedded py-rattler
(``envbuilder.backends.rattler_engine``, same command line), which writes the final prefix into the files that embed one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from envbuilder import lockfile
from envbuilder.backends import activation
from envbuilder.backends.base import Backend, Build, describe, step_argv, step_env, written_dirs
from envbuilder.backends.buildlog import run_logged
from envbuilder.core import settings
from envbuilder.core.errors import BackendError, CommandFailed, NetworkError
from envbuilder.core.kinds import AUTO, CLI_ENGINES, RATTLER
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import InstallStep
from envbuilder.system import proc, progress, relocate


def _create_hint(step: InstallStep) -> str:
    """What to check when the engine could not make the env: the channels, the packages, and the python the plan
    asks them for (the plan's Python for the env, which ``plan`` shows with where it came from)."""
    python = next((a for a in step.argv if a.startswith("python=")), None)
    if python is None:
        return "check conda.channels and conda.packages (envbuilder plan NAME shows the command)"
    return (
        f"check conda.channels and conda.packages, and that the channels have {python} (the env's Python, "
        "from the recipe's [python] version or envbuilder's default: set [python] version to choose another; "
        "envbuilder plan NAME shows the command)"
    )


class CondaBackend(Backend):
    """A conda env its engine makes (with python and pip), the installer fills, and move_in relocates."""

    def python(self, command: str, env: Mapping[str, str], final: Path) -> str:
        # The env brings its own python (the recipe's python=X.Y); the site's is not used.
        return str(final / "bin" / "python")

    def own_env(self, partial: Path, env: Mapping[str, str]) -> dict[str, str]:
        return {settings.CONDA_CACHE_VAR: str(settings.conda_cache(env))}

    def create(self, build: Build, step: Optional[InstallStep], env: Mapping[str, str]) -> None:
        if step is None:
            return
        full, own = step_env(step, env)
        argv, build.engine = engine_argv(step_argv(step, build), step.engine, full, self.arch, build.final)
        full = engine_env(build.engine, full)
        build.log.write(f"conda engine: {build.engine}")
        build.say(f"{describe(step)} with {build.engine}")
        growth = progress.Growth(written_dirs(build, full), build.moving, after=progress.MEASURE_AFTER_S)
        try:
            run_logged(argv, full, build.log, own, watch=growth.watch)
            growth.last()
        except NetworkError:
            raise  # its own words, URL and way out: not a channel or package mistake
        except CommandFailed as exc:
            detail = exc.stderr_tail.rstrip() or f"(no message; {proc.describe_status(exc.returncode)})"
            raise BackendError(
                f"{build.engine} could not create the conda env:\n{detail}", hint=_create_hint(step)
            ) from None
        if self.locked:
            check_locked(build.partial, self.locked, build.engine)
            build.log.write(f"conda packages match the lock ({len(self.locked)})")

    def activate(self, build: Build, act: Activation) -> None:
        activation.install_conda(build.partial, str(build.final), act)

    def move_in(self, build: Build) -> None:
        _moved_in(build)


class CloneBackend(Backend):
    """A copy of the site python's whole env (a module's venv or conda env), which create makes itself: no tool
    does it for both alike. The site env is only read."""

    def needs_parent(self) -> bool:
        return True

    def create(self, build: Build, step: Optional[InstallStep], env: Mapping[str, str]) -> None:
        source = build.parent["prefix"]
        build.say(f"cloning the site env {source}")
        build.engine = "clone"
        kept = clone(Path(source), build.partial, build.final)
        build.log.write(f"cloned {source}: {len(kept.rewritten)} file(s) repointed")
        if kept.left:
            note = f"{len(kept.left)} file(s) of the clone still name the site env (binaries); they read it"
            build.log.write(note + ": " + ", ".join(kept.left[:20]))
            build.notes.append(note)

    def activate(self, build: Build, act: Activation) -> None:
        if (build.partial / "conda-meta").is_dir():
            activation.install_conda(build.partial, str(build.final), act)
        else:
            activation.install(build.partial, act, str(build.final))

    def move_in(self, build: Build) -> None:
        _moved_in(build)


def _moved_in(build: Build) -> None:
    changed = move_in(build.partial, build.final, build.engine)
    build.log.write(f"relocated {len(changed)} file(s) from {build.partial} to {build.final}")


def rattler_available() -> bool:
    return importlib.util.find_spec("rattler") is not None


def engine_argv(
    argv: Sequence[str], engine: str, env: Mapping[str, str], arch: str, final: Path
) -> tuple[list[str], str]:
    """The create command for the engine that will run it, and that engine's name."""
    if engine == AUTO:
        found = find_cli(engine, env)
        if found:
            return [found[0], *argv[1:]], found[1]
        if not rattler_available():
            raise BackendError(
                "no conda engine: neither mamba, conda nor micromamba is on PATH after loading the recipe's "
                "modules, and py-rattler (the embedded engine) is not installed",
                hint="load the site's conda module (module spider miniforge3), or pip install py-rattler",
            )
        engine = RATTLER
    if engine == RATTLER:
        if not rattler_available():
            raise BackendError(
                "conda.engine = 'rattler' needs py-rattler, which is not installed here",
                hint="pip install py-rattler (Python 3.10 or newer)",
            )
        cmd = [sys.executable, "-m", "envbuilder.backends.rattler_engine", *argv[1:]]
        return [*cmd, "--platform", lockfile.conda_subdir(arch), f"--final-prefix={final}"], RATTLER
    found = find_cli(engine, env)
    if found is None:
        raise BackendError(
            f"conda.engine = {engine!r}, but {engine} is not on PATH after loading the recipe's modules",
            hint="load the module that provides it, or set conda.engine = 'auto' or 'rattler'",
        )
    return [found[0], *argv[1:]], engine


def engine_env(engine: str, env: Mapping[str, str]) -> dict[str, str]:
    """The environment the engine runs in. The embedded one is envbuilder's own python, which must import
    envbuilder and py-rattler from where this process does, also when they come from PYTHONPATH (a checkout), which
    every child's environment is scrubbed of."""
    if engine != RATTLER:
        return dict(env)
    import envbuilder  # noqa: PLC0415 - the package's own location

    spec = importlib.util.find_spec("rattler")
    roots = [Path(envbuilder.__file__).parent.parent]
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parent.parent)
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(str(r) for r in roots))}


def find_cli(engine: str, env: Mapping[str, str]) -> Optional[tuple[str, str]]:
    """The conda command line ``engine`` names on the env's PATH (with ``auto``, the first of mamba, conda and
    micromamba), as (path, name); None when there is none, or the engine is the embedded one."""
    names = CLI_ENGINES if engine == AUTO else (engine,) if engine in CLI_ENGINES else ()
    for name in names:
        exe = shutil.which(name, path=env.get("PATH", ""))
        if exe:
            return exe, name
    return None


def move_in(build: Path, final: Path, engine: str) -> list[str]:
    """Rewrite the build path to the final one where a later install wrote it (script headers of pip-installed
    packages, conda's activate.d); refuse an env whose binaries embed the build path (a CLI engine's, which
    cannot build for another prefix). Returns the files rewritten."""
    moved = relocate.relocate(build, str(build), str(final))
    if moved.left:
        shown = ", ".join(moved.left[:4]) + (" …" if len(moved.left) > 4 else "")
        raise BackendError(
            f"the {engine} build wrote its temporary path into {len(moved.left)} file(s) that cannot be rewritten "
            f"safely ({shown}), so it cannot be moved into place at {final}",
            hint="set conda.engine = 'rattler' (py-rattler builds for the final prefix directly)",
        )
    return list(moved.rewritten)


def installed(prefix: Path) -> dict[str, str]:
    """The conda packages in an env, name -> sha256 of the package file (from conda-meta)."""
    out = {}
    for path in sorted((prefix / "conda-meta").glob("*.json")):
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        out[str(rec.get("name"))] = str(rec.get("sha256") or "")
    return out


def check_locked(prefix: Path, expected: Mapping[str, str], engine: str) -> None:
    """The env holds exactly the locked conda packages, each from a file with the locked sha256."""
    have = installed(prefix)
    wrong = [n for n, sha in expected.items() if have.get(n) != sha]
    extra = sorted(set(have) - set(expected))
    if wrong or extra:
        detail = "; ".join(
            [
                *(f"{n}: locked {expected[n][:12]}…, got {(have.get(n) or 'nothing')[:12]}" for n in wrong),
                *(f"{n}: not in the lock" for n in extra),
            ]
        )
        raise BackendError(
            f"the conda env {engine} built does not match the lock ({detail})",
            hint="the channel serves other files than when the lock was made: regenerate it (envbuilder lock)",
        )


def clone(source: Path, build: Path, final: Path) -> relocate.Relocation:
    """Copy the env at ``source`` (a site module's conda env or venv) to ``build``, symlinks as links, and point
    the copy's scripts and activate files at ``final``. ``source`` is only read. Files that name ``source`` and
    cannot be rewritten (binaries) are returned in ``left``: they keep reading the site env, which stays."""
    if not source.is_dir() or source.resolve() == Path("/usr").resolve():
        raise BackendError(
            f"cannot clone {source}: the site python is not in an env of its own",
            hint="load the module that provides the env (its python must be first on PATH), or use overlay = 'venv'",
        )
    try:
        shutil.copytree(source, build, symlinks=True)
    except (OSError, shutil.Error) as exc:
        raise BackendError(f"cannot clone {source} into {build}: {exc}") from None
    return relocate.relocate(build, str(source), str(final))
