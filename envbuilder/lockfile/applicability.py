"""Whether a lock applies (pure): what a lock for a target must have been resolved from, and whether a given lock
still matches the recipe."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from envbuilder import lockfile
from envbuilder.errors import LockError
from envbuilder.plan.steps import conda_env_specs, locked_flags, special
from envbuilder.resolver.wheels import Resolution

if TYPE_CHECKING:  # only a type here: the recipe arrives loaded
    from envbuilder.recipe.loader import Recipe


def _python_minor(version: Optional[str]) -> str:
    return ".".join(str(version or "").split(".")[:2])


def lock_inputs(
    kind: str,
    python: Optional[str],
    resolution: Optional[Resolution],
    packages: Sequence[Mapping[str, Any]],
    recipe: Recipe,
) -> dict[str, Any]:
    """The resolution a lock for this target records: torch's pins and the recipe's plain packages, through
    torch's index first and PyPI after it (packages that need their own index or a source build install after the
    locked set, under its versions as constraints)."""
    plain = [p.get("spec", p["name"]) for p in packages if not special(p)]
    reqs = [*(resolution.requirements if resolution else ()), *plain]
    flags = locked_flags(resolution, plain)
    channel = resolution.channel if resolution else ""
    specs: list[str] = []
    if kind == "conda":
        # The env's own python (the recipe's, as the create step asks for it) is the one pip installs for.
        python = recipe.get("python.version") or "3.12"
        specs = conda_env_specs(recipe, str(python))
    conda_channels = list(recipe.get("conda.channels", []) or [])
    return lockfile.inputs(kind, _python_minor(python), reqs, flags, channel, conda_channels, specs)


def applicable_lock(
    name: str,
    lock: Optional[lockfile.Lock],
    wanted: Mapping[str, Any],
    arch: Optional[str],
    locked: bool,
    warnings: list[str],
) -> tuple[Optional[lockfile.PlatformLock], Optional[dict[str, Any]]]:
    """The lock's platform for this target when it still matches the recipe; otherwise say why not."""
    fix = f"envbuilder lock {name} --platform {arch or 'ARCH'}"
    if lock is None:
        if locked:
            raise LockError(f"--locked, but {name} has no lock", hint=f"make one: {fix}")
        return None, None
    summary = {**lock.summary(), "arch": arch, "status": "applies"}
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
        return platform, summary
    if locked:
        raise LockError(problem, hint=f"regenerate it: {fix}")
    warnings.append(f"{problem}; building without the lock")
    return None, {**summary, "status": "ignored", "reason": problem}
