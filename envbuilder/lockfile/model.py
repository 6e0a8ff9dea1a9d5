"""The lock format (pure): what a lock holds, per target platform, and how it is written as TOML.

A lock is TOML with one ``[[platform]]`` table per target (``x86_64``, ``aarch64``). Each holds the *inputs* it was
resolved from (python, requirements, indexes, channel) and the packages: name, version and every file it may be
installed from, with its sha256. ``create`` installs a platform's packages by version and hash through the plan's
own (possibly mirrored) indexes, so a lock made against download.pytorch.org installs from a site mirror too, and
a file with other bytes is refused by the installer.

The shape serves both backends. Wheel locks come from uv (``engine = "uv"``, ``source = "wheel"|"sdist"``,
``tag`` a uv ``--python-platform`` such as ``aarch64-manylinux_2_28``). Conda locks (the conda backend) fill the
same tables from conda-lock or py-rattler: ``engine = "conda-lock"|"rattler"``, ``source = "conda"``, ``tag`` the
conda subdir (``linux-aarch64``), files the package URLs with their sha256. A ``Locker`` is anything that turns
one platform's inputs into a ``PlatformLock``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any, Optional, Protocol

from envbuilder.core._toml import dumps
from envbuilder.core.structs import dataclass

LOCK_VERSION = 1
SUFFIX = ".lock.toml"
ARCHES = ("x86_64", "aarch64")
#: The engine each locker (``build/lockers.py``) records; a unit test keeps the two in step.
ENGINES = ("uv", "conda-lock", "rattler")
SOURCES = ("wheel", "sdist", "conda")


def nightly_warning(name: str) -> str:
    return (
        "this lock pins nightly wheels, which leave their index within weeks: an env rebuilt from it later will "
        f"not find them. Back the env up once it is built (envbuilder backup {name})"
    )


@dataclass(frozen=True)
class LockedFile:
    url: str
    sha256: str
    #: The file's bytes where the lock says (PEP 751's ``size``; uv writes it where the index gave it), for
    #: pre-flight's estimate; None where unknown.
    size: Optional[int] = None


@dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    source: str
    files: tuple[LockedFile, ...]
    #: conda packages: the build string (the same name and version can have several builds).
    build: str = ""
    #: A PEP 508 environment marker the resolver attached (the package is only for targets where it holds):
    #: evaluated for the target when a plan takes the lock (``plan.lockfit.for_target``), never by the installer.
    marker: str = ""

    @property
    def is_conda(self) -> bool:
        return self.source == "conda"

    def conda_spec(self) -> str:
        return f"{self.name}={self.version}={self.build}" if self.build else f"{self.name}=={self.version}"

    def requirement(self) -> str:
        """One requirements.txt line: the exact version, and every hash the installer may accept."""
        hashes = "".join(f" --hash=sha256:{f.sha256}" for f in self.files)
        return f"{self.name}=={self.version}{hashes}"


@dataclass(frozen=True)
class PlatformLock:
    arch: str
    tag: str
    inputs: Mapping[str, Any]
    packages: tuple[LockedPackage, ...]
    #: The PEP 751 file the resolver wrote for this platform (uv's pylock.toml), as it wrote it; "" where none
    #: (conda packages, a lock read back): ``envbuilder lock --format pylock`` writes it beside the lock.
    pylock: str = field(default="", compare=False)
    #: conda-lock's own lock of this platform's conda part (JSON text of its conda-lock.yml) where conda-lock
    #: made it: ``envbuilder lock --format conda-lock`` joins the platforms' into one conda-lock.yml.
    conda_lock: str = field(default="", compare=False)

    @property
    def wheels(self) -> list[LockedPackage]:
        return sorted((p for p in self.packages if not p.is_conda), key=lambda p: p.name)

    @property
    def conda(self) -> list[LockedPackage]:
        return sorted((p for p in self.packages if p.is_conda), key=lambda p: p.name)

    def requirements_txt(self) -> str:
        """The pip-installed part as hashed requirements."""
        return "".join(p.requirement() + "\n" for p in self.wheels)

    def pins(self) -> str:
        """The locked pip versions as constraints (for packages built from source after the locked set)."""
        return "".join(f"{p.name}=={p.version}\n" for p in self.wheels)

    def versions(self) -> dict[str, str]:
        return {p.name: p.version for p in self.packages}


@dataclass(frozen=True)
class Lock:
    recipe: str
    recipe_version: str
    recipe_sha256: str
    kind: str
    engine: str
    created: str
    created_by: str
    platforms: tuple[PlatformLock, ...]
    path: Optional[str] = None
    #: Where the lock was found: "--lock", "yours" (the lock directory), or "published".
    origin: str = ""
    #: What it was read from: "envbuilder" (this format) or "pylock" (a PEP 751 file, see ``reader.from_pylock_file``).
    format: str = "envbuilder"
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def arches(self) -> list[str]:
        return [p.arch for p in self.platforms]

    def for_arch(self, arch: Optional[str]) -> Optional[PlatformLock]:
        return next((p for p in self.platforms if p.arch == arch), None)

    def nightly(self) -> bool:
        return any(p.inputs.get("channel") == "nightly" for p in self.platforms)

    def to_data(self) -> dict[str, Any]:
        return {
            "lock_version": LOCK_VERSION,
            "recipe": self.recipe,
            "recipe_version": self.recipe_version,
            "recipe_sha256": self.recipe_sha256,
            "kind": self.kind,
            "engine": self.engine,
            "created": self.created,
            "created_by": self.created_by,
            "platform": [
                {
                    "arch": p.arch,
                    "tag": p.tag,
                    "inputs": dict(p.inputs),
                    "package": [
                        {
                            "name": k.name,
                            "version": k.version,
                            **({"build": k.build} if k.build else {}),
                            **({"marker": k.marker} if k.marker else {}),
                            "source": k.source,
                            "files": [_file_json(f) for f in k.files],
                        }
                        for k in p.packages
                    ],
                }
                for p in self.platforms
            ],
        }

    def dumps(self) -> str:
        head = "# envbuilder lockfile: exact packages per platform. Regenerate with `envbuilder lock`; do not edit.\n"
        return head + dumps(self.to_data())

    def content(self) -> dict[str, Any]:
        """What the lock pins, without when, by what, or for which published version it was written."""
        data = self.to_data()
        for key in ("created", "created_by", "recipe_version"):
            data.pop(key)
        return data

    def summary(self) -> LockSummary:
        return LockSummary(
            path=self.path,
            origin=self.origin,
            recipe=self.recipe,
            recipe_version=self.recipe_version,
            engine=self.engine,
            created=self.created,
            platforms={p.arch: len(p.packages) for p in self.platforms},
        )


@dataclass(frozen=True)
class LockSummary:
    """What ``show``, ``lock`` and a plan say about a lock: where it is, what made it, packages per platform."""

    path: Optional[str]
    origin: str
    recipe: str
    recipe_version: str
    engine: str
    created: str
    platforms: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "origin": self.origin,
            "recipe": self.recipe,
            "recipe_version": self.recipe_version,
            "engine": self.engine,
            "created": self.created,
            "platforms": dict(self.platforms),
        }


class Locker(Protocol):
    """Resolves one platform's inputs to its locked packages (uv for wheels; conda-lock or rattler for conda)."""

    engine: str

    def lock(self, arch: str, tag: str, inputs: Mapping[str, Any]) -> PlatformLock: ...


def _file_json(f: LockedFile) -> dict[str, Any]:
    return {"url": f.url, "sha256": f.sha256, **({"size": f.size} if f.size is not None else {})}
