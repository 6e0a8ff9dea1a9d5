"""Extracting an env's archive into a new directory without writing anywhere else, whatever the archive holds.

envbuilder writes its archives, but they live in a backup root (or an image directory) that another process may
write to, so each member is taken as it comes and checked before anything is written:

- its name is a relative path inside the env: no leading ``/``, no ``..``, no empty or ``.`` part;
- it is a directory, a regular file, a symlink or a hard link to a regular file extracted before it: a device
  file or a fifo stops the extraction (an env holds none);
- it is written only through directories the extraction made: every directory is opened with ``O_NOFOLLOW``
  relative to its parent's descriptor, and every entry is created with ``O_EXCL`` by name in it (``dir_fd``), so
  a member named ``lib/x`` after a symlink ``lib -> /home/user`` fails to open ``lib`` and stops the extraction,
  and a member named twice (a file after a symlink of the same name) stops it too;
- modes keep no setuid, setgid, sticky nor world-write bit, and owners are never taken from the archive.

Symlinks themselves are kept as written, wherever they point: a venv's ``bin/python`` names the base interpreter
by its absolute path. They are never followed here, and the rest of envbuilder walks envs without following them.

tarfile's extraction filters (Python 3.12, backported to 3.9.17 and later 3.8-3.11 patch releases) are not used:
they decide with ``os.path.realpath``, which needed fixes again in 2025 (CVE-2025-4517), and they are missing from
the earlier 3.9 releases envbuilder supports. Descriptors decide the same way on every Python.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import IO, Optional

from envbuilder.core.errors import BackupError

CHUNK = 1 << 20
#: The permission bits an extracted entry may keep: no setuid, setgid, sticky nor world-write bit.
SAFE_BITS = 0o775
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC


class Refused(Exception):
    """A member that must not be extracted; the message says which and why."""


def untar(stream: IO[bytes], into: Path, source: Path) -> None:
    """Extract the tar stream ``stream`` (read from ``source``, for messages) so that ``into``, which must not
    exist, becomes the env directory. Raises BackupError at the first member that is not one envbuilder writes;
    what was extracted up to there stays in ``into`` for the caller to remove."""
    into.mkdir(mode=0o700)
    root = os.open(into, _DIR)
    tree = _Tree(root)
    dirs: list[tuple[tuple[str, ...], int, float]] = []
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for info in tar:
                parts = _parts(info.name)
                if parts:
                    _member(tar, info, parts, tree, dirs)
        for parts, mode, mtime in reversed(dirs):  # deepest first: a read-only directory is filled already
            fd = tree.open_dir(parts)
            os.fchmod(fd, mode & SAFE_BITS)
            os.utime(fd, (mtime, mtime))
    except Refused as exc:
        raise BackupError(
            f"{source}: {exc}; extraction stopped (nothing was written outside {into})",
            hint="the archive is not the one envbuilder wrote: restore an earlier backup (envbuilder backups)",
        ) from None
    except tarfile.TarError as exc:
        raise BackupError(f"{source} is not a readable tar archive: {exc}") from None
    finally:
        tree.close()
        os.close(root)


def _parts(name: str, link_of: Optional[str] = None) -> tuple[str, ...]:
    """The path a member names (or the member ``link_of`` links to), as parts (none for the archive's own top,
    ``.``); Refused if it is not a path inside the env."""
    if name in (".", "./") and link_of is None:
        return ()
    parts = tuple(name.rstrip("/").split("/"))
    if name.startswith("/") or "\0" in name or any(p in ("", ".", "..") for p in parts):
        what = f"member {name!r}" if link_of is None else f"member {link_of!r} links to {name!r}, which"
        raise Refused(f"{what} is not a path inside the env (absolute, empty or with ..)")
    return parts


def _member(
    tar: tarfile.TarFile,
    info: tarfile.TarInfo,
    parts: tuple[str, ...],
    tree: _Tree,
    dirs: list[tuple[tuple[str, ...], int, float]],
) -> None:
    parent, name = tree.open_dir(parts[:-1], info.name), parts[-1]
    try:
        if info.isdir():
            os.mkdir(name, 0o700, dir_fd=parent)
            dirs.append((parts, info.mode, info.mtime))
        elif info.isreg():
            _file(tar, info, parent, name)
        elif info.issym():
            os.symlink(info.linkname, name, dir_fd=parent)
        elif info.islnk():
            source = _parts(info.linkname, info.name)
            src_dir = tree.open_dir(source[:-1], info.name, keep=False)
            try:
                if not stat.S_ISREG(os.stat(source[-1], dir_fd=src_dir, follow_symlinks=False).st_mode):
                    raise Refused(f"member {info.name!r} is a hard link to {info.linkname!r}, not to a file")
                os.link(source[-1], name, src_dir_fd=src_dir, dst_dir_fd=parent, follow_symlinks=False)
            finally:
                os.close(src_dir)
        else:
            raise Refused(f"member {info.name!r} is a device file or a fifo (an env holds none)")
    except FileExistsError:
        raise Refused(f"member {info.name!r} is in the archive twice") from None
    except FileNotFoundError:
        raise Refused(
            f"member {info.name!r} links to {info.linkname!r}, which is not in the archive"
        ) from None


def _file(tar: tarfile.TarFile, info: tarfile.TarInfo, parent: int, name: str) -> None:
    src = tar.extractfile(info)
    fd = os.open(name, _NEW_FILE, 0o600, dir_fd=parent)
    try:
        if src is not None:
            with os.fdopen(fd, "wb", closefd=False) as sink:
                shutil.copyfileobj(src, sink, CHUNK)
        os.fchmod(fd, info.mode & SAFE_BITS)
        os.utime(fd, (info.mtime, info.mtime))
    finally:
        os.close(fd)


class _Tree:
    """Descriptors of the directories below the extraction's top, each opened in its parent without following a
    link. The chain of the last one opened is kept (members come parents first, in order, so most share it)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.chain: list[tuple[str, int]] = []

    def open_dir(self, parts: tuple[str, ...], member: Optional[str] = None, keep: bool = True) -> int:
        """The directory ``parts``; with ``keep`` false a new descriptor the caller closes."""
        if not keep:
            fd = os.dup(self.root)
            for i, part in enumerate(parts):
                fd = _descend(fd, part, parts[: i + 1], member)
            return fd
        same = 0
        while same < min(len(parts), len(self.chain)) and self.chain[same][0] == parts[same]:
            same += 1
        for _, fd in self.chain[same:]:
            os.close(fd)
        del self.chain[same:]
        for i in range(same, len(parts)):
            here = self.chain[-1][1] if self.chain else self.root
            self.chain.append((parts[i], _descend(os.dup(here), parts[i], parts[: i + 1], member)))
        return self.chain[-1][1] if self.chain else self.root

    def close(self) -> None:
        for _, fd in self.chain:
            os.close(fd)
        self.chain.clear()


def _descend(fd: int, part: str, where: tuple[str, ...], member: Optional[str]) -> int:
    """Open ``part`` in the directory ``fd`` (closed here) without following a link."""
    try:
        return os.open(part, _DIR, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            raise
        what = "is not in the archive before it" if exc.errno == errno.ENOENT else "is a symlink or a file"
        raise Refused(
            f"member {member!r} goes through {'/'.join(where)!r}, which {what}: "
            "an env's archive never writes through a link"
        ) from None
    finally:
        os.close(fd)


def tidy(into: Path, source: Path) -> None:
    """Hold what an external extractor (unsquashfs) wrote at ``into`` to the same rules as ``untar``: a device
    file or a fifo is refused, no setuid, setgid, sticky nor world-write bit stays, and an owner taken from the
    image (unsquashfs run as root keeps them) becomes the caller. unsquashfs 4.5.1 and later itself refuses
    names that leave the directory and writing through a symlink of the same image (CVE-2021-40153, 41072)."""
    me = (os.geteuid(), os.getegid())
    top = into.lstat()
    if me[0] == 0 and (top.st_uid, top.st_gid) != me:
        os.chown(into, *me)
    into.chmod(stat.S_IMODE(top.st_mode) & SAFE_BITS)
    for _, dirnames, filenames, dirfd in os.fwalk(into, follow_symlinks=False):
        for name in [*dirnames, *filenames]:
            info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                raise BackupError(
                    f"{source}: {name!r} is a device file or a fifo (an env holds none); not used",
                    hint="the image is not the one envbuilder wrote: make it again",
                )
            if me[0] == 0 and (info.st_uid, info.st_gid) != me:
                os.chown(name, *me, dir_fd=dirfd, follow_symlinks=False)
            if not stat.S_ISLNK(info.st_mode) and stat.S_IMODE(info.st_mode) & ~SAFE_BITS:
                os.chmod(name, stat.S_IMODE(info.st_mode) & SAFE_BITS, dir_fd=dirfd)
