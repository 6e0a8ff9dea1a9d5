"""The walk of an env that measures it for its record (:mod:`envfiles` says what is kept and why) and finds what
any user may write (the world-write sweep of create and restore): one ``lstat`` of every entry, by find, in the
background of the work that puts the record together."""

from __future__ import annotations

import contextlib
import heapq
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from envbuilder.system import envfiles, proc

#: What find prints of each entry under an env, NUL-ended: its type letter, its 512-byte blocks, its permission
#: bits in octal, its size, device and inode, its access time in seconds and its path under the prefix (empty for
#: the prefix itself).
_FORMAT = "%y %b %m %s %D %i %A@ %P\\0"


def measure(prefix: Path, purged: bool) -> dict[str, Any]:
    """The record's ``files`` of the env at ``prefix`` (``purged``: on a file system whose purge reads atimes):
    with its size on disk (``bytes``, allocated blocks) and inodes (``count``: files, links and directories),
    which pre-flight reads for restore, backup and pack."""
    with walking(prefix) as held:
        pass
    return held.walk.files(prefix, purged)


class Walk:
    """One walk of an env (one ``lstat`` of every entry, by find): what the record keeps of it (:meth:`files`),
    the entries that any user may write (``writable``, relative paths; symlinks, whose mode means nothing, left
    out), and the size progress shows (``size``, as :func:`progress.sum_sizes` counts it)."""

    def __init__(self, printed: str) -> None:
        self.bytes = 0
        self.count = 0
        #: The bytes of its regular files, each file once (hard links): what progress shows as written.
        self.size = 0
        self.writable: list[str] = []
        #: (access time as find printed it, path) of every file that is neither a directory nor a symlink.
        self.times: list[tuple[str, str]] = []
        seen: set[tuple[str, str]] = set()
        for line in printed.split("\0"):
            if not line:
                continue
            kind, blocks, mode, size, device, inode, atime, rel = line.split(" ", 7)
            self.count += 1
            if not rel:
                continue  # the prefix itself: one inode, its own blocks not counted
            self.bytes += int(blocks) * 512
            if kind == "f" and (device, inode) not in seen:
                seen.add((device, inode))
                self.size += int(size)
            if kind != "l":
                if int(mode, 8) & stat.S_IWOTH:
                    self.writable.append(rel)
                if kind != "d":
                    self.times.append((atime, rel))

    def files(self, prefix: Path, purged: bool) -> dict[str, Any]:
        """The record's ``files`` (:func:`measure`)."""
        files: dict[str, Any] = {"sentinels": envfiles.sentinels(prefix)}
        if purged:
            least = heapq.nsmallest(envfiles.SAMPLE + 1, ((float(atime), rel) for atime, rel in self.times))
            files["oldest"] = [[rel, atime] for atime, rel in least[: envfiles.SAMPLE]]
            files["next"] = least[envfiles.SAMPLE][0] if len(least) > envfiles.SAMPLE else None
        files.update(bytes=self.bytes, count=self.count, measured=time.strftime("%Y-%m-%d"))
        return files


class Walking:
    """A walk under way (:func:`walking`); ``walk`` once the block is left."""

    def __init__(self) -> None:
        self._walk: Optional[Walk] = None

    @property
    def walk(self) -> Walk:
        if self._walk is None:
            raise RuntimeError("the walk is read inside its own block")
        return self._walk


@contextlib.contextmanager
def walking(prefix: Path) -> Iterator[Walking]:
    """Walk ``prefix`` while the block runs: find does it in C, on another core, several times faster than a
    Python walk of the tens of thousands of entries of a torch env. An entry find cannot read (a directory
    without read permission) is left out, as one gone while it looked; names are read as the file system
    has them (``surrogateescape``, as ``os.fsdecode``). The block must not create files the walk needs."""
    held = Walking()
    with proc.background(["find", str(prefix), "-printf", _FORMAT], errors="surrogateescape") as child:
        yield held
        held._walk = Walk(child.result(check=False).stdout)
