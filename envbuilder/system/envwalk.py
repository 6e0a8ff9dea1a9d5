"""The walk of an env that measures it for its record (:mod:`envfiles` says what is kept and why) and finds what
any user may write (the world-write sweep of create and restore): one ``lstat`` of every entry, by find, in the
background of the work that puts the record together.

find prints one NUL-ended item per fact, and only the facts asked for, so that reading them back is a few list
comprehensions over the whole output rather than Python work per entry: a torch env has 30,000 entries, and a
line of several fields split and parsed for each cost as much as the walk itself.
"""

from __future__ import annotations

import contextlib
import heapq
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from envbuilder.system import envfiles, proc

#: Every entry, the prefix itself first (find starts there): its 512-byte blocks.
_BLOCKS = ["-printf", "%b\\0"]
#: An entry any user may write (symlinks, whose mode means nothing, left out): ``w`` and its path under the
#: prefix (empty for the prefix itself).
_WRITABLE = [",", "-perm", "-0002", "!", "-type", "l", "-printf", "w%P\\0"]
#: A file that is neither a directory nor a symlink (what the purge removes): ``a``, its access time in seconds,
#: its path.
_ATIMES = [",", "!", "-type", "d", "!", "-type", "l", "-printf", "a%A@ %P\\0"]
#: A regular file: ``s``, its size, its device and inode (a file with several names is counted once).
_SIZES = [",", "-type", "f", "-printf", "s%s %D:%i\\0"]


def measure(prefix: Path, purged: bool) -> dict[str, Any]:
    """The record's ``files`` of the env at ``prefix`` (``purged``: on a file system whose purge reads atimes):
    with its size on disk (``bytes``, allocated blocks) and inodes (``count``: files, links and directories),
    which pre-flight reads for restore, backup and pack."""
    with walking(prefix, atimes=purged) as held:
        pass
    return held.walk.files(purged)


class Walk:
    """One walk of an env: what the record keeps of it (:meth:`files`), the entries any user may write
    (``writable``, paths relative to the prefix, "" for the prefix itself) and, where asked, the size progress
    shows (``size``, as :func:`progress.sum_sizes` counts it)."""

    def __init__(self, printed: str, sentinels: list[str]) -> None:
        #: The files the health check looks for (envfiles.sentinels), read while find walked.
        self.sentinels = sentinels
        items = printed.split("\0")
        blocks = [item for item in items if item[:1].isdigit()]
        #: Inodes: files, links and directories, the prefix included.
        self.count = len(blocks)
        #: Bytes on disk of everything under the prefix (the prefix's own blocks left out).
        self.bytes = sum(map(int, blocks[1:])) * 512
        self.writable = [item[1:] for item in items if item[:1] == "w"]
        #: (access time as find printed it, path) of every file the purge could remove (when asked).
        self.times = [item[1:].split(" ", 1) for item in items if item[:1] == "a"]
        sizes = {key: size for size, key in (item[1:].split(" ", 1) for item in items if item[:1] == "s")}
        self.size = sum(map(int, sizes.values()))

    def files(self, purged: bool) -> dict[str, Any]:
        """The record's ``files`` (:func:`measure`); ``purged`` needs a walk that took the access times."""
        files: dict[str, Any] = {"sentinels": self.sentinels}
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
def walking(
    prefix: Path, *, atimes: bool = False, sizes: bool = False, check: bool = False
) -> Iterator[Walking]:
    """Walk ``prefix`` while the block runs: find does it in C, on another core, several times faster than a
    Python walk. ``atimes``: also the access times (an env on a purged file system); ``sizes``: also the size
    progress shows. An entry find cannot read (a directory without read permission) is left out, as one gone
    while it looked, unless ``check`` (CommandFailed: what must see every entry, the world-write sweep); names
    are read as the file system has them (``surrogateescape``, as ``os.fsdecode``). The block must not create
    files the walk needs."""
    argv = [
        "find",
        str(prefix),
        *_BLOCKS,
        *_WRITABLE,
        *(_ATIMES if atimes else []),
        *(_SIZES if sizes else []),
    ]
    held = Walking()
    with proc.background(argv, errors="surrogateescape") as child:
        yield held
        sentinels = envfiles.sentinels(prefix)  # the RECORDs read while find may still be at it
        held._walk = Walk(child.result(check=check).stdout, sentinels)
