"""Reading locks (pure but for the one file ``read`` is given): a lock file parsed and checked key by key, the
packages a resolver wrote (uv's pylock.toml, conda-lock's yml), and where a user's own lock goes. Which lock
``create`` uses (``--lock``, the user's, the published one) is ``recipe.catalog.find_lock``'s: it needs the catalog.

Stale locks: a lock applies to a platform when the inputs the current recipe resolves to there equal the stored
ones. A recipe edit that changes no package input (an activate variable) keeps the lock; one that does (a new
package, another torch) makes it stale, which ``create --locked`` refuses and plain ``create`` reports and ignores.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from packaging.markers import InvalidMarker, Marker
from packaging.version import InvalidVersion, Version

from envbuilder.core import settings
from envbuilder.core._toml import TOMLDecodeError, loads
from envbuilder.core.errors import LockError, did_you_mean
from envbuilder.lockfile import pylock
from envbuilder.lockfile.model import (
    ARCHES,
    ENGINES,
    LOCK_VERSION,
    SOURCES,
    SUFFIX,
    Lock,
    LockedFile,
    LockedPackage,
    PlatformLock,
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def from_pylock(text: str, where: str) -> tuple[LockedPackage, ...]:
    """The packages of a pylock.toml (PEP 751), as uv writes it or a user hands it in."""
    try:
        doc = loads(text)
    except TOMLDecodeError as exc:
        raise LockError(f"{where}: the resolver wrote unreadable TOML: {exc}") from None
    return _pylock_packages(doc, where)


def _pylock_packages(doc: Mapping[str, Any], where: str) -> tuple[LockedPackage, ...]:
    raw = doc.get("packages", [])
    if not isinstance(raw, list) or not all(isinstance(pkg, dict) for pkg in raw):
        raise LockError(f"{where}: packages must be an array of tables (PEP 751)")
    out = []
    for pkg in raw:
        if not isinstance(pkg.get("name"), str) or not isinstance(pkg.get("version"), str):
            raise LockError(
                f"{where}: every package needs a name and an exact version (a package without a version, "
                "from a directory or VCS, cannot be locked by hash)"
            )
        files = []
        source = "wheel"
        for wheel in pkg.get("wheels", []) or []:
            files.append(_pylock_file(wheel))
        if not files and isinstance(pkg.get("sdist"), dict):
            source = "sdist"
            files.append(_pylock_file(pkg["sdist"]))
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


def _pylock_file(entry: Any) -> LockedFile:
    """A wheel's or sdist's url and sha256 ("" where it lacks one: the caller refuses it)."""
    if not isinstance(entry, dict):
        return LockedFile("", "")
    hashes = entry.get("hashes")
    return LockedFile(
        str(entry.get("url", "")),
        str(hashes.get("sha256", "")) if isinstance(hashes, dict) else "",
        _size(entry),
    )


def _size(entry: Mapping[str, Any]) -> Optional[int]:
    """A file's ``size`` where it is a byte count (anything else is no size: it only feeds an estimate)."""
    size = entry.get("size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


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
    if pylock.is_pylock(doc):
        return pylock.lock_from(doc, _pylock_packages(doc, where), where)
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
    platforms = [
        _platform(raw, where, f"platform[{i}]") for i, raw in enumerate(_need(doc, "platform", list, where))
    ]
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


def _platform(raw: Any, where: str, table: str) -> PlatformLock:
    """One ``[[platform]]`` table, checked key by key."""
    if not isinstance(raw, dict):
        raise LockError(f"{where}: {table} must be a table")
    _strict(raw, _PLATFORM, where, table)
    arch = _need(raw, "arch", str, where, table)
    if arch not in ARCHES:
        raise LockError(f"{where}: {table}.arch {arch!r} is not one of {', '.join(ARCHES)}")
    packages = [
        _locked_package(pkg, where, f"{table}.package[{j}]") for j, pkg in enumerate(raw.get("package", []))
    ]
    return PlatformLock(
        arch,
        _need(raw, "tag", str, where, table),
        dict(_need(raw, "inputs", dict, where, table)),
        tuple(packages),
    )


def _locked_package(pkg: Mapping[str, Any], where: str, ptable: str) -> LockedPackage:
    """One ``[[platform.package]]`` entry: every file with a valid sha256, a known source."""
    _strict(pkg, _PACKAGE, where, ptable)
    files = []
    for f in _need(pkg, "files", list, where, ptable):
        sha = str(f.get("sha256", "")) if isinstance(f, dict) else ""
        if not _SHA256.match(sha):
            raise LockError(
                f"{where}: {ptable}.files has an entry without a valid sha256",
                hint="regenerate it with `envbuilder lock`",
            )
        files.append(LockedFile(str(f.get("url", "")), sha, _size(f)))
    source = _need(pkg, "source", str, where, ptable)
    if source not in SOURCES:
        raise LockError(f"{where}: {ptable}.source {source!r} is not one of {', '.join(SOURCES)}")
    return _package(
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
