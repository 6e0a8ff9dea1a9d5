"""PEP 751 lock files (pure): the ``pylock.ARCH.toml`` that ``envbuilder lock --format pylock`` writes beside its
own lock, for uv and pip to install, and a ``pylock.toml`` taken as a lock (``create --lock pylock.toml``).

A platform's file is the one uv wrote while locking it, as uv wrote it, plus a ``[tool.envbuilder]`` table (PEP 751
leaves ``[tool]`` to the tools; uv ignores it) with what the standard format cannot hold: the recipe, its digest,
the platform and the inputs it was resolved from, so a pylock read back is checked for staleness as our own lock
is. A pylock from elsewhere has no such table: it is taken as is, for the architectures its wheels are built for
(any, where all are pure), and the plan checks that it satisfies the recipe's pins (torch's build among them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envbuilder.core._toml import dumps
from envbuilder.core.errors import LockError
from envbuilder.lockfile.model import ARCHES, Lock, LockedPackage, PlatformLock

FORMAT = "pylock"
#: The lock-version this reads (PEP 751: a reader refuses a major version it does not know).
MAJOR = "1"
TOOL = "envbuilder"


def file_name(arch: str) -> str:
    """PEP 751's named form, ``pylock.NAME.toml``, one per platform."""
    return f"pylock.{arch}.toml"


def is_pylock(doc: Mapping[str, Any]) -> bool:
    return "lock-version" in doc and "lock_version" not in doc


def render(lock: Lock, platform: PlatformLock) -> str:
    """``platform``'s PEP 751 file: uv's, else one written from its packages; with envbuilder's tool table."""
    body = platform.pylock or _from_packages(lock, platform)
    tool = {
        "recipe": lock.recipe,
        "recipe_sha256": lock.recipe_sha256,
        "kind": lock.kind,
        "arch": platform.arch,
        "tag": platform.tag,
        "inputs": dict(platform.inputs),
    }
    return body.rstrip("\n") + "\n\n" + dumps({"tool": {TOOL: tool}})


def _from_packages(lock: Lock, platform: PlatformLock) -> str:
    packages = []
    for pkg in platform.wheels:
        entry: dict[str, Any] = {"name": pkg.name, "version": pkg.version}
        if pkg.marker:
            entry["marker"] = pkg.marker
        files = [
            {"url": f.url, **({"size": f.size} if f.size is not None else {}), "hashes": {"sha256": f.sha256}}
            for f in pkg.files
        ]
        if pkg.source == "sdist":
            entry["sdist"] = files[0]
        else:
            entry["wheels"] = files
        packages.append(entry)
    return dumps({"lock-version": "1.0", "created-by": lock.created_by or "envbuilder", "packages": packages})


def lock_from(doc: Mapping[str, Any], packages: tuple[LockedPackage, ...], where: str) -> Lock:
    """The lock a PEP 751 file (``doc``, its packages already read) stands for."""
    version = str(doc.get("lock-version", ""))
    if version.split(".", maxsplit=1)[0] != MAJOR:
        raise LockError(
            f"{where}: lock-version {version!r} is not one this envbuilder reads (1.x)",
            hint="write it with a tool that speaks PEP 751's version 1.0 (uv, pip)",
        )
    tool = (doc.get("tool") or {}).get(TOOL)
    if isinstance(tool, Mapping):
        return _ours(doc, tool, packages, where)
    platforms = tuple(PlatformLock(arch, "", {}, packages) for arch in _arches(packages))
    return Lock(
        recipe="",
        recipe_version="",
        recipe_sha256="",
        kind="",
        engine="uv",
        created="",
        created_by=str(doc.get("created-by", "")),
        platforms=platforms,
        path=where,
        format=FORMAT,
    )


def _ours(
    doc: Mapping[str, Any], tool: Mapping[str, Any], packages: tuple[LockedPackage, ...], where: str
) -> Lock:
    for key, kind in (("recipe", str), ("arch", str), ("tag", str), ("inputs", dict)):
        if not isinstance(tool.get(key), kind):
            raise LockError(
                f"{where}: tool.{TOOL}.{key} must be a {kind.__name__}, found {tool.get(key)!r}",
                hint="regenerate it with `envbuilder lock --format pylock`, or drop the [tool.envbuilder] table",
            )
    if tool["arch"] not in ARCHES:
        raise LockError(f"{where}: tool.{TOOL}.arch {tool['arch']!r} is not one of {', '.join(ARCHES)}")
    return Lock(
        recipe=tool["recipe"],
        recipe_version="",
        recipe_sha256=str(tool.get("recipe_sha256", "")),
        kind=str(tool.get("kind", "")),
        engine="uv",
        created="",
        created_by=str(doc.get("created-by", "")),
        platforms=(PlatformLock(tool["arch"], tool["tag"], dict(tool["inputs"]), packages),),
        path=where,
        format=FORMAT,
    )


def _arches(packages: tuple[LockedPackage, ...]) -> tuple[str, ...]:
    """The architectures the wheels are built for (a wheel's platform tag, its file name's last part); every
    one where all are pure."""
    found: set[str] = set()
    for pkg in packages:
        for f in pkg.files:
            name = f.url.rsplit("/", 1)[-1]
            if name.endswith(".whl"):
                tag = name[: -len(".whl")].rsplit("-", 1)[-1]
                found.update(arch for arch in ARCHES if arch in tag)
    return tuple(a for a in ARCHES if a in found) or ARCHES
