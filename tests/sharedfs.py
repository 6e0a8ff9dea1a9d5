"""File systems as a cluster's are: another user's directories, full and read-only mounts.

Real parts only: a second Unix user made with ``useradd`` (``ebother``, no home, no login), and ``tmpfs`` mounts
with ``size=`` for a full disk and ``ro`` for a read-only one. Both need root, which the tests and CI have; where
they cannot be had (an unprivileged run, a container without mount rights) the fixture skips and says why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

OTHER_USER = "ebother"


class User(NamedTuple):
    name: str
    uid: int
    gid: int


def other_user() -> User:
    """The second Unix user (made on first use), or a skip that says why it cannot be had."""
    if os.geteuid() != 0:
        pytest.skip("a second Unix user needs root to make and to chown to (useradd, chown)")
    try:
        entry = pwd.getpwnam(OTHER_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        res = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            capture_output=True,
            text=True,
        )
        # Another xdist worker may have made it in the meantime: that is fine.
        if res.returncode not in (0, 9):
            pytest.fail(f"useradd {OTHER_USER} failed: {res.stderr.strip()}")
        entry = pwd.getpwnam(OTHER_USER)
    return User(entry.pw_name, entry.pw_uid, entry.pw_gid)


def give_to(path: Path, user: User, mode: Optional[int] = None) -> Path:
    """Make ``path`` (a file or directory that exists) ``user``'s, with ``mode`` if given."""
    os.chown(path, user.uid, user.gid, follow_symlinks=False)
    if mode is not None:
        path.chmod(mode)
    return path


def _mount(argv: list[str]) -> None:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        if os.geteuid() != 0:
            pytest.skip(f"tmpfs mounts need root ({' '.join(argv)})")
        pytest.fail(f"{' '.join(argv)} failed: {res.stderr.strip()}")


@contextlib.contextmanager
def tmpfs(
    path: Path,
    *,
    size: str = "4m",
    read_only: bool = False,
    options: str = "",
    nr_inodes: Optional[int] = None,
) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (made if absent), unmounted afterwards. ``read_only`` mounts it read-only
    (after ``path`` was filled, if the caller wants files in it: see ``read_only_again``); ``nr_inodes`` caps its
    inodes (its root directory takes one), for a file system with bytes to spare and no files left."""
    if os.geteuid() != 0:
        pytest.skip("tmpfs mounts need root (mount -t tmpfs)")
    path.mkdir(parents=True, exist_ok=True)
    extra = [o for o in (options, f"nr_inodes={nr_inodes}" if nr_inodes else "") if o]
    opts = f"size={size},mode=0755" + "".join(f",{o}" for o in extra) + (",ro" if read_only else "")
    _mount(["mount", "-t", "tmpfs", "-o", opts, "envbuilder-test", str(path)])
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, *, read_only: bool) -> None:
    """Turn a tmpfs made by ``tmpfs`` read-only (or writable again) with its files kept."""
    _mount(["mount", "-o", "remount," + ("ro" if read_only else "rw"), str(path)])


def fill(path: Path, leave: int = 0) -> None:
    """Fill the file system holding the directory ``path`` until fewer than ``leave`` bytes are free (already
    full: nothing to do). Unbuffered writes: a buffered file's close would fail again on the full disk."""
    block = b"\0" * (64 * 1024)
    try:
        fd = os.open(path / ".filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        return
    try:
        while True:
            st = os.statvfs(path)
            if st.f_bavail * st.f_frsize <= leave:
                break
            os.write(fd, block[: max(4096, min(len(block), st.f_bavail * st.f_frsize - leave))])
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def quota_dir(
    image: Path, mountpoint: Path, *, limit: str = "1M", size: str = "300M", full: bool = False
) -> Iterator[Path]:
    """A directory under a real quota: a btrfs file system in ``image`` (a sparse file on a loop device) mounted
    at ``mountpoint``, with quotas on and a qgroup limit of ``limit`` on the subvolume returned. Writing past it
    fails with EDQUOT, for root too (btrfs qgroups need no kernel CONFIG_QUOTA). ``full``: a file ``filler`` in it
    takes all of the quota first."""
    if os.geteuid() != 0:
        pytest.skip("a quota'd file system needs root (losetup, mount)")
    for tool in ("mkfs.btrfs", "btrfs"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: .ci/run installs btrfs-progs")
    with image.open("wb") as f:
        f.truncate(_bytes(size))
    _mount(["mkfs.btrfs", "-q", str(image)])
    mountpoint.mkdir(parents=True, exist_ok=True)
    _mount(["mount", "-o", "loop", str(image), str(mountpoint)])
    try:
        sub = mountpoint / "quota"
        _mount(["btrfs", "quota", "enable", str(mountpoint)])
        _mount(["btrfs", "subvolume", "create", str(sub)])
        _mount(["btrfs", "qgroup", "limit", limit, str(sub)])
        if full:
            _fill_quota(sub / "filler")
        yield sub
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
        image.unlink(missing_ok=True)


def _fill_quota(filler: Path) -> None:
    block = b"\0" * (64 * 1024)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, block)
            os.fsync(fd)  # qgroups count what reached the disk
    except OSError as exc:
        if exc.errno != errno.EDQUOT:
            raise
    finally:
        os.close(fd)


def _bytes(size: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
