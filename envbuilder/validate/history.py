"""The validation history: one JSON file per run (``historymodel.record_of``) under
``<envbuilder home>/history/<env>/<UTC time>-<host>-<pid>.json``, the newest ``KEEP`` per env.

Safe under concurrent writers on a shared file system without a lock: each run writes a file of its own (a name no
other writer takes: its host and pid), atomically (temporary file, then rename), and then removes what is past
the bound; a file another writer removed first is simply gone. Nothing here follows a symlink: the store's
directories must be real directories, a link among the runs is neither read nor removed (only unlinked names of
regular files are), and files are opened with O_NOFOLLOW. The store is private (0700 directories, 0600 files).

A site may name a shared store (the ``history_dir`` setting): the runs of envs built from published recipes go
there too, as ``<history_dir>/<user>/<recipe>/<env>/``, in directories each user owns, readable by the admin.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import stat
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from envbuilder.core.errors import StateError
from envbuilder.system import fsutil

#: Runs kept per env (older files are removed by the writer).
KEEP = 200
#: A run's record is a few KB; a bigger file is not one of ours.
MAX_BYTES = 1 << 20
DIR_MODE = 0o700
FILE_MODE = 0o600
#: The site's store: the admin reads every user's runs.
SHARED_DIR_MODE = 0o755
SHARED_FILE_MODE = 0o644
_NAME = re.compile(r"\d{8}T\d{6}\.\d{6}Z-[A-Za-z0-9._-]+-\d+\.json")
_ENV = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def store(home: Path) -> Path:
    return home / "history"


def runs(home: Path, env: str, skipped: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """The env's runs, oldest first (unreadable or foreign files left out: named in ``skipped`` where given)."""
    return read_dir(_env_dir(store(home), env), skipped)


def envs(home: Path) -> list[str]:
    """Every env with a directory of runs in the store, sorted (a link there is not one)."""
    try:
        entries = list(os.scandir(store(home)))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(e.name for e in entries if _ENV.fullmatch(e.name) and e.is_dir(follow_symlinks=False))


#: One env of the site's store: (user, recipe, env, its runs oldest first).
SiteEnvRuns = tuple[str, str, str, list[dict[str, Any]]]


def site_envs(root: Path, recipe: Optional[str] = None) -> tuple[list[SiteEnvRuns], list[tuple[str, str]]]:
    """Every env's runs in the site's store ``<root>/<user>/<recipe>/<env>/`` (only ``recipe``'s where named),
    sorted by recipe, user and env; and what was not read, as (path, why): a directory this user may not list
    (its owner keeps it private), a link (never followed), an entry that is not a store directory, a file that
    is not a readable run. Each user's directories are theirs to open or close: what is readable is read."""
    try:
        info = root.lstat()
    except FileNotFoundError:
        info = None
    if info is None or not stat.S_ISDIR(info.st_mode):
        what = "missing" if info is None else "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise StateError(
            f"the site's validation history {root} (history_dir) is {what}",
            hint="name the directory the site's envs write their runs to (history_dir, ENVBUILDER_HISTORY_DIR)",
        )
    found: list[SiteEnvRuns] = []
    skipped: list[tuple[str, str]] = []
    for user in _subdirs(root, skipped):
        recipes = _subdirs(root / user, skipped)
        for name in recipes if recipe is None else [r for r in recipes if r == recipe]:
            for env in _subdirs(root / user / name, skipped):
                directory = root / user / name / env
                bad: list[str] = []
                try:
                    runs = read_dir(directory, bad)
                except PermissionError:
                    skipped.append((str(directory), "not readable (permission denied)"))
                    continue
                skipped += [(path, "not a readable history record") for path in bad]
                found.append((user, name, env, runs))
    return sorted(found, key=lambda f: (f[1], f[0], f[2])), skipped


def _subdirs(path: Path, skipped: list[tuple[str, str]]) -> list[str]:
    """The names of the store directories in ``path``, sorted; the rest named in ``skipped``."""
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except PermissionError:
        skipped.append((str(path), "not readable (permission denied)"))
        return []
    names = []
    for entry in entries:
        if entry.is_symlink():
            skipped.append((entry.path, "a link (not followed)"))
        elif not entry.is_dir(follow_symlinks=False) or not _ENV.fullmatch(entry.name):
            skipped.append((entry.path, "not a directory of the store"))
        else:
            names.append(entry.name)
    return names


def is_env_name(name: str) -> bool:
    """Can ``name`` have runs in the store (no separator, no ``..``)?"""
    return bool(_ENV.fullmatch(name))


def append(
    home: Path, record: Mapping[str, Any], *, keep: int = KEEP, now: Optional[datetime] = None
) -> Path:
    """Write ``record`` as a new run of its env, then keep only the ``keep`` newest runs. Returns its path."""
    return append_to(store(home), record, keep=keep, now=now)


def append_to(
    root: Path, record: Mapping[str, Any], *, keep: int = KEEP, now: Optional[datetime] = None
) -> Path:
    directory = _env_dir(root, str(record.get("env") or ""))
    fsutil.mkdirs(root.parent)
    _own_dir(root, DIR_MODE)
    _own_dir(directory, DIR_MODE)
    return _write(directory, record, FILE_MODE, keep, now)


def append_shared(
    root: Path, record: Mapping[str, Any], *, user: str, keep: int = KEEP, now: Optional[datetime] = None
) -> Path:
    """Write ``record`` to the site's store (``history_dir``, which the admin made, writable by every user and
    sticky as /tmp is) as ``<root>/<user>/<recipe>/<env>/``: the user's own directories, readable by the admin
    (0755 and 0644), never another user's nor a link."""
    _checked(root)
    if not root.is_dir():
        raise StateError(
            f"the site's validation history {root} (history_dir) is not a directory",
            hint="the admin makes it, writable by every user and sticky (chmod 1777), or unsets history_dir",
        )
    user_dir = root / _safe(user, "user name")
    recipe_dir = user_dir / _safe(str(record.get("recipe") or ""), "recipe name")
    directory = _env_dir(recipe_dir, str(record.get("env") or ""))
    for path in (user_dir, recipe_dir, directory):
        _own_dir(path, SHARED_DIR_MODE)
    return _write(directory, record, SHARED_FILE_MODE, keep, now)


def _write(directory: Path, record: Mapping[str, Any], mode: int, keep: int, now: Optional[datetime]) -> Path:
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
    path = directory / f"{when.strftime('%Y%m%dT%H%M%S.%fZ')}-{host}-{os.getpid()}.json"
    fsutil.write_atomic(path, (json.dumps(record, sort_keys=True) + "\n").encode(), mode=mode)
    prune(directory, keep)
    return path


def now_text(now: Optional[datetime] = None) -> str:
    """ISO-8601 UTC, as records hold it: ``2026-11-28T11:05:25.123456+00:00``."""
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat()


def read_dir(directory: Path, skipped: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """The records of one env's directory, oldest first (by name: the UTC time leads it). Each entry named as a
    run that is not one (not a regular file, a link, not a record) is left out, its path added to ``skipped``."""
    _checked(directory)
    out = []
    for name, regular in _entries(directory):
        record = _read(directory / name) if regular else None
        if record is not None:
            out.append(record)
        elif skipped is not None:
            skipped.append(str(directory / name))
    return out


def prune(directory: Path, keep: int) -> None:
    """Remove all but the ``keep`` newest runs. Another writer may be pruning too: a file gone already is fine."""
    names = _names(directory)
    for name in names[: max(len(names) - keep, 0)]:
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()  # the name itself, never what a link leads to


def _names(directory: Path) -> list[str]:
    """The regular files named as runs are, oldest first."""
    return [name for name, regular in _entries(directory) if regular]


def _entries(directory: Path) -> list[tuple[str, bool]]:
    """(name, is a regular file) of every entry named as runs are, oldest first."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    return sorted((e.name, e.is_file(follow_symlinks=False)) for e in entries if _NAME.fullmatch(e.name))


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.EACCES):  # pruned meanwhile, a link, not ours
            return None
        raise
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        return None
    try:
        record = json.loads(data)
    except ValueError:  # a file that is not a record (a writer's temporary files are not named as runs)
        return None
    return record if isinstance(record, dict) and record.get("version") == 1 else None


def _env_dir(root: Path, env: str) -> Path:
    return root / _safe(env, "env name")


def _safe(name: str, what: str) -> str:
    if not _ENV.fullmatch(name):
        raise StateError(
            f"invalid {what} {name!r} for the validation history", hint="letters, digits, . _ + -"
        )
    return name


def _own_dir(path: Path, mode: int) -> None:
    """``path`` as a directory of this user's, made with ``mode`` if missing; a symlink, a file or another
    user's directory there is refused."""
    try:
        path.mkdir(mode=mode)
        path.chmod(mode)  # mkdir's mode is filtered by the umask
    except FileExistsError:
        pass
    _checked(path)
    if path.lstat().st_uid != os.geteuid():
        raise StateError(
            f"the validation history {path} belongs to another user",
            hint="envbuilder writes its history only into directories of your own: remove it, or ask its owner",
        )


def _checked(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        what = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise StateError(
            f"the validation history {path} is {what}",
            hint="envbuilder follows no link there: remove it, and the next validation makes the directory",
        )
