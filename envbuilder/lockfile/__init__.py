"""Lockfiles (pure): the exact packages a recipe resolves to, per target platform, with their hashes.

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

Stale locks: a lock applies to a platform when the inputs the current recipe resolves to there equal the stored
ones. A recipe edit that changes no package input (an activate variable) keeps the lock; one that does (a new
package, another torch) makes it stale, which ``create --locked`` refuses and plain ``create`` reports and ignores.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from packaging.markers import InvalidMarker, Marker
from packaging.version import InvalidVersion, Version

from envbuilder import settings
from envbuilder._toml import TOMLDecodeError, dumps, loads
from envbuilder.backends.registry import kind_info
from envbuilder.errors import LockError, did_you_mean
from envbuilder.structs import dataclass

if TYPE_CHECKING:
    from envbuilder.recipe.catalog import Catalog
    from envbuilder.recipe.loader import Recipe

LOCK_VERSION = 1
SUFFIX = ".lock.toml"
ARCHES = ("x86_64", "aarch64")
_ALIASES = {"arm64": "aarch64", "amd64": "x86_64", "x86-64": "x86_64"}
#: The engine each locker (``lockers.py``) records; a unit test keeps the two in step.
ENGINES = ("uv", "conda-lock", "rattler")
SOURCES = ("wheel", "sdist", "conda")
#: manylinux levels uv accepts for --python-platform (2_17 is manylinux2014).
_MANYLINUX = (17, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def nightly_warning(name: str) -> str:
    return (
        "this lock pins nightly wheels, which leave their index within weeks: an env rebuilt from it later will "
        f"not find them. Back the env up once it is built (envbuilder backup {name})"
    )


@dataclass(frozen=True)
class LockedFile:
    url: str
    sha256: str


@dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    source: str
    files: tuple[LockedFile, ...]
    #: conda packages: the build string (the same name and version can have several builds).
    build: str = ""
    #: A PEP 508 environment marker the resolver attached (the package is only for targets where it holds):
    #: evaluated for the target when a plan takes the lock (``applicability.for_target``), never by the installer.
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
                            "files": [{"url": f.url, "sha256": f.sha256} for f in k.files],
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


# ---------------------------------------------------------------------------------------------------------------


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


def from_pylock(text: str, where: str) -> tuple[LockedPackage, ...]:
    """The packages of a pylock.toml (PEP 751) as uv writes it."""
    try:
        doc = loads(text)
    except TOMLDecodeError as exc:
        raise LockError(f"{where}: the resolver wrote unreadable TOML: {exc}") from None
    out = []
    for pkg in doc.get("packages", []):
        files = []
        source = "wheel"
        for wheel in pkg.get("wheels", []) or []:
            files.append(LockedFile(str(wheel["url"]), str(wheel.get("hashes", {}).get("sha256", ""))))
        if not files and pkg.get("sdist"):
            source = "sdist"
            sd = pkg["sdist"]
            files.append(LockedFile(str(sd.get("url", "")), str(sd.get("hashes", {}).get("sha256", ""))))
        if not files or any(not _SHA256.match(f.sha256) for f in files):
            raise LockError(
                f"{where}: {pkg.get('name')} {pkg.get('version')} has no file with a sha256",
                hint="a package from a local path or VCS URL cannot be locked; publish it as a wheel",
            )
        marker = str(pkg.get("marker", ""))
        out.append(
            _package(
                LockedPackage(str(pkg["name"]), str(pkg["version"]), source, tuple(files), marker=marker),
                where,
            )
        )
    return tuple(out)


def from_conda_lock(doc: Any, subdir: str, where: str) -> tuple[LockedPackage, ...]:
    """The conda packages for ``subdir`` of a conda-lock.yml (version 1, already parsed). The build string is not
    a field there; it is the file name's last part (NAME-VERSION-BUILD.conda|.tar.bz2)."""
    if not isinstance(doc, Mapping) or doc.get("version") != 1 or not isinstance(doc.get("package"), list):
        raise LockError(
            f"{where}: not a conda-lock.yml of version 1", hint="update conda-lock (3.0 or newer)"
        )
    out = []
    for pkg in doc["package"]:
        if not isinstance(pkg, Mapping) or pkg.get("platform") != subdir or pkg.get("manager") != "conda":
            continue
        name, version, url = str(pkg.get("name")), str(pkg.get("version")), str(pkg.get("url") or "")
        sha = str((pkg.get("hash") or {}).get("sha256") or "")
        if not _SHA256.match(sha):
            raise LockError(
                f"{where}: {name} {version} ({subdir}) has no sha256 (the channel's repodata lists only md5)",
                hint="conda packages are locked by sha256; index the channel with a current conda-index or rattler",
            )
        stem = url.rsplit("/", 1)[-1]
        for ext in (".tar.bz2", ".conda"):
            stem = stem[: -len(ext)] if stem.endswith(ext) else stem
        prefix = f"{name}-{version}-"
        if not stem.startswith(prefix):
            raise LockError(f"{where}: {name} {version}: the file {url!r} is not named {prefix}BUILD")
        out.append(LockedPackage(name, version, "conda", (LockedFile(url, sha),), stem[len(prefix) :]))
    if not out:
        raise LockError(f"{where}: conda-lock wrote no packages for {subdir}")
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# Reading


def _need(doc: Mapping[str, Any], key: str, kind: type, where: str, table: str = "") -> Any:
    dotted = f"{table}.{key}" if table else key
    if key not in doc:
        raise LockError(f"{where}: missing key {dotted!r}", hint="regenerate it with `envbuilder lock`")
    value = doc[key]
    if not isinstance(value, kind):
        raise LockError(
            f"{where}: {dotted} must be a {kind.__name__}, found {type(value).__name__} {value!r}",
            hint="regenerate it with `envbuilder lock`",
        )
    return value


def _strict(doc: Mapping[str, Any], allowed: Sequence[str], where: str, table: str) -> None:
    for key in doc:
        if key not in allowed:
            raise LockError(
                f"{where}: unknown key {(table + '.' if table else '') + key!r}",
                hint=did_you_mean(key, allowed) or f"expected {', '.join(allowed)}",
            )


_TOP = (
    "lock_version",
    "recipe",
    "recipe_version",
    "recipe_sha256",
    "kind",
    "engine",
    "created",
    "created_by",
)
_PLATFORM = ("arch", "tag", "inputs", "package")
_PACKAGE = ("name", "version", "build", "marker", "source", "files")
_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
#: A conda version or build string: no spaces, no requirement or marker syntax.
_CONDA_WORD = re.compile(r"^[A-Za-z0-9_.+!*-]+$")


def parse(text: str, where: str) -> Lock:
    try:
        doc = loads(text)
    except TOMLDecodeError as exc:
        raise LockError(f"{where}: not valid TOML: {exc}") from None
    _strict(doc, (*_TOP, "platform"), where, "")
    version = _need(doc, "lock_version", int, where)
    if version != LOCK_VERSION:
        raise LockError(
            f"{where}: lock_version {version} is not one this envbuilder reads ({LOCK_VERSION})",
            hint="regenerate it with this envbuilder's `envbuilder lock`",
        )
    engine = _need(doc, "engine", str, where)
    if engine not in ENGINES:
        raise LockError(f"{where}: engine {engine!r} is not one of {', '.join(ENGINES)}")
    platforms = []
    for i, raw in enumerate(_need(doc, "platform", list, where)):
        table = f"platform[{i}]"
        if not isinstance(raw, dict):
            raise LockError(f"{where}: {table} must be a table")
        _strict(raw, _PLATFORM, where, table)
        arch = _need(raw, "arch", str, where, table)
        if arch not in ARCHES:
            raise LockError(f"{where}: {table}.arch {arch!r} is not one of {', '.join(ARCHES)}")
        packages = []
        for j, pkg in enumerate(raw.get("package", [])):
            ptable = f"{table}.package[{j}]"
            _strict(pkg, _PACKAGE, where, ptable)
            files = []
            for f in _need(pkg, "files", list, where, ptable):
                sha = str(f.get("sha256", "")) if isinstance(f, dict) else ""
                if not _SHA256.match(sha):
                    raise LockError(
                        f"{where}: {ptable}.files has an entry without a valid sha256",
                        hint="regenerate it with `envbuilder lock`",
                    )
                files.append(LockedFile(str(f.get("url", "")), sha))
            source = _need(pkg, "source", str, where, ptable)
            if source not in SOURCES:
                raise LockError(f"{where}: {ptable}.source {source!r} is not one of {', '.join(SOURCES)}")
            packages.append(
                _package(
                    LockedPackage(
                        _need(pkg, "name", str, where, ptable),
                        _need(pkg, "version", str, where, ptable),
                        source,
                        tuple(files),
                        str(pkg.get("build", "")),
                        str(pkg.get("marker", "")),
                    ),
                    f"{where}: {ptable}",
                )
            )
        platforms.append(
            PlatformLock(
                arch,
                _need(raw, "tag", str, where, table),
                dict(_need(raw, "inputs", dict, where, table)),
                tuple(packages),
            )
        )
    return Lock(
        recipe=_need(doc, "recipe", str, where),
        recipe_version=str(doc.get("recipe_version", "")),
        recipe_sha256=_need(doc, "recipe_sha256", str, where),
        kind=_need(doc, "kind", str, where),
        engine=engine,
        created=str(doc.get("created", "")),
        created_by=str(doc.get("created_by", "")),
        platforms=tuple(platforms),
        path=where,
    )


def _package(pkg: LockedPackage, where: str) -> LockedPackage:
    """``pkg`` as parsed, when its name, version and marker are each what the key says: a marker or an option
    smuggled into a name or version would reach the installer's requirement line, which then skips the package
    (or does what the option says) and exits 0."""
    fix = "regenerate it with `envbuilder lock`"
    if not (_CONDA_WORD if pkg.is_conda else _NAME).match(pkg.name):  # conda names may start with _
        raise LockError(f"{where}: name {pkg.name!r} is not a package name", hint=fix)
    if pkg.is_conda:
        if not _CONDA_WORD.match(pkg.version) or (pkg.build and not _CONDA_WORD.match(pkg.build)):
            raise LockError(
                f"{where}: {pkg.name} {pkg.version!r} {pkg.build!r} is not a conda version", hint=fix
            )
    else:
        try:
            Version(pkg.version)
        except InvalidVersion:
            raise LockError(
                f"{where}: {pkg.name}'s version {pkg.version!r} is not a version (expected an exact PEP 440 "
                "version; an environment marker goes in `marker`)",
                hint=fix,
            ) from None
    if pkg.marker:
        try:
            Marker(pkg.marker)
        except InvalidMarker as exc:
            raise LockError(
                f"{where}: {pkg.name}'s marker {pkg.marker!r} is not a PEP 508 marker ({exc})"
            ) from None
    return pkg


def read(path: Path, origin: str = "") -> Lock:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LockError(f"cannot read lockfile {path}: {exc.strerror or exc}") from None
    lock = parse(text, str(path))
    return replace(lock, origin=origin)


def user_path(home: Path, name: str) -> Path:
    """Where ``envbuilder lock NAME`` writes by default (beside the env records: $WORK is not purged)."""
    return settings.lockfiles_dir(home) / f"{name}{SUFFIX}"


def find(
    recipe: Recipe, catalog: Catalog, env: Mapping[str, str], explicit: Optional[str] = None
) -> Optional[Lock]:
    """The lock ``create`` uses: ``--lock FILE``, else yours (``envbuilder lock NAME`` wrote it), else the one
    published with the recipe's registry version (verified like the recipe)."""
    if explicit:
        return read(Path(explicit).expanduser(), "--lock")
    mine = user_path(settings.home(env), recipe.name)
    if mine.is_file():
        return read(mine, "yours")
    entry = catalog.entries.get(recipe.name)
    if recipe.version:
        entry = catalog.lookup(f"{recipe.name}@{recipe.version}")
    if entry is not None and entry.published is not None and entry.layer.registry is not None:
        return entry.layer.registry.verify_lock(entry.published)
    return None
