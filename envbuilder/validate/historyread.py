"""Reading the validation history store, for ``envbuilder report``: one JSON file per run under
``<home>/history/<env name>/<UTC time>-<host>-<pid>.json`` (the store's writer and its bound are
``validate.history``'s; this reader only reads). A file that is not a record (not JSON, not an object, a
symlink, larger than a record can be) is left out and named, never an error; nothing is followed through a
symbolic link."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any, Optional

from envbuilder.core.errors import UsageError

#: The newest runs read per env (the store keeps as many).
KEEP = 200

#: A run's record is a few kilobytes; a file far larger is not one.
_MAX_BYTES = 4 * 1024 * 1024


def store(home: Path) -> Path:
    return home / "history"


def env_dir(home: Path, env: str) -> Path:
    """The directory of ``env``'s runs; a name that would leave the store (a separator, ``..``) is refused."""
    if not env or env in (".", "..") or "/" in env or "\0" in env:
        raise UsageError(f"{env!r} is not an env name", hint="env names hold no '/' and are not '.' or '..'")
    return store(home) / env


def envs(home: Path) -> list[str]:
    """Every env with a directory of runs in the store, sorted."""
    try:
        entries = list(os.scandir(store(home)))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))


def runs(home: Path, env: str, skipped: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """``env``'s newest KEEP records, oldest first (file names start with the run's UTC time). The path of each
    file left out is appended to ``skipped`` where one is given."""
    where = env_dir(home, env)
    try:
        names = sorted(
            p.name for p in where.iterdir() if p.name.endswith(".json") and not p.name.startswith(".")
        )
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names[-KEEP:]:
        record = _read(where / name)
        if record is None:
            if skipped is not None:
                skipped.append(str(where / name))
            continue
        out.append(record)
    return out


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT, errno.EACCES, errno.EPERM):
            return None  # a symlink, a file a pruning writer just removed, another user's
        raise
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(_MAX_BYTES + 1)
    except IsADirectoryError:
        return None
    if len(data) > _MAX_BYTES:
        return None
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None
