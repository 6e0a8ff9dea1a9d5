"""Making locks (``envbuilder lock``; the format is :mod:`envbuilder.lockfile`'s): resolve a recipe for each
target platform with uv (wheels) or conda-lock and py-rattler (conda), without being on it, and write the lock."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, cast

from envbuilder import __version__
from envbuilder import plan as planner
from envbuilder.backends import conda, network, torchbuild, uvcache
from envbuilder.backends.installers import uv_binary
from envbuilder.core.errors import CommandFailed, EnvbuilderError, LockError
from envbuilder.core.facts import HostFacts
from envbuilder.core.kinds import AUTO, RATTLER, kind_info
from envbuilder.lockfile import pylock
from envbuilder.lockfile.model import (
    ARCHES,
    Lock,
    LockedFile,
    LockedPackage,
    Locker,
    PlatformLock,
    nightly_warning,
)
from envbuilder.lockfile.reader import from_conda_lock, from_pylock
from envbuilder.lockfile.targets import arch_name, conda_subdir, python_platform, recipe_sha256
from envbuilder.recipe.loader import Recipe
from envbuilder.resolver import mirror
from envbuilder.system import fsutil, modules, proc

if TYPE_CHECKING:
    from envbuilder.resolver.indexfacts import IndexFacts

LOCK_TIMEOUT_S = 600.0


class UvLocker:
    """Wheels: ``uv pip compile --python-platform TAG --python-version X.Y`` through the recipe's (mirrored)
    indexes, written as pylock.toml, which names the one file per package that platform installs."""

    engine = "uv"

    def __init__(self, env: Mapping[str, str], uv: str, log: Callable[[str], None] = lambda _: None) -> None:
        self.env = env
        self.uv = uv
        self.log = log

    def lock(self, arch: str, tag: str, inputs: Mapping[str, Any]) -> PlatformLock:
        rules = mirror.from_env(self.env)
        remapped, notes = mirror.remap([["uv", "pip", "compile", *inputs["index_flags"]]], rules)
        for note in notes:
            self.log(note)
        with tempfile.TemporaryDirectory(prefix="envbuilder-lock-") as tmp:
            req = Path(tmp) / "requirements.in"
            req.write_text("".join(f"{r}\n" for r in inputs["requirements"]), encoding="utf-8")
            out = Path(tmp) / f"pylock.{arch}.toml"
            argv = [
                self.uv,
                "pip",
                "compile",
                str(req),
                *remapped[0][3:],
                "--python-platform",
                tag,
                "--python-version",
                str(inputs["python"]),
                "--generate-hashes",
                "--no-header",
                "--quiet",
                "--output-file",
                str(out),
            ]
            uv = uvcache.uv_settings(Path(tmp) / "env", self.env)
            env = {**proc.scrubbed_env(self.env), **uv.env()}
            self.log("+ " + proc.quote(argv))
            try:
                proc.run(argv, env=env, timeout=LOCK_TIMEOUT_S)
            except CommandFailed as exc:
                raise network.network_error(exc) or LockError(
                    f"uv could not resolve the recipe for {arch} ({tag}, Python {inputs['python']}):\n"
                    + exc.stderr_tail.rstrip(),
                    hint="every package needs a wheel (or sdist) for that platform on the recipe's indexes",
                ) from None
            text = out.read_text(encoding="utf-8")
        return PlatformLock(arch, tag, dict(inputs), from_pylock(text, f"the lock for {arch}"), pylock=text)


class RattlerLocker:
    """conda envs: py-rattler solves the conda packages for the target's subdir (with its glibc and CUDA as
    virtual packages) through the mirrored channels; uv then locks the pip part for the env's python."""

    engine = "rattler"

    def __init__(
        self, env: Mapping[str, str], uv: str, target: HostFacts, log: Callable[[str], None] = lambda _: None
    ) -> None:
        self.env = env
        self.uv = uv
        self.target = target
        self.log = log
        #: conda-lock's output per arch, where conda-lock made it (its own format, kept for --format conda-lock).
        self.native: dict[str, Any] = {}

    def lock(self, arch: str, tag: str, inputs: Mapping[str, Any]) -> PlatformLock:
        conda_pkgs = self._solve(arch, inputs)
        wheels: tuple[LockedPackage, ...] = ()
        if inputs["requirements"]:
            wheels = UvLocker(self.env, self.uv, self.log).lock(arch, tag, inputs).packages
        native = json.dumps(self.native.pop(arch)) if arch in self.native else ""
        return PlatformLock(arch, tag, dict(inputs), conda_pkgs + wheels, conda_lock=native)

    def _channels(self, inputs: Mapping[str, Any]) -> list[str]:
        channels, notes = mirror.remap_channels(inputs["conda_channels"], mirror.from_env(self.env))
        for note in notes:
            self.log(note)
        return channels

    def _virtual_packages(self) -> dict[str, str]:
        """The target's virtual packages (name -> version): its glibc, and CUDA only where it has one."""
        packages = {"__unix": "0", "__linux": "5.14", "__glibc": self.target.glibc or "2.28"}
        if self.target.max_cuda:
            packages["__cuda"] = str(self.target.max_cuda)
        return packages

    def _solve(self, arch: str, inputs: Mapping[str, Any]) -> tuple[LockedPackage, ...]:
        try:
            import rattler  # noqa: PLC0415 - optional dependency
            from rattler.exceptions import SolverError  # noqa: PLC0415
        except ImportError:
            raise LockError(
                "locking a conda recipe needs py-rattler, which is not installed",
                hint="pip install py-rattler",
            ) from None
        channels = self._channels(inputs)
        subdir = conda_subdir(arch)
        packages = [
            rattler.GenericVirtualPackage(
                rattler.PackageName(name), rattler.Version(version), rattler.BuildString("0")
            )
            for name, version in self._virtual_packages().items()
        ]
        self.log(f"solving the conda packages for {subdir} from {', '.join(channels)}")

        async def solve() -> list[Any]:
            return await rattler.solve(
                sources=channels,
                specs=[rattler.MatchSpec(spec) for spec in inputs["conda_specs"]],
                platforms=cast(Any, [subdir, "noarch"]),
                virtual_packages=packages,
            )

        import asyncio  # noqa: PLC0415 - an event loop only for a rattler solve, not on every create's import

        try:
            records = asyncio.run(solve())
        except SolverError as exc:
            raise LockError(f"the conda packages do not resolve for {arch} ({subdir}):\n{exc}") from None
        except Exception as exc:  # rattler's channel and network errors have no common base class
            raise LockError(
                f"cannot read the conda channels for {arch}: {type(exc).__name__}: {exc}"
            ) from None
        out = []
        for r in records:
            sha = r.sha256.hex() if r.sha256 else ""
            out.append(
                LockedPackage(
                    r.name.normalized,
                    str(r.version),
                    "conda",
                    (LockedFile(str(r.url), sha),),
                    str(r.build),
                )
            )
        missing = [p.name for p in out if not p.files[0].sha256]
        if missing:
            raise LockError(f"the channel lists no sha256 for {', '.join(missing)}: they cannot be locked")
        return tuple(out)


class CondaLockLocker(RattlerLocker):
    """conda envs where the site has a conda: conda-lock solves the conda packages with that conda (``create
    --dry-run --json``) for the target's subdir, with the target's virtual packages (conda-lock's defaults claim
    CUDA 11.4 on every linux node); the rest is RattlerLocker's (uv locks the pip part; same lock format)."""

    engine = "conda-lock"

    def __init__(
        self,
        env: Mapping[str, str],
        uv: str,
        target: HostFacts,
        conda_exe: tuple[str, str],
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        super().__init__(env, uv, target, log)
        self.conda_exe = conda_exe

    def argv(self, env_file: Path, virtual: Path, subdir: str, out: Path) -> list[str]:
        exe, name = self.conda_exe
        return [
            *conda_lock_command(),
            "lock",
            "--conda",
            exe,
            "--mamba" if name == "mamba" else "--no-mamba",
            "--micromamba" if name == "micromamba" else "--no-micromamba",
            "--file",
            str(env_file),
            "--platform",
            subdir,
            "--virtual-package-spec",
            str(virtual),
            "--lockfile",
            str(out),
        ]

    def _solve(self, arch: str, inputs: Mapping[str, Any]) -> tuple[LockedPackage, ...]:
        channels = self._channels(inputs)
        subdir = conda_subdir(arch)
        packages = self._virtual_packages()
        with tempfile.TemporaryDirectory(prefix="envbuilder-conda-lock-") as tmp:
            # JSON is YAML: both files are written without a YAML library.
            env_file = Path(tmp) / "environment.yml"
            env_file.write_text(
                json.dumps({"channels": channels, "dependencies": list(inputs["conda_specs"])}),
                encoding="utf-8",
            )
            virtual = Path(tmp) / "virtual-packages.yml"
            virtual.write_text(json.dumps({"subdirs": {subdir: {"packages": packages}}}), encoding="utf-8")
            out = Path(tmp) / "conda-lock.yml"
            argv = self.argv(env_file, virtual, subdir, out)
            self.log(f"solving the conda packages for {subdir} with conda-lock and {self.conda_exe[0]}")
            self.log("+ " + proc.quote(argv))
            res = proc.run(argv, env=self.env, cwd=tmp, timeout=LOCK_TIMEOUT_S, check=False)
            if res.returncode != 0 or not out.is_file():
                raise LockError(
                    f"conda-lock could not lock the conda packages for {arch} ({subdir}):\n"
                    + conda_lock_failure(res.stderr),
                    hint="check conda.channels and conda.packages; conda.engine = 'rattler' locks without conda",
                )
            doc = _read_yaml(out)
        locked = from_conda_lock(doc, subdir, f"conda-lock's output for {arch}")
        self.native[arch] = doc
        return locked


def conda_lock_command() -> list[str]:
    """conda-lock in this interpreter (the ``conda-lock`` extra), else one on PATH (pipx); [] when neither."""
    if importlib.util.find_spec("conda_lock") is not None:
        return [sys.executable, "-m", "conda_lock"]
    exe = shutil.which("conda-lock")
    return [exe] if exe else []


def conda_lock_failure(stderr: str) -> str:
    """What conda said, out of conda-lock's stderr (which ends in a Python traceback of its own)."""
    lines = stderr.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.startswith("Could not lock the environment")), None
    )
    if start is None:
        return proc.tail(stderr).rstrip() or "(conda-lock printed nothing)"
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("Command:")), len(lines)
    )
    return "\n".join(lines[start:end]).rstrip()


def _read_yaml(path: Path) -> Any:
    try:
        yaml = importlib.import_module("yaml")  # conda-lock depends on PyYAML
    except ImportError:
        raise LockError(
            "cannot read conda-lock's output: PyYAML is not installed beside envbuilder",
            hint="pip install 'hpc-envbuilder[conda-lock]'",
        ) from None
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise LockError(f"cannot read conda-lock's output {path}: {exc}") from None


def conda_locker(
    the_plan: planner.Plan,
    env: Mapping[str, str],
    uv: str,
    module_system: modules.ModuleSystem,
    log: Callable[[str], None],
) -> tuple[Locker, list[str]]:
    """conda-lock where the recipe's conda engine is a conda/mamba/micromamba found once its modules are loaded
    (as create would find it) and conda-lock is installed; py-rattler otherwise. (locker, warnings)."""
    step = next((st for st in the_plan.install_steps if st.engine), None)
    engine = step.engine if step else RATTLER
    if engine == RATTLER:
        return RattlerLocker(env, uv, the_plan.target, log), []
    base = proc.scrubbed_env(env)
    search = base
    load = [*the_plan.modules, *(step.modules if step else ())]
    if load or the_plan.module_use:
        try:
            search = module_system.apply(the_plan.module_use, load, base).apply(base)
        except EnvbuilderError as exc:
            log(f"cannot load the recipe's modules here ({exc.message.splitlines()[0]}); looking on PATH")
    found = conda.find_cli(engine, search)
    if found is None:
        if engine != AUTO:
            raise LockError(
                f"conda.engine = {engine!r}, but {engine} is not on PATH after loading the recipe's modules",
                hint="lock on a node with the site's conda module, or set conda.engine = 'auto' or 'rattler'",
            )
        return RattlerLocker(env, uv, the_plan.target, log), []
    if not conda_lock_command():
        warning = (
            f"conda-lock is not installed, so {the_plan.recipe} was locked with py-rattler, not {found[1]} "
            "(pip install 'hpc-envbuilder[conda-lock]' to lock with the site's conda)"
        )
        return RattlerLocker(env, uv, the_plan.target, log), [warning]
    log(f"conda engine for the lock: {found[1]} ({found[0]}) through conda-lock")
    return CondaLockLocker(search, uv, the_plan.target, found, log), []


def default_arches(recipe: Recipe, facts: HostFacts) -> list[str]:
    """The site's compute architecture, else this host's."""
    arch = recipe.compute.arch or facts.arch
    return [arch_name(arch)] if arch else list(ARCHES[:1])


def make(
    recipe: Recipe,
    facts: HostFacts,
    env: Mapping[str, str],
    arches: Sequence[str],
    *,
    python: Optional[str] = None,
    log: Callable[[str], None] = lambda _: None,
    module_system: Optional[modules.ModuleSystem] = None,
    index: Optional[IndexFacts] = None,
) -> tuple[Lock, list[str]]:
    """Resolve ``recipe`` for each of ``arches`` (torch's facts from ``index`` where it was read, else the shipped
    table); (the lock, warnings)."""
    uv = uv_binary()
    if uv is None:
        raise LockError("locking needs uv, which is not installed", hint="pip install uv")
    warnings: list[str] = []
    platforms = []
    kind = ""
    engine = UvLocker.engine
    for arch in dict.fromkeys(arch_name(a) for a in arches):
        the_plan = planner.build(recipe, facts, env, planner.Options(arch=arch), index=index)
        kind = the_plan.kind
        inputs = dict(the_plan.lock_inputs)
        if python:
            inputs["python"] = python
        if not inputs["python"]:
            raise LockError(
                f"{recipe.name} sets no python.version, so the Python to lock for is unknown",
                hint="set python.version in the recipe, or pass --python X.Y",
            )
        if not inputs["requirements"] and not kind_info(kind).conda:
            raise LockError(f"{recipe.name} installs no packages from an index: there is nothing to lock")
        warnings.extend(the_plan.warnings)
        tag = python_platform(arch, the_plan.target.glibc)
        log(f"resolving {recipe.name} for {arch} ({tag}, Python {inputs['python']})")
        locker: Locker = UvLocker(env, uv, log)
        if kind_info(kind).conda:
            locker, more = conda_locker(the_plan, env, uv, module_system or modules.detect(env), log)
            warnings.extend(more)
        locked = locker.lock(arch, tag, inputs)
        # --- torch build guard (issue 16): the locked torch files are the planned build, or no lock is written
        torchbuild.check_lock(the_plan.resolution, the_plan.target, locked, recipe.name)
        platforms.append(locked)
        engine = locker.engine
    lock = Lock(
        recipe=recipe.name,
        recipe_version=recipe.version,
        recipe_sha256=recipe_sha256(recipe.data),
        kind=kind,
        engine=engine,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        created_by=f"envbuilder {__version__}",
        platforms=tuple(platforms),
    )
    if lock.nightly():
        warnings.append(nightly_warning(recipe.name))
    return lock, list(dict.fromkeys(warnings))


def write(lock: Lock, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fsutil.write_atomic(path, lock.dumps().encode(), 0o644)


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fsutil.write_atomic(path, text.encode(), 0o644)
    return path


def write_pylocks(lock: Lock, directory: Path) -> list[Path]:
    """One PEP 751 ``pylock.ARCH.toml`` per platform of a wheel lock, in ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for platform in lock.platforms:
        path = directory / pylock.file_name(platform.arch)
        fsutil.write_atomic(path, pylock.render(lock, platform).encode(), 0o644)
        written.append(path)
    return written
