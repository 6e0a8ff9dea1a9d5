"""Env records and locks. Records live outside $SCRATCH (they must survive the purge); every write is atomic
(temp file in the same directory, fsync, rename) and nothing is created world-writable.

The lock works where flock does not (Lustre, NFS): ``mkdir`` of a lock directory is atomic everywhere, and an
owner file says who holds it (pid, host, time). A lock whose owner process is gone from this host is stale and
is broken; one held from another host is broken only after ``STALE_AFTER_S`` (its process cannot be checked).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder.errors import StateError

RECORD_VERSION = 1
STALE_AFTER_S = 24 * 3600
FILE_MODE = 0o644
DIR_MODE = 0o755


def home(env: Mapping[str, str]) -> Path:
    """Where records live: $ENVBUILDER_HOME, else $WORK/.envbuilder (not purged), else ~/.envbuilder."""
    if env.get("ENVBUILDER_HOME"):
        return Path(env["ENVBUILDER_HOME"])
    if env.get("WORK"):
        return Path(env["WORK"]) / ".envbuilder"
    return Path(env.get("HOME") or Path.home()) / ".envbuilder"


def _mkdir(path: Path) -> None:
    """mkdir -p, where every directory it creates is not world-writable, whatever the umask."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process may create it first
            directory.mkdir(mode=DIR_MODE)
        mode = directory.stat().st_mode & 0o777
        if mode & 0o002:
            directory.chmod(mode & ~0o002)


def write_atomic(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a part."""
    _mkdir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.chmod(mode)  # O_CREAT's mode is filtered by the umask; set it exactly
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@dataclass(frozen=True)
class EnvRecord:
    name: str
    recipe: str
    recipe_digest: str
    prefix: str
    created: str
    plan: Mapping[str, Any] = field(default_factory=dict)
    facts: Mapping[str, Any] = field(default_factory=dict)
    packages: tuple[Mapping[str, Any], ...] = ()
    tools: Mapping[str, str] = field(default_factory=dict)
    validation: Optional[Mapping[str, Any]] = None
    modules: Mapping[str, Any] = field(default_factory=dict)
    #: Set by restore: the backup the env came from.
    origin: Mapping[str, Any] = field(default_factory=dict)
    version: int = RECORD_VERSION

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["packages"] = list(self.packages)
        return data


def record_path(root: Path, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise StateError(f"invalid env name {name!r}", hint="names are recipe names: letters, digits, . _ -")
    return root / "envs" / f"{name}.json"


def save(root: Path, record: EnvRecord) -> Path:
    path = record_path(root, record.name)
    write_atomic(path, (json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n").encode())
    return path


def load(root: Path, name: str) -> EnvRecord:
    path = record_path(root, name)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StateError(f"no env named {name!r} is recorded in {root}", hint="envbuilder list") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise StateError(
            f"the record {path} is unreadable: {exc}", hint="remove it and create the env again"
        ) from None
    version = data.get("version") if isinstance(data, dict) else None
    if version != RECORD_VERSION:
        raise StateError(
            f"the record {path} has format version {version!r}; this envbuilder reads {RECORD_VERSION}",
            hint="upgrade envbuilder" if isinstance(version, int) and version > RECORD_VERSION else None,
        )
    fields = {k: v for k, v in data.items() if k in EnvRecord.__dataclass_fields__}
    fields["packages"] = tuple(fields.get("packages", ()))
    return EnvRecord(**fields)


def names(root: Path) -> list[str]:
    """Recorded env names (temp files of interrupted writes are not records)."""
    envs = root / "envs"
    if not envs.is_dir():
        return []
    return sorted(p.stem for p in envs.glob("*.json") if not p.name.startswith("."))


# ---------------------------------------------------------------------------------------------------------------
# Locks


@dataclass(frozen=True)
class Owner:
    pid: int
    host: str
    since: float

    @classmethod
    def me(cls) -> Owner:
        return cls(os.getpid(), socket.gethostname(), time.time())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EnvLock:
    """An exclusive lock on one env, usable as a context manager."""

    def __init__(
        self,
        path: Path,
        timeout: float = 0,
        poll: float = 0.2,
        on_wait: Optional[Callable[[Owner], None]] = None,
    ) -> None:
        self.path = path
        self.timeout = timeout
        self.poll = poll
        self.on_wait = on_wait
        self.owner: Optional[Owner] = None

    def _read_owner(self) -> Optional[Owner]:
        try:
            data = json.loads((self.path / "owner.json").read_text())
            return Owner(int(data["pid"]), str(data["host"]), float(data["since"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _is_stale(self, owner: Optional[Owner]) -> bool:
        if owner is None:
            # Between another process's mkdir and its owner file; give it a moment before calling it stale.
            try:
                return time.time() - self.path.stat().st_mtime > 10
            except FileNotFoundError:
                return False
        if owner.host == socket.gethostname():
            return not _pid_alive(owner.pid)
        return time.time() - owner.since > STALE_AFTER_S

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout
        told = False
        _mkdir(self.path.parent)
        while True:
            try:
                self.path.mkdir(mode=DIR_MODE)
            except FileExistsError:
                owner = self._read_owner()
                if self._is_stale(owner):
                    shutil.rmtree(self.path, ignore_errors=True)
                    continue
                if time.monotonic() >= deadline:
                    who = f"process {owner.pid} on {owner.host}" if owner else "another process"
                    raise StateError(
                        f"{self.path.name} is locked by {who}: another envbuilder is working on this env",
                        hint="wait for it to finish; if that process is gone from a node you cannot reach, "
                        f"remove {self.path}",
                    ) from None
                if owner and self.on_wait and not told:
                    self.on_wait(owner)
                    told = True
                time.sleep(self.poll)
                continue
            self.owner = Owner.me()
            write_atomic(self.path / "owner.json", json.dumps(asdict(self.owner)).encode())
            return

    def release(self) -> None:
        if self.owner is None:
            return
        current = self._read_owner()
        if current is not None and (current.pid, current.host) == (self.owner.pid, self.owner.host):
            shutil.rmtree(self.path, ignore_errors=True)
        self.owner = None

    def __enter__(self) -> EnvLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def locked(
    root: Path, name: str, timeout: float = 0, on_wait: Optional[Callable[[Owner], None]] = None
) -> Iterator[EnvLock]:
    record_path(root, name)  # validates the name
    with EnvLock(root / "locks" / f"{name}.lock", timeout=timeout, on_wait=on_wait) as lock:
        yield lock


# ---------------------------------------------------------------------------------------------------------------
# Health


@dataclass(frozen=True)
class Health:
    status: str  # ok | damaged | gone
    detail: str
    missing: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "missing": list(self.missing[:20])}


def health(record: EnvRecord) -> Health:
    """Whether the env is still whole: the prefix, its python, and every file its installed packages listed."""
    prefix = Path(record.prefix)
    if not prefix.is_dir():
        return Health("gone", f"{prefix} does not exist (purged or removed)")
    missing: list[str] = []
    kind = record.plan.get("kind", "venv") if record.plan else "venv"
    if kind != "user-prefix":
        for rel in ("bin/python", "bin/activate"):
            if not (prefix / rel).exists():
                missing.append(rel)
    for rec in sorted(prefix.glob("lib/python*/site-packages/*.dist-info/RECORD")):
        site = rec.parent.parent
        for line in rec.read_text(encoding="utf-8", errors="replace").splitlines():
            rel = line.split(",", 1)[0]
            if rel and not (site / rel).exists() and "__pycache__" not in rel:
                missing.append(str((site / rel).relative_to(prefix)) if not rel.startswith("..") else rel)
    if missing:
        return Health("damaged", f"{len(missing)} file(s) missing, e.g. {missing[0]}", tuple(missing))
    return Health("ok", "all files present")
