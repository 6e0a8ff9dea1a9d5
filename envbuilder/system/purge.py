"""How close the scratch purge is to an env, from the site's policy (the recipe's ``[filesystems]`` entry, recorded
in the env's plan) and the files' access times; and ``touch``, only where the site allows it.

Purges like TACC's delete *files* not accessed for N days, so the env breaks when its least recently read file
goes: the days left are N minus that file's age. (Reads on a login node may not update atime at TACC; the
estimate is then pessimistic, which is the safe side.) That file is found from the sample of least recently read
files its record keeps (envfiles: one lstat per sampled file, never a walk); a record of an earlier release,
which has none, is answered by a walk of the env.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from envbuilder.core.errors import UsageError
from envbuilder.core.structs import dataclass
from envbuilder.system import envfiles
from envbuilder.system.state import EnvRecord

DAY = 86400.0


@dataclass(frozen=True)
class PurgeStatus:
    filesystem: str
    purge_days: int
    days_left: Optional[float]  # None: the env is gone
    oldest: Optional[str]  # the least recently read file, relative to the prefix
    touch_allowed: bool
    notes: str

    def to_json(self) -> dict[str, Any]:
        return {
            "filesystem": self.filesystem,
            "purge_days": self.purge_days,
            "days_left": None if self.days_left is None else round(self.days_left, 1),
            "oldest": self.oldest,
            "touch_allowed": self.touch_allowed,
        }


def policy(record: EnvRecord) -> Optional[dict[str, Any]]:
    """The recorded file system policy, when it purges."""
    return plan_policy(record.plan or {})


def plan_policy(plan: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The file system policy of a plan (as JSON), when it purges."""
    fs = plan.get("filesystem") or {}
    return fs if fs.get("purge_days") else None


def oldest_access(prefix: Path) -> tuple[Optional[float], Optional[str]]:
    """The earliest access time of any file under ``prefix`` (symlinks themselves are not purged): a walk."""
    oldest: Optional[float] = None
    which: Optional[Path] = None
    for dirpath, _dirs, files in os.walk(prefix):
        for name in files:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            if oldest is None or st.st_atime < oldest:
                oldest, which = st.st_atime, path
    return oldest, (str(which.relative_to(prefix)) if which else None)


def status(record: EnvRecord, now: Optional[float] = None) -> Optional[PurgeStatus]:
    fs = policy(record)
    if fs is None:
        return None
    prefix = Path(record.prefix)
    days = int(fs["purge_days"])
    allowed = bool(fs.get("touch_allowed", False))
    if not prefix.is_dir():
        return PurgeStatus(fs.get("name", "?"), days, None, None, allowed, str(fs.get("notes", "")))
    if envfiles.recorded(record.files) and "oldest" in record.files:
        atime, which = envfiles.oldest_access(prefix, record.files)
    else:
        atime, which = oldest_access(prefix)
    now = time.time() if now is None else now
    left = days - (now - atime) / DAY if atime is not None else float(days)
    return PurgeStatus(fs.get("name", "?"), days, left, which, allowed, str(fs.get("notes", "")))


def touch(record: EnvRecord) -> int:
    """Set every file's access time to now (modification times untouched), where the site's policy allows it."""
    fs = policy(record)
    if fs is None:
        raise UsageError(f"{record.name} is not on a purged file system; there is nothing to refresh")
    if not fs.get("touch_allowed"):
        why = fs.get("notes") or "the site's policy does not say that refreshing access times is allowed"
        raise UsageError(
            f"{fs.get('name', 'this file system')} ({fs['purge_days']}-day purge): envbuilder will not refresh "
            f"access times to hold off the purge here ({why})",
            hint=f"back the env up instead (envbuilder backup {record.name}) and restore it when it is purged",
        )
    now = time.time()
    count = 0
    for dirpath, _dirs, files in os.walk(record.prefix):
        for name in files:
            path = Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                continue
            os.utime(path, (now, st.st_mtime))
            count += 1
    return count
