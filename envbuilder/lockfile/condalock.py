"""conda-lock's format (pure): the unified ``conda-lock.yml`` that ``envbuilder lock --format conda-lock`` writes
beside its own lock for a conda recipe that conda-lock locked, for ``conda-lock install`` and ``conda-lock render``.

Each platform's conda packages are conda-lock's own entries for that subdir, as conda-lock wrote them (with their
md5, dependencies and categories); the pip part, which uv locked, is added as conda-lock's ``manager: pip``
entries with their sha256. The file is JSON, which is YAML: conda-lock reads it as it reads its own.
"""

from __future__ import annotations

import json
from typing import Any

from envbuilder.core.errors import LockError
from envbuilder.lockfile.model import Lock, PlatformLock
from envbuilder.lockfile.targets import conda_subdir

FILE_NAME = "conda-lock.yml"


def render(lock: Lock) -> str:
    """The platforms' conda-lock outputs joined into one file, with each platform's pip packages."""
    docs = {p.arch: _doc(p, lock) for p in lock.platforms}
    first = next(iter(docs.values()))
    meta = dict(first.get("metadata") or {})
    hashes: dict[str, Any] = {}
    packages: list[Any] = []
    for platform in lock.platforms:
        doc, subdir = docs[platform.arch], conda_subdir(platform.arch)
        hashes.update((doc.get("metadata") or {}).get("content_hash") or {})
        packages.extend(p for p in doc.get("package", []) if p.get("platform") == subdir)
        packages.extend(_pip(platform, subdir))
    meta.update(content_hash=hashes, platforms=[conda_subdir(p.arch) for p in lock.platforms])
    return json.dumps({"version": 1, "metadata": meta, "package": packages}, indent=1) + "\n"


def _doc(platform: PlatformLock, lock: Lock) -> dict[str, Any]:
    if not platform.conda_lock:
        raise LockError(
            f"{lock.recipe} was locked by {lock.engine} for {platform.arch}, not by conda-lock: there is no "
            "conda-lock file to write",
            hint="conda-lock locks where the recipe's conda (its module) is found and conda-lock is installed",
        )
    doc: dict[str, Any] = json.loads(platform.conda_lock)
    return doc


def _pip(platform: PlatformLock, subdir: str) -> list[dict[str, Any]]:
    return [
        {
            "name": pkg.name,
            "version": pkg.version,
            "manager": "pip",
            "platform": subdir,
            "dependencies": {},
            "url": pkg.files[0].url,
            "hash": {"sha256": pkg.files[0].sha256},
            "category": "main",
            "optional": False,
        }
        for pkg in platform.wheels
    ]
