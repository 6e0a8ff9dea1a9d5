"""Whether a lock applies (pure): what a lock for a target must have been resolved from, and whether a given lock
still matches the recipe."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from envbuilder import lockfile
from envbuilder.backends.registry import kind_info
from envbuilder.errors import LockError
from envbuilder.plan.steps import conda_env_specs, locked_flags
from envbuilder.resolver.wheels import Resolution
from envbuilder.structs import dataclass

if TYPE_CHECKING:  # only a type here: the recipe arrives loaded
    from envbuilder.recipe.loader import Recipe
    from envbuilder.recipe.sections import Package


@dataclass(frozen=True)
class LockStatus:
    """The lock a plan found, and whether it applies to the target (``reason`` says why not)."""

    summary: lockfile.LockSummary
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
        # The env's own python (the recipe's, as the create step asks for it) is the one pip installs for.
        python = recipe.python.conda_version
        specs = conda_env_specs(recipe)
    return lockfile.inputs(
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
    lock: Optional[lockfile.Lock],
    wanted: Mapping[str, Any],
    arch: Optional[str],
    *,
    locked: bool,
    warnings: list[str],
) -> tuple[Optional[lockfile.PlatformLock], Optional[LockStatus]]:
    """The lock's platform for this target when it still matches the recipe; otherwise say why not."""
    fix = f"envbuilder lock {name} --platform {arch or 'ARCH'}"
    if lock is None:
        if locked:
            raise LockError(f"--locked, but {name} has no lock", hint=f"make one: {fix}")
        return None, None
    problem = ""
    platform = lock.for_arch(arch)
    if platform is None:
        problem = f"{lock.path} has no {arch} platform (it locks {', '.join(lock.arches()) or 'none'})"
    elif dict(platform.inputs) != dict(wanted):
        changes = "; ".join(lockfile.changed_inputs(platform.inputs, wanted))
        problem = (
            f"{lock.path} is stale for {name} on {arch}: the recipe now resolves differently ({changes})"
        )
    if not problem:
        return platform, LockStatus(lock.summary(), arch, applies=True)
    if locked:
        raise LockError(problem, hint=f"regenerate it: {fix}")
    warnings.append(f"{problem}; building without the lock")
    return None, LockStatus(lock.summary(), arch, applies=False, reason=problem)
