"""Pure parts of planning that concern locks and conda channels: what a lock for a target must have been resolved
from, whether a given lock applies, and the gate on PyTorch's conda channel."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from envbuilder import lockfile
from envbuilder.errors import LockError, ResolverError, ResolverErrors
from envbuilder.plan.steps import conda_env_specs, locked_flags, special
from envbuilder.resolver.wheels import Resolution

if TYPE_CHECKING:  # only named: loader reaches the registry (ssh-keygen), which a pure module must not import
    from envbuilder.recipe.loader import Recipe

_PYTORCH_CHANNELS = ("pytorch", "pytorch-nightly")
_CONDA_TORCH = re.compile(r"^(pytorch|torchvision|torchaudio|pytorch-cuda)(?:[=<>!~ ]+\s*([0-9][^,\s]*))?")


def conda_pytorch_gate(recipe: Recipe) -> None:
    """PyTorch's own conda channel stopped with 2.5 (deprecated, no 2.6 builds): refuse what would need it."""
    channels = [
        c
        for c in recipe.get("conda.channels", []) or []
        if c.rstrip("/").rsplit("/", 1)[-1] in _PYTORCH_CHANNELS
    ]
    wanted = [m for m in (_CONDA_TORCH.match(p) for p in recipe.get("conda.packages", []) or []) if m]
    if not channels and not wanted:
        return
    versions: list[Optional[str]] = [m.group(2) for m in wanted if m.group(1) == "pytorch"]
    if recipe.get("torch.install"):
        versions.append(str(recipe.get("torch.version")))
    if all(v and v != "latest" and not _at_least(v, (2, 6)) for v in versions or [None]):
        return
    source = ", ".join([*(f"channel {c}" for c in channels), *(m.group(0) for m in wanted)])
    raise ResolverErrors(
        [
            ResolverError(
                f"{recipe.name} asks for torch through PyTorch's conda channel ({source}), which was deprecated "
                "with 2.5 and has no builds from 2.6 on",
                gate="conda-pytorch-channel",
                hint="drop pytorch from conda.channels and conda.packages; set torch.install = true so torch comes "
                "from the wheel index, installed with pip inside the env",
            )
        ]
    )


def _at_least(version: str, minimum: tuple[int, int]) -> bool:
    parts = re.findall(r"\d+", version)[:2]
    return len(parts) < 2 or (int(parts[0]), int(parts[1])) >= minimum


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
