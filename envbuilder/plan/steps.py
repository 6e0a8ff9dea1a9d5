"""The commands that build an env (pure): create the venv/overlay/conda env, install the resolver's pins, then the
recipe's packages under torch's constraints. Each is an InstallStep: argv plus its own variables and modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Optional

from envbuilder.core.kinds import AUTO, RATTLER, kind_info
from envbuilder.core.structs import dataclass
from envbuilder.lockfile import PlatformLock
from envbuilder.plan.installers import INSTALLERS
from envbuilder.resolver.mirror import PYPI
from envbuilder.resolver.wheels import Resolution

if TYPE_CHECKING:  # only a type here: the recipe arrives loaded
    from envbuilder.recipe.loader import Recipe
    from envbuilder.recipe.sections import Package

#: argv[0] of the step that clones the site python's env (create does it in-process).
CLONE = "envbuilder-clone"
#: Where create writes the locked packages (hashed) and the pins later installs must keep, inside the env.
LOCK_REQUIREMENTS = "envbuilder/lock-requirements.txt"
CONSTRAINTS = "envbuilder/constraints.txt"


@dataclass(frozen=True)
class InstallStep:
    """One command of the build. ``env`` holds raw recipe values (``${VAR}`` expanded at run time, from the
    environment the modules give); ``modules`` are loaded for this step only; ``site_python`` says the step runs
    the recipe's python (named by ``--python`` or as the command), which create replaces with the one it found."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    #: Directories put before the build environment's value of a list variable (raw, as ``env``).
    env_prepend: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    site_python: bool = False
    creates_env: bool = False
    label: str = ""
    #: conda env creation: the recipe's engine (auto, conda, mamba, micromamba, rattler), chosen at build time.
    engine: str = ""

    def display(self) -> tuple[str, ...]:
        """The step as one command line (``env K=V ...`` first when it sets variables)."""
        if not (self.env or self.env_prepend):
            return self.argv
        prepends = (f"{k}={':'.join(v)}:${k}" for k, v in self.env_prepend.items())
        return ("env", *(f"{k}={v}" for k, v in self.env.items()), *prepends, *self.argv)


#: Ends the installer's options: what follows is read as requirements, never as an option (``--target=...``),
#: whatever a recipe or a state record holds. uv and pip (optparse) both honour it.
END_OF_OPTIONS = "--"


def _pip(installer: str, python: str, target_flag: Sequence[str] = ()) -> list[str]:
    return INSTALLERS[installer].pip(python, target_flag)


def conda_env_specs(recipe: Recipe, python: Optional[str]) -> list[str]:
    """python (the plan's: ``target.env_python``) and pip inside the env (without them pip is the base env's: the
    Zurada seed's mistake), then the recipe's conda packages."""
    return [f"python={python or recipe.python.conda_version}", "pip", *recipe.conda.packages]


@dataclass(frozen=True)
class NewEnv:
    """The env the steps build: its kind, the installer, the python it is made from, and where it goes."""

    kind: str
    installer: str
    python: str
    prefix: str
    #: The Python version the plan decided (``target.env_python``): a conda env's engine is asked for it.
    python_version: Optional[str] = None


def _create_step(
    new: NewEnv, recipe: Recipe, channels: Sequence[str], locked: Optional[PlatformLock]
) -> Optional[InstallStep]:
    kind, installer, python_cmd, prefix = new.kind, new.installer, new.python, new.prefix
    if kind_info(kind).overlay and recipe.env.overlay == "clone":
        # A copy of the site python's whole env, made by create itself (no tool does it for a venv or a
        # module's conda env alike); the site env is only read.
        return InstallStep((CLONE, "--python", python_cmd, prefix), site_python=True, creates_env=True)
    ssp = ["--system-site-packages"] if (recipe.env.system_site_packages or kind_info(kind).overlay) else []
    prompt = ["--prompt", recipe.name]
    if kind_info(kind).venv:
        argv = INSTALLERS[installer].venv(prompt, python_cmd, ssp, prefix)
        return InstallStep(tuple(argv), site_python=True, creates_env=True)
    if kind_info(kind).conda:
        engine = recipe.conda.engine
        exe = "envbuilder-rattler" if engine == RATTLER else ("conda" if engine == AUTO else engine)
        cmd = [exe, "create", "--yes", "--prefix", prefix, "--override-channels"]
        for ch in channels:
            cmd += ["--channel", ch]
        if locked is not None:
            cmd += [p.conda_spec() for p in locked.conda]  # exactly the locked builds
        else:
            cmd += conda_env_specs(recipe, new.python_version)
        return InstallStep(tuple(cmd), creates_env=True, engine=engine, label="the conda env")
    return None


def one_resolution(installer: str, resolution: Resolution, plain: Sequence[str]) -> bool:
    """Whether torch and the recipe's plain packages can be installed by one uv run without torch's index coming
    unpinned: every torch-family pin carries its index's local label (``torch==2.13.0+cpu``), which no other index's
    file has, so uv's best match across PyPI and torch's index can only take torch from there; and the release is
    not a nightly (whose ``--pre`` would reach the recipe's packages). pip keeps two runs."""
    return (
        installer == "uv"
        and bool(plain)
        and resolution.channel != "nightly"
        and bool(resolution.requirements)
        and all("+" in pin for pin in resolution.requirements)
    )


def one_resolution_flags(resolution: Resolution) -> list[str]:
    """The indexes of a one_resolution install: PyPI and torch's, each package from whichever has its best
    version (the same files where both have it)."""
    return [*_pypi_and_torch(resolution), "--index-strategy", "unsafe-best-match"]


def _pypi_and_torch(resolution: Resolution) -> list[str]:
    """The resolution's flags with PyPI as the main index and torch's as the extra one."""
    rest = [f for f in resolution.pip_flags if f not in ("--index-url", resolution.index_url)]
    return ["--index-url", PYPI, "--extra-index-url", resolution.index_url, *rest]


def locked_flags(resolution: Optional[Resolution], plain_specs: Sequence[str]) -> list[str]:
    """The indexes a lock resolves against and installs from: torch's first, then PyPI for the rest. uv searches
    extra indexes before the main one, so PyPI is the main index and torch's the extra: PyPI's torch build can
    never stand in for the planned one."""
    if resolution and plain_specs:
        return _pypi_and_torch(resolution)
    return list(resolution.pip_flags) if resolution else []


def build_flags(installer: str, pkg: Package) -> list[str]:
    """How the installer builds ``pkg``: in the env (no isolation), from source, and not from its cache where the
    package is built for this env (a cached build may have been made against another env's modules)."""
    flags = ["--no-build-isolation"] if pkg.no_build_isolation else []
    if pkg.no_binary:
        flags += ["--no-binary", pkg.name]
    if pkg.built_for_env:
        flags += INSTALLERS[installer].fresh_build
    return flags


def install_steps(
    new: NewEnv,
    recipe: Recipe,
    resolution: Optional[Resolution],
    packages: Sequence[Package],
    warnings: list[str],
    *,
    locked: Optional[PlatformLock] = None,
    channels: Sequence[str] = (),
) -> tuple[list[InstallStep], list[str]]:
    kind, installer, python_cmd, prefix = new.kind, new.installer, new.python, new.prefix
    steps: list[InstallStep] = []
    create = _create_step(new, recipe, channels, locked)
    if create:
        steps.append(create)
    env_python = f"{prefix}/bin/python"
    target_flag: list[str] = []
    site_python = not kind_info(kind).own_python
    if site_python:
        env_python = python_cmd
        target_flag = INSTALLERS[installer].user_target(prefix)
        note = INSTALLERS[installer].user_prefix_note
        if note:
            warnings.append(note)
    plain = [pkg.requirement for pkg in packages if not pkg.own_step]
    if locked is not None and locked.wheels:
        # Exactly the locked files: every version pinned, every file's hash checked, nothing resolved again.
        argv = [
            *_pip(installer, env_python, target_flag),
            "--no-deps",
            "--require-hashes",
            *locked_flags(resolution, plain),
            "--requirement",
            f"{prefix}/{LOCK_REQUIREMENTS}",
        ]
        steps.append(
            InstallStep(tuple(argv), site_python=site_python, label=f"{len(locked.wheels)} locked packages")
        )
    elif resolution is not None and locked is None and one_resolution(installer, resolution, plain):
        # torch and the recipe's packages in one installer run (one resolution, one start): see one_resolution.
        specs = [*resolution.requirements, *plain]
        argv = [
            *_pip(installer, env_python, target_flag),
            *one_resolution_flags(resolution),
            "--constraint",
            f"{prefix}/{CONSTRAINTS}",
            END_OF_OPTIONS,
            *specs,
        ]
        steps.append(InstallStep(tuple(argv), site_python=site_python, label=" ".join(specs)))
        plain = []
    elif resolution is not None and locked is None:
        argv = (
            _pip(installer, env_python, target_flag)
            + list(resolution.pip_flags)
            + [END_OF_OPTIONS, *resolution.requirements]
        )
        steps.append(
            InstallStep(tuple(argv), site_python=site_python, label=" ".join(resolution.requirements))
        )
    extra_indexes: list[str] = []
    # torch's exact pins as constraints: a later package cannot swap the CUDA torch for PyPI's build.
    constraint = ["--constraint", f"{prefix}/{CONSTRAINTS}"] if (resolution or locked) else []
    own_steps: list[InstallStep] = []
    for pkg in (p for p in packages if p.own_step):
        spec = pkg.requirement
        cmd = _pip(installer, env_python, target_flag)
        index = pkg.index
        if index == "torch" and resolution:
            cmd += ["--index-url", resolution.index_url]
        elif index and index not in ("pypi", "torch"):
            cmd += ["--index-url", index]
            extra_indexes.append(index)
        cmd += build_flags(installer, pkg)
        own_steps.append(
            InstallStep(
                (*cmd, *constraint, END_OF_OPTIONS, spec),
                env=dict(pkg.build_env),
                env_prepend={k: tuple(v) for k, v in pkg.build_env_prepend.items()},
                modules=pkg.build_modules,
                site_python=site_python,
                label=spec,
            )
        )
    if plain and locked is None:  # a lock holds these already
        steps.append(
            InstallStep(
                (*_pip(installer, env_python, target_flag), *constraint, END_OF_OPTIONS, *plain),
                site_python=site_python,
                label=" ".join(plain),
            )
        )
    return steps + own_steps, extra_indexes
