"""The backups under a backup root (see envbuilder.backup for the layout): what one is, listing them without
following a planted symlink, finding one by env name or id, and reading its files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from envbuilder.core.errors import BackupError
from envbuilder.core.structs import dataclass
from envbuilder.system import removal, state

BACKUP_VERSION = 1


def checksum(data: Mapping[str, Any]) -> str:
    body = {k: v for k, v in data.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Backup:
    root: Path
    path: Path
    data: Mapping[str, Any]
    verified: Optional[Mapping[str, Any]]
    error: Optional[str] = None

    @property
    def env(self) -> str:
        return self.path.parent.name

    @property
    def stamp(self) -> str:
        return self.path.name

    @property
    def id(self) -> str:
        return f"{self.env}@{self.stamp}"

    @property
    def mode(self) -> str:
        return str(self.data.get("mode", "?"))

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "env": self.env,
            "mode": self.mode,
            "created": self.data.get("created"),
            "prefix": self.data.get("prefix"),
            "bytes": self.data.get("bytes"),
            "new_bytes": self.data.get("new_bytes"),
            "packages": len(self.data.get("wheels", ())),
            "verified": dict(self.verified) if self.verified else None,
            "path": str(self.path),
            "error": self.error,
        }


def load(root: Path, path: Path) -> Backup:
    rel = path.relative_to(root).as_posix()
    verified = None
    with contextlib.suppress(OSError, ValueError):
        verified = json.loads(read(root, f"{rel}/verify.json"))
    try:
        data = json.loads(read(root, f"{rel}/backup.json"))
    except OSError as exc:
        return Backup(root, path, {}, verified, f"backup.json is unreadable: {exc.strerror}")
    except ValueError as exc:
        return Backup(root, path, {}, verified, f"backup.json is unreadable: {exc}")
    if not isinstance(data, dict) or data.get("version") != BACKUP_VERSION:
        return Backup(root, path, {}, verified, f"backup.json has format {data.get('version')!r}")
    if data.get("checksum") != checksum(data):
        return Backup(
            root, path, data, verified, "backup.json does not match its checksum (changed or damaged)"
        )
    return Backup(root, path, data, verified)


def read(root: Path, rel: str) -> bytes:
    """A file of the backup root, read only if envbuilder could have written it (no symlink on the way)."""
    with removal.open_below(root, rel) as fh:
        return fh.read()


def backups(root: Path, env: Optional[str] = None) -> list[Backup]:
    """Complete backups, oldest first (partial ones, named with a leading dot, are not backups)."""
    return listing(root, env)[0]


def listing(root: Path, env: Optional[str] = None) -> tuple[list[Backup], list[str]]:
    """Complete backups, oldest first, and what was skipped, in words: a symlink where the ``envs`` directory, an
    env's directory or a backup should be (the root itself may be a link: the user's choice). Nothing a link
    planted in the root points to is listed or read."""
    skipped: list[str] = []
    found = []
    for env_dir in _directories(
        root / "envs", "a directory of backups envbuilder wrote", skipped, env, top=True
    ):
        for path in _directories(env_dir, "a backup envbuilder wrote", skipped):
            if os.path.lexists(path / "backup.json"):
                found.append(load(root, path))
    return sorted(found, key=lambda b: (b.stamp, b.env)), skipped


def _directories(
    base: Path, what: str, skipped: list[str], only: Optional[str] = None, top: bool = False
) -> list[Path]:
    """The directories in ``base`` (none named with a leading dot; ``only`` that one if given), sorted, none
    followed through a symlink: a link is named in ``skipped``. With ``top``, ``base`` itself is checked too."""
    if top and base.is_symlink():
        skipped.append(_skip(base, what))
        return []
    try:
        with os.scandir(base) as listed:
            entries = sorted(listed, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(".") or only not in (None, entry.name):
            continue
        if entry.is_symlink():
            skipped.append(_skip(Path(entry.path), what))
        elif entry.is_dir(follow_symlinks=False):
            found.append(Path(entry.path))
    return found


def _skip(path: Path, what: str) -> str:
    with contextlib.suppress(OSError):
        return f"{path} is a symlink (to {path.readlink()}), not {what}; skipped it"
    return f"{path} is a symlink, not {what}; skipped it"


def _because(skipped: Sequence[str]) -> str:
    return f" ({'; '.join(skipped)})" if skipped else ""


def find(root: Path, what: str, backup_id: Optional[str] = None) -> Backup:
    """``what`` is an env name (its newest backup, or ``backup_id``) or a backup id ``NAME@STAMP``."""
    if "@" in what and backup_id is None:
        what, backup_id = what.split("@", 1)
    state.record_path(root, what)  # validates the name
    mine, skipped = listing(root, what)
    if backup_id is not None:
        stamp = backup_id.split("@", 1)[1] if "@" in backup_id else backup_id
        for b in mine:
            if b.stamp == stamp:
                return b
        raise BackupError(
            f"no backup {what}@{stamp} in {root}" + _because(skipped),
            hint=f"envbuilder backups {what}" if mine else "envbuilder backups",
        )
    if not mine:
        others = sorted({b.env for b in backups(root)})
        from envbuilder.core.errors import did_you_mean  # noqa: PLC0415 - only on this error path

        raise BackupError(
            f"no backup of {what!r} in {root}" + _because(skipped),
            hint=did_you_mean(what, others) or f"envbuilder backup {what} makes one",
        )
    return mine[-1]
