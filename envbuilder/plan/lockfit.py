"""Whether a lock applies (pure): what a lock for a target must have been resolved from, whether a given lock
still matches the recipe, and which of its packages belong on the target. The plan takes a lock through here."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Optional

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from envbuilder.core.errors import LockError
from envbuilder.core.kinds import kind_info
from envbuilder.core.structs import dataclass
from envbuilder.lockfile import targets
from envbuilder.lockfile.model import Lock, LockedPackage, LockSummary, PlatformLock
from envbuilder.plan.steps import conda_env_specs, locked_flags
from envbuilder.resolver.wheels import Resolution

if TYPE_CHECKING:  # only a type here: the recipe arrives loaded
    from envbuilder.recipe.loader import Recipe
    from envbuilder.recipe.sections import Package


@dataclass(frozen=True)
class LockStatus:
    """The lock a plan found, and whether it applies to the target (``reason`` says why not)."""

    summary: LockSummary
    arch: Optional[str]
    applies: bool
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        out = {
            **self.summary.to_json(),
            "arch": self.arch,
            "status": "applies" if self.applies else "ignored",
        }
        if not self.applies:
            out["reason"] = self.reason
        return out


def _python_minor(version: Optional[str]) -> str:
    return ".".join(str(version or "").split(".")[:2])


def lock_inputs(
    kind: str,
    python: Optional[str],
    resolution: Optional[Resolution],
    packages: Sequence[Package],
    recipe: Recipe,
) -> dict[str, Any]:
    """The resolution a lock for this target records: torch's pins and the recipe's plain packages, through
    torch's index first and PyPI after it (packages that need their own index or a source build install after the
    locked set, under its versions as constraints)."""
    plain = [p.requirement for p in packages if not p.own_step]
    reqs = [*(resolution.requirements if resolution else ()), *plain]
    flags = locked_flags(resolution, plain)
    channel = resolution.channel if resolution else ""
    specs: list[str] = []
    if kind_info(kind).conda:
        # ``python`` is the env's own (the plan's, as the create step asks for it), the one pip installs for.
        specs = conda_env_specs(recipe, python)
    return targets.inputs(
        kind,
        _python_minor(python),
        reqs,
        flags,
        channel,
        conda_channels=recipe.conda.channels,
        conda_specs=specs,
    )


def applicable_lock(
    name: str,
    lock: Optional[Lock],
    wanted: Mapping[str, Any],
    arch: Optional[str],
    *,
    locked: bool,
    warnings: list[str],
    glibc: Optional[str] = None,
) -> tuple[Optional[PlatformLock], Optional[LockStatus]]:
    """The lock's platform for this target (whose glibc is ``glibc``, None where unknown) when it still matches
    the recipe and the target runs what it holds; otherwise say why not."""
    fix = f"envbuilder lock {name} --platform {arch or 'ARCH'}"
    if lock is None:
        if locked:
            raise LockError(f"--locked, but {name} has no lock", hint=f"make one: {fix}")
        return None, None
    problem = ""
    hint = f"regenerate it: {fix}"
    platform = lock.for_arch(arch)
    if platform is not None and lock.format == "pylock":
        platform = _pylock_platform(platform, wanted, str(lock.path))
    if platform is None:
        problem = f"{lock.path} has no {arch} platform (it locks {', '.join(lock.arches()) or 'none'})"
    elif dict(platform.inputs) != dict(wanted):
        changes = "; ".join(targets.changed_inputs(platform.inputs, wanted))
        problem = (
            f"{lock.path} is stale for {name} on {arch}: the recipe now resolves differently ({changes})"
        )
    elif _too_new(platform.tag, glibc):
        problem = (
            f"{lock.path} was resolved for {platform.tag} (glibc {_tag_glibc(platform.tag)}), but the target has "
            f"glibc {glibc}: its wheels may not install or run here"
        )
        hint = f"lock it for these nodes: run `{fix}` on one of them, or set compute.glibc in the site file"
    if not problem and platform is not None:
        return for_target(platform, str(lock.path))[0], LockStatus(lock.summary(), arch, applies=True)
    if locked:
        raise LockError(problem, hint=hint)
    warnings.append(f"{problem}; building without the lock")
    return None, LockStatus(lock.summary(), arch, applies=False, reason=problem)


def _pylock_platform(platform: PlatformLock, wanted: Mapping[str, Any], where: str) -> PlatformLock:
    """A PEP 751 lock's platform. Ours (``lock --format pylock``) records its inputs: it is stale or not as our
    lock is. One from elsewhere records none: it must satisfy what the plan pins (torch's release among them), and
    then takes the plan's inputs (its markers are evaluated for them)."""
    if kind_info(str(wanted.get("kind", ""))).conda:
        raise LockError(
            f"{where} is a PEP 751 pylock.toml (wheels only), but the recipe builds a conda env",
            hint="use the recipe's own lock (`envbuilder lock NAME`) for a conda env",
        )
    if platform.inputs:
        return platform
    locked = {canonicalize_name(p.name): p.version for p in platform.packages}
    for line in wanted.get("requirements", ()):
        try:
            req = Requirement(line)
        except InvalidRequirement:  # the loader checked the recipe's; nothing here to hold the lock to
            continue
        if req.marker is not None:
            continue
        have = locked.get(canonicalize_name(req.name))
        if have is None or not req.specifier.contains(have, prereleases=True):
            found = f"{req.name} {have}" if have else f"no {req.name}"
            raise LockError(
                f"{where} has {found}, but the plan installs {line}: refused before anything is built",
                hint="lock the recipe itself (`envbuilder lock NAME --format pylock`), or fix the recipe's pins",
            )
    return replace(platform, inputs=dict(wanted))


_MANYLINUX_TAG = re.compile(r"-manylinux_(\d+)_(\d+)$")


def _tag_glibc(tag: str) -> Optional[str]:
    """The glibc a uv ``--python-platform`` such as ``x86_64-manylinux_2_36`` stands for; None for another tag (a
    conda subdir)."""
    m = _MANYLINUX_TAG.search(tag)
    return f"{m[1]}.{m[2]}" if m else None


def _too_new(tag: str, glibc: Optional[str]) -> bool:
    """Whether a platform locked for ``tag`` may hold wheels that need a newer glibc than the target's."""
    need = _tag_glibc(tag)
    if not need or not glibc:
        return False
    try:
        return Version(need) > Version(glibc)
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------------------------
# Markers, for the target


#: Marker variables whose value a lock's platform fixes: Linux nodes of its arch, CPython of its python.
_KNOWN = ("os_name", "sys_platform", "platform_system", "platform_machine", "platform_python_implementation",
          "implementation_name", "python_version", "extra")  # fmt: skip
_VARIABLE = re.compile(r"\b(" + "|".join(("python_full_version", "implementation_version", "platform_release",
                                          "platform_version", *_KNOWN)) + r")\b")  # fmt: skip
_QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")


def target_environment(arch: str, python: str) -> dict[str, str]:
    """The marker environment of ``arch`` Linux nodes running CPython ``python`` (MAJOR.MINOR; "" unknown):
    what uv's ``--python-platform`` and pip's ``--platform`` evaluate markers against, not this host."""
    return {
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": arch,
        "platform_python_implementation": "CPython",
        "implementation_name": "cpython",
        "python_version": python,
        "extra": "",
    }


#: The micro versions a lock's python (MAJOR.MINOR) may be at: uv writes ``python_full_version >= '3.10'``
#: markers, which decide for the minor when they hold for every micro.
_MICROS = range(40)


def _applies(pkg: LockedPackage, environment: Mapping[str, str], where: str) -> bool:
    """Whether ``pkg``'s marker holds for the target (for every micro version of its python, where the marker
    reads the full version); a LockError naming it where that is not decided by what the lock's platform fixes
    (a kernel release, a micro version, an unknown python)."""
    used = set(_VARIABLE.findall(_QUOTED.sub("", pkg.marker)))
    python = environment["python_version"]
    pythons = ("python_version", "python_full_version", "implementation_version")
    unknown = sorted(
        v for v in used if v in ("platform_release", "platform_version") or (v in pythons and not python)
    )
    answers = set()
    if not unknown:
        for micro in _MICROS if used & {"python_full_version", "implementation_version"} else (0,):
            full = f"{python}.{micro}"
            answers.add(Marker(pkg.marker).evaluate({**environment, "python_full_version": full,
                                                     "implementation_version": full}))  # fmt: skip
    if unknown or len(answers) != 1:
        reads = ", ".join(unknown) or "the micro version of python"
        raise LockError(
            f"{where}: {pkg.name} {pkg.version} is locked for `{pkg.marker}`, which reads {reads}: not fixed for "
            f"the target ({environment['platform_machine']}, python {python or 'unknown'}), so whether it "
            "belongs there cannot be decided",
            hint="regenerate the lock with `envbuilder lock`",
        )
    return answers.pop()


def for_target(platform: PlatformLock, where: str) -> tuple[PlatformLock, list[LockedPackage]]:
    """The platform's packages that belong on its target (their markers evaluated for it), and those that do not
    (an exact lock installs the first, every one of them, and never the second)."""
    environment = target_environment(platform.arch, str(platform.inputs.get("python", "")))
    keep: list[LockedPackage] = []
    skip: list[LockedPackage] = []
    for pkg in platform.packages:
        (keep if not pkg.marker or _applies(pkg, environment, where) else skip).append(pkg)
    return replace(platform, packages=tuple(keep)), skip


def missing(platform: PlatformLock, installed: Mapping[str, str]) -> list[str]:
    """The locked wheels (``name==version``) that ``installed`` (canonical name -> version) lacks or has at
    another version."""
    out = []
    for pkg in platform.wheels:
        have = installed.get(canonicalize_name(pkg.name))
        if have is None or Version(have) != Version(pkg.version):
            out.append(f"{pkg.name}=={pkg.version}" + (f" (found {have})" if have else ""))
    return out
