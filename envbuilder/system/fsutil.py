"""File-system primitives shared by every writer: atomic replacement of a file, directories that are never
world-writable, and a mutex that works where flock does not (``transaction`` builds directories beside and swaps
them in on top of these).

The mutex works on Lustre and NFS: ``mkdir``/``rename`` of its directory is atomic everywhere, and an owner file
says who holds it (pid, host, time). A mutex whose owner process is gone from this host is stale and is broken;
one held from another host is broken only after ``STALE_AFTER_S`` (its process cannot be checked). Its directory
keeps the name ``*.lock`` on disk (``locks/NAME.lock``) so that running envbuilders of every release agree.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder.core.errors import CommandFailed, DiskError, StateError, UsageError
from envbuilder.core.structs import dataclass
from envbuilder.system import removal

STALE_AFTER_S = 24 * 3600
FILE_MODE = 0o644
DIR_MODE = 0o755


#: The errnos of a file system that says no, in words: one error family (``DiskError``) for all of them.
DISK_ERRNOS = {
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file size limit was reached",
    errno.ENOENT: "no such file or directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}

#: Where a disk error happened and the way out there: a root directory and what to do instead of writing under
#: it ("set ENVBUILDER_HOME to a writable directory"). The first place that holds the failing path gives the hint.
Place = tuple[Path, str]


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """Let an OSError from writing ``path`` name it: a failed ``write`` or ``fsync`` (a full disk, a quota) says
    only "No space left on device", and the user needs to know where."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def disk_error(exc: OSError, places: tuple[Place, ...] = (), *, anywhere: bool = True) -> Optional[DiskError]:
    """``exc`` as a DiskError (the path, the cause in words, a hint from the place that holds the path), or None
    where it is no disk error (another errno, or no path). With ``anywhere`` false, only a path in one of
    ``places`` is converted: an outer handler, with places of its own, gets the rest."""
    if exc.errno not in DISK_ERRNOS or exc.filename is None:
        return None
    # A copy's or a rename's second name is where it wrote: a full or read-only target, not the source.
    name = exc.filename2 if exc.filename2 is not None and exc.errno in _WRITING else exc.filename
    return _disk(exc.errno, _shown(os.fsdecode(name)), places, anywhere)


def _disk(
    number: int, path: str, places: tuple[Place, ...], anywhere: bool, said: str = ""
) -> Optional[DiskError]:
    way_out = next((hint for root, hint in places if _under(path, root)), None)
    if way_out is None and not anywhere:
        return None
    code = errno.errorcode.get(number, str(number))
    return DiskError(
        f"{path}: {DISK_ERRNOS[number]} ({code}){said}", path=path, errno=number, hint=_hint(number, way_out)
    )


#: What a program says on its stderr for each disk errno (strerror, as C's perror and Rust's io::Error print it).
_SAID = {number: os.strerror(number) for number in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)}


def command_disk_error(exc: CommandFailed, place: Place) -> Optional[DiskError]:
    """A program (uv, mksquashfs, a compressor) that failed because the file system it wrote to under ``place``
    said no, as a DiskError with the place's hint; None where its stderr names no disk error."""
    tail = exc.stderr_tail
    for number, text in _SAID.items():
        if text.lower() in tail.lower():
            line = next(ln.strip() for ln in tail.splitlines() if text.lower() in ln.lower())
            return _disk(number, str(place[0]), (place,), True, f", as {Path(exc.argv[0]).name} said: {line}")
    return None


_WRITING = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}

#: What the temporary names of envbuilder's writers hold (``.NAME.tmp-PID-NS``, a mutex's ``.NAME.new-...``, a
#: build's ``.NAME.partial-PID``, a removal's ``.NAME.removing-PID``): an error names the directory they were made
#: in, which the user knows.
_TEMP_MARKS = (".tmp-", ".new-", ".partial-", ".broken-", ".removing-")


def _shown(path: str) -> str:
    parts = path.split("/")
    for i, name in enumerate(parts):
        if i and name.startswith(".") and any(mark in name for mark in _TEMP_MARKS):
            return "/".join(parts[:i]) or "/"
    return path


def _under(path: str, root: Path) -> bool:
    return path == str(root) or path.startswith(str(root).rstrip("/") + "/")


def _hint(number: Optional[int], way_out: Optional[str]) -> str:
    if number in _FULL:
        first = "free space or quota on that file system (df -h, quota -s)"
    elif number == errno.ENOENT:
        first = "check that it exists (a purge, or a file system not mounted on this node?)"
    elif number == errno.EROFS:
        first = "that file system is mounted read-only here (some nodes mount $WORK so)"
    else:
        first = "check its owner and mode (ls -ld)"
    return f"{first}; or {way_out}" if way_out else first


@contextlib.contextmanager
def disk_errors(*places: Place) -> Iterator[None]:
    """Turn an OSError of a path under one of ``places`` into a DiskError with that place's hint, and a program
    that failed on a full or read-only file system into one of the first place; any other error passes on (the
    CLI's last resort converts the OSErrors left with a hint of its own)."""
    try:
        yield
    except OSError as exc:
        converted = disk_error(exc, places, anywhere=False)
        if converted is None:
            raise
        raise converted from exc
    except CommandFailed as exc:
        said = command_disk_error(exc, places[0]) if places else None
        if said is None:
            raise
        raise said from exc


def mkdirs(path: Path) -> None:
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


def walk(root: Path) -> Iterator[Path]:
    """Every entry under ``root`` (not following links), parents before children, in a stable order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        for name in sorted(dirnames):
            yield here / name
        for name in sorted(filenames):
            yield here / name


#: A file's identity and times (see :func:`file_key`).
Key = list[int]


def file_key(path: Path) -> Optional[Key]:
    """The identity and times of the file at ``path`` (followed through symlinks): device, inode, size, mtime,
    ctime, mode. A cache keyed on it is stale once the file is replaced or written. None where it cannot be
    stat'ed."""
    try:
        st = path.stat()
    except (OSError, ValueError):
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode]


def read_cache(path: Path, version: int, section: str) -> dict[str, Any]:
    """The ``section`` mapping of a JSON cache file ``{"version": version, section: {...}}``; empty where the file
    is missing, unreadable, malformed or of another version: a cache only ever saves time."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(data, dict)
        or data.get("version") != version
        or not isinstance(data.get(section), dict)
    ):
        return {}
    return dict(data[section])


def write_cache(path: Path, version: int, section: str, entries: dict[str, Any]) -> None:
    """Write a cache file :func:`read_cache` reads; one that cannot be written is left as it was."""
    try:
        write_atomic(path, json.dumps({"version": version, section: entries}, sort_keys=True).encode())
    except OSError as exc:
        cache_unwritable(path.parent, exc)


#: The cache directories this process has warned about (a plan writes dozens of cache files: one warning).
_UNWRITABLE: set[str] = set()


def cache_unwritable(directory: Path, exc: OSError) -> None:
    """Say once that a cache cannot be written (a read-only or full home) and go on: a cache only saves time,
    and a command that only reads (plan, list) must not fail for it."""
    if str(directory) in _UNWRITABLE:
        return
    _UNWRITABLE.add(str(directory))
    from envbuilder.system.console import Out  # noqa: PLC0415 - only an unwritable cache needs it

    words = DISK_ERRNOS.get(exc.errno or 0) or exc.strerror or str(exc)
    Out().warn(f"the cache {directory} cannot be written ({words}); going on without it ({_CACHE_WAY_OUT})")


_CACHE_WAY_OUT = "set ENVBUILDER_HOME to a writable directory to keep it"


def write_atomic(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a part."""
    mkdirs(path.parent)
    tmp = path.with_name(f"{_tmp_prefix(path)}{os.getpid()}-{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with naming(path), os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.chmod(mode)  # O_CREAT's mode is filtered by the umask; set it exactly
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    sweep_tmp(path)


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


def sweep_tmp(path: Path) -> None:
    """Remove the temporary files of ``path`` that writers on this host left when they were killed (their
    process is gone): a write that cannot finish leaves nothing, not even after a kill."""
    prefix = _tmp_prefix(path)
    with contextlib.suppress(OSError):
        for left in path.parent.glob(glob.escape(prefix) + "*"):
            pid, _, _ns = left.name[len(prefix) :].partition("-")
            # Only this host's pids can be checked; an hour-old temporary file of a small write is no one's.
            old = time.time() - left.lstat().st_mtime > 3600
            if (
                pid.isdigit()
                and old
                and not _pid_alive(int(pid))
                and left.is_file()
                and not left.is_symlink()
            ):
                with contextlib.suppress(OSError):
                    left.unlink()


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (best effort: some file systems refuse fsync on a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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


class Mutex:
    """A mutex at ``path`` (one env, a backup root, a registry), usable as a context manager.

    Taking it is one ``rename`` of a directory that already holds its owner file onto the mutex's path (atomic on
    local file systems, Lustre and NFS; it fails when the path exists), so a mutex is never seen without its owner.
    Breaking a stale one is atomic too: the breakers of one mutex generation race to create a ``breaker-N``
    symlink *inside it* (through a descriptor of the directory they judged, so a newer mutex at the same path is
    never the one they break); the one that creates it alone moves the stale directory away and removes it.
    A breaker that dies mid-way is itself stale, and the next level (``breaker-N+1``) decides who takes over.
    """

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

    def _is_stale(self, fd: int, owner: Optional[Owner]) -> bool:
        if owner is None:
            # No owner file: written by an older envbuilder between its mkdir and its owner file, or damaged.
            return time.time() - os.fstat(fd).st_mtime > 10
        return _gone(owner.pid, owner.host, owner.since, STALE_AFTER_S)

    def _aside(self, what: str) -> Path:
        return self.path.with_name(
            f".{self.path.name}.{what}-{socket.gethostname()}-{os.getpid()}-{time.monotonic_ns()}"
        )

    def _create(self) -> bool:
        """Put a new mutex, owner file included, at the path in one rename; False if one is there."""
        me = Owner.me()
        new = self._aside("new")
        new.mkdir(mode=DIR_MODE)
        try:
            write_atomic(new / "owner.json", json.dumps(asdict(me)).encode())
            try:
                new.rename(self.path)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    return False
                if exc.errno == errno.ENOTDIR:
                    raise StateError(
                        f"{self.path} is in the way of a mutex and is not one", hint=f"remove {self.path}"
                    ) from None
                raise
        finally:
            if new.exists():
                removal.remove_tree(new, ignore_errors=True)
        self.owner = me
        return True

    def _break(self, fd: int) -> bool:
        """Break the stale mutex ``fd`` is open on, if this process wins the right to: True when it did (or the
        mutex is gone), False when another breaker is at work on it."""
        token = json.dumps([os.getpid(), socket.gethostname(), time.time()])
        for level in range(MAX_BREAKERS):
            name = f"breaker-{level}"
            try:
                os.symlink(token, name, dir_fd=fd)
                break
            except FileExistsError:
                pass
            except FileNotFoundError:
                return True  # broken and removed by another breaker meanwhile
            if _breaker_alive(fd, name):
                return False
        else:
            return False
        self._remove_judged(fd, name)
        return True

    def _remove_judged(self, fd: int, name: str) -> None:
        """As the breaker that won level ``name``, move the stale mutex ``fd`` is open on away and remove it,
        unless it has gone from the path already."""
        judged = os.fstat(fd)
        try:
            here = os.lstat(self.path)
        except FileNotFoundError:
            here = None
        if here is None or (here.st_dev, here.st_ino) != (judged.st_dev, judged.st_ino):
            # Broken already: this was a late symlink into a directory on its way out. While the judged mutex is
            # at the path, its breaker symlinks stay, so the level won here is unique to it.
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
            return
        tomb = self._aside("broken")
        try:
            self.path.rename(tomb)
        except FileNotFoundError:
            return
        moved = tomb.lstat()
        if (moved.st_dev, moved.st_ino) != (judged.st_dev, judged.st_ino):
            # Not the mutex judged stale (only its breaker may move it, so this is not expected): put it back.
            with contextlib.suppress(OSError):
                tomb.rename(self.path)
            return
        _remove(tomb)

    def _sweep(self) -> None:
        """Remove what a process killed in the middle of taking or breaking this mutex left beside it."""
        for left in self.path.parent.glob(f".{glob.escape(self.path.name)}.*-*-*-*"):
            what, _, rest = left.name[len(self.path.name) + 2 :].partition("-")
            host, pid, _ns = rest.rsplit("-", 2)
            if what not in ("new", "broken") or not pid.isdigit():
                continue
            try:
                since = left.lstat().st_mtime
            except FileNotFoundError:
                continue
            if _gone(int(pid), host, since, STALE_AFTER_S):
                removal.remove_tree(left, ignore_errors=True)

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout
        #: A stale mutex another process is breaking is free in milliseconds: wait that long, whatever the timeout.
        breaking_until: Optional[float] = None
        told = False
        mkdirs(self.path.parent)
        while True:
            if not os.path.lexists(self.path) and self._create():
                self._sweep()
                return
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                continue  # released or broken meanwhile: try again at once
            except NotADirectoryError:
                raise StateError(
                    f"{self.path} is in the way of a mutex and is not one", hint=f"remove {self.path}"
                ) from None
            try:
                owner = _owner_at(fd)
                stale = self._is_stale(fd, owner)
                if stale and self._break(fd):
                    continue
            finally:
                os.close(fd)
            if stale:
                breaking_until = breaking_until or time.monotonic() + BREAK_GRACE_S
                if time.monotonic() < breaking_until:
                    time.sleep(min(self.poll, 0.02))
                    continue
            if time.monotonic() >= deadline:
                who = f"process {owner.pid} on {owner.host}" if owner else "another process"
                raise StateError(
                    f"the mutex {self.path.name} is locked by {who}: another envbuilder holds it",
                    hint="wait for it to finish; if that process is gone from a node you cannot reach, "
                    f"remove {self.path}",
                )
            if owner and self.on_wait and not told:
                self.on_wait(owner)
                told = True
            time.sleep(self.poll)

    def release(self) -> None:
        if self.owner is None:
            return
        mine, self.owner = self.owner, None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            current = _owner_at(fd)
            if current is None or (current.pid, current.host) != (mine.pid, mine.host):
                return  # broken (from another node, after STALE_AFTER_S) and taken since: not ours to remove
            # Out of the way in one rename, then removed: the path is free at once, and never half a mutex.
            tomb = self._aside("broken")
            try:
                self.path.rename(tomb)
            except FileNotFoundError:
                return
            moved, held = tomb.lstat(), os.fstat(fd)
            if (moved.st_dev, moved.st_ino) != (held.st_dev, held.st_ino):
                with contextlib.suppress(OSError):
                    tomb.rename(self.path)
                return
            _remove(tomb)
        finally:
            os.close(fd)

    def __enter__(self) -> Mutex:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


#: Levels of breakers of one stale mutex (each level is taken over only when its breaker died).
MAX_BREAKERS = 64
#: A breaker on another node that has not finished in this time is gone (breaking takes milliseconds).
BREAKER_STALE_S = 60.0
#: How long a stale mutex that another process is breaking is waited for, even with no timeout.
BREAK_GRACE_S = 5.0


def _gone(pid: int, host: str, since: float, after: float) -> bool:
    """Whether a process is gone: checked on this host; from another host, only guessed from its age."""
    if host == socket.gethostname():
        return not _pid_alive(pid)
    return time.time() - since > after


def _remove(tomb: Path) -> None:
    """Remove a mutex moved out of the way; a breaker that opened it before the move may still add its symlink."""
    for _ in range(5):
        removal.remove_tree(tomb, ignore_errors=True)
        if not os.path.lexists(tomb):
            return


def _owner_at(fd: int) -> Optional[Owner]:
    try:
        raw = os.open("owner.json", os.O_RDONLY, dir_fd=fd)
    except OSError:
        return None
    try:
        with os.fdopen(raw, "rb") as fh:
            data = json.loads(fh.read(65536))
        return Owner(int(data["pid"]), str(data["host"]), float(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _breaker_alive(fd: int, name: str) -> bool:
    try:
        text = os.readlink(name, dir_fd=fd)
        since = os.lstat(name, dir_fd=fd).st_mtime
    except OSError:
        return True  # cannot be told: leave the mutex to it, and look again later
    try:
        pid, host, since = json.loads(text)
        return not _gone(int(pid), str(host), float(since), BREAKER_STALE_S)
    except (ValueError, TypeError):
        return time.time() - since <= BREAKER_STALE_S


def write_output(output: Optional[str], text: str) -> Optional[Path]:
    """A command's document (a report's page) to stdout, or atomically to the file ``output`` (``-o``): then
    its path."""
    if output is None:
        sys.stdout.write(text)
        return None
    path = Path(output)
    if path.is_dir():
        raise UsageError(f"-o {path} is a directory", hint="name the report's file: -o report.html")
    with disk_errors((path.absolute().parent, "write it elsewhere with -o FILE")):
        write_atomic(path, text.encode())
    return path
