"""What a lock is for (pure): node architectures and the platform tags they install, the recipe's digest, and the
inputs a platform's resolution depends on (a lock applies while they stay equal)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from envbuilder.core.errors import LockError, did_you_mean
from envbuilder.core.kinds import kind_info
from envbuilder.lockfile.model import ARCHES

_ALIASES = {"arm64": "aarch64", "amd64": "x86_64", "x86-64": "x86_64"}
#: manylinux levels uv accepts for --python-platform (2_17 is manylinux2014).
_MANYLINUX = (17, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40)


def arch_name(text: str) -> str:
    """``x86_64`` or ``aarch64`` (``arm64``/``amd64`` accepted), or a LockError with a did-you-mean."""
    arch = _ALIASES.get(text.lower(), text.lower())
    if arch not in ARCHES:
        raise LockError(
            f"unknown platform {text!r}: expected one of {', '.join(ARCHES)}",
            hint=did_you_mean(text, ARCHES) or "e.g. --platform x86_64 --platform aarch64",
        )
    return arch


def python_platform(arch: str, glibc: Optional[str]) -> str:
    """uv's ``--python-platform`` for ``arch`` nodes whose glibc is ``glibc``: the newest manylinux level they
    run (2.28 where the glibc is not known, the level current torch wheels need)."""
    if not glibc:
        return f"{arch}-manylinux_2_28"
    try:
        minor = int(str(glibc).split(".")[1])
    except (IndexError, ValueError):
        raise LockError(
            f"cannot read glibc version {glibc!r}", hint="expected MAJOR.MINOR, e.g. 2.28"
        ) from None
    fits = [m for m in _MANYLINUX if m <= minor]
    if not fits:
        raise LockError(f"glibc {glibc} is older than manylinux2014 (2.17): no wheel installs there")
    return f"{arch}-manylinux_2_{fits[-1]}"


def recipe_sha256(data: Mapping[str, Any]) -> str:
    """The recipe's digest, the same for a recipe file and its published copy (which adds only its version)."""
    copy: dict[str, Any] = json.loads(json.dumps(data, default=str))
    recipe = copy.get("recipe")
    if isinstance(recipe, dict):
        recipe.pop("version", None)
    return hashlib.sha256(json.dumps(copy, sort_keys=True).encode()).hexdigest()


def inputs(
    kind: str,
    python: Optional[str],
    requirements: Sequence[str],
    index_flags: Sequence[str],
    channel: str,
    *,
    conda_channels: Sequence[str] = (),
    conda_specs: Sequence[str] = (),
) -> dict[str, Any]:
    """What one platform's resolution depends on: a lock applies while these stay equal."""
    out: dict[str, Any] = {
        "kind": kind,
        "python": python or "",
        "requirements": list(requirements),
        "index_flags": list(index_flags),
        "channel": channel,
    }
    if kind_info(kind).conda:
        out.update(conda_channels=list(conda_channels), conda_specs=list(conda_specs))
    return out


#: conda's platform subdir for a node architecture.
CONDA_SUBDIRS = {"x86_64": "linux-64", "aarch64": "linux-aarch64", "ppc64le": "linux-ppc64le"}


def conda_subdir(arch: Optional[str]) -> str:
    """The subdir conda packages for ``arch`` nodes come from (linux-64 where the arch is unknown)."""
    return CONDA_SUBDIRS.get(arch or "", "linux-64")


def changed_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Human lines for what differs between two inputs."""
    out = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            out.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return out
