"""The compiled GPU architectures of an installed torch wheel, read once per wheel and remembered in the home.

What a wheel's name and files tell (version, local label, CUDA version) the guard reads as files. The arch list
(``torch._C._cuda_getArchFlags()``) is a string literal compiled into torch's Python bindings
(``torch/lib/libtorch_python.so``): ``library_flags`` finds it there by reading the file (a quarter of a second
for the 31 MiB of torch 2.11.0+cu130, against seconds for an import), and only where the library holds exactly
one such string; otherwise the guard imports torch and asks. Either way it is a fact of the wheel's content, so
it is kept per wheel content under the home (``settings.torch_builds_cache``), one JSON file per wheel, named by
``wheel_digest``.

The key, and why it is sound: ``wheel_digest`` is the sha256 of the rows of the installed RECORD that come from
the wheel itself: every file inside site-packages with its sha256 (the wheel's own RECORD, which lists the sha256
of every file it holds, METADATA and WHEEL with its tags among them), sorted. Left out are the rows the installer
writes for this env (INSTALLER, REQUESTED, direct_url.json, uv_cache.json, RECORD itself, bytecode, and the
console scripts under ``../../../bin`` whose shebang names this env's python): they differ between two envs of the
same wheel and say nothing of its code. Any wheel whose files differ (a repack, a rebuild for other GPUs, a
tampered file with its RECORD row updated) has another digest and is read again. A RECORD that lies about its
files (pip and uv do not check) is caught where it matters cheaply: a native library of the wheel whose size on
disk is not the size RECORD gives makes the wheel uncacheable, read every time. A row without a strong hash
(sha256 or better) does the same.

The cache only ever saves time: a missing, unreadable, malformed or foreign entry (another user's, or one its
group or everyone can write: ``strictmodes``) is ignored with a warning and the list is read again; entries are
written atomically (``fsutil.write_atomic``) and only from a read that succeeded for the torch the env imports.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import mmap
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder.core import settings
from envbuilder.core.errors import UnsafePath
from envbuilder.system import fsutil, strictmodes
from envbuilder.system.console import Out

#: The entry format; another is ignored (read again and rewritten).
VERSION = 1
#: The dist-info files an installer writes (PEP 376, 610, 627; uv's own): not the wheel's.
INSTALLER_FILES = frozenset({"INSTALLER", "REQUESTED", "RECORD", "direct_url.json", "uv_cache.json"})
STRONG = ("sha256=", "sha384=", "sha512=")
_FLAG = re.compile(r"(sm|compute)_\d+[af]?")
_NATIVE = re.compile(r"\.so(\.[0-9.]+)?$")
_DIGEST = re.compile(r"[0-9a-f]{64}")
#: The library whose C string is the arch list, under the torch package.
LIBRARY = "lib/libtorch_python.so"
#: A C string (NUL on both sides) that is nothing but arch names separated by spaces.
_LITERAL = re.compile(rb"(?:sm|compute)_\d+[af]?(?: (?:sm|compute)_\d+[af]?)*")
#: How far from an arch name its C string may begin or end: the longest list torch has built is ~100 bytes.
_REACH = 4096


def library_flags(package: Path) -> Optional[tuple[str, ...]]:
    """The arch list compiled into the torch package at ``package``, read from its bindings' library as bytes;
    None where the library is missing, unreadable, or holds no such string or more than one different one (then
    only an import can tell)."""
    path = package / LIBRARY
    try:
        with path.open("rb") as file:
            st = os.fstat(file.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                return None
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                found = _literals(data)
    except (OSError, ValueError):
        return None
    if len(found) != 1:
        return None
    return tuple(found.pop().decode("ascii").split())


def _literals(data: Any) -> set[bytes]:
    """Every C string in ``data`` that is nothing but arch names. Found from each ``sm_``/``compute_`` by the
    fast substring search (a regular expression tried at every byte of a 31 MiB library took 0.25 s), then the
    string around it, between the NULs on either side, matched whole."""
    found: set[bytes] = set()
    for anchor in (b"sm_", b"compute_"):
        at = data.find(anchor)
        while at != -1:
            start = data.rfind(b"\x00", max(0, at - _REACH), at)
            end = data.find(b"\x00", at, at + _REACH)
            if start != -1 and end != -1:
                text = data[start + 1 : end]
                if _LITERAL.fullmatch(text):
                    found.add(bytes(text))
            at = data.find(anchor, max(at + 1, end))
    return found


def wheel_digest(dist_info: Path) -> Optional[str]:
    """The digest of the installed wheel's own files as its RECORD lists them (see the module's words); None
    where RECORD is missing, unreadable, holds a row without a strong hash, or disagrees with a native library's
    size on disk: such a wheel is read every time."""
    try:
        text = (dist_info / "RECORD").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    ours = f"{dist_info.name}/"
    # Quotes, carriage returns and NULs are the csv module's to read (no wheel writes them).
    read = _read_csv if '"' in text or "\r" in text or "\x00" in text else _read_plain
    rows = read(text, ours, dist_info.parent)
    if not rows:
        return None
    return hashlib.sha256("\n".join(sorted(rows)).encode("utf-8")).hexdigest()


def _read_plain(text: str, ours: str, site: Path) -> Optional[list[str]]:
    """The wheel's own rows of a RECORD without quotes (wheels quote nothing), split at its commas: a fifth less
    time than the csv module for a torch's 12,000-16,000 rows (most of a create's build guard on a GPU node). A
    test holds it to :func:`_read_csv`'s answer."""
    return _own_rows((line.split(",") for line in text.split("\n") if line), ours, site)


def _read_csv(text: str, ours: str, site: Path) -> Optional[list[str]]:
    try:
        return _own_rows(csv.reader(io.StringIO(text)), ours, site)
    except csv.Error:
        return None


def _own_rows(rows: Iterable[list[str]], ours: str, site: Path) -> Optional[list[str]]:
    """The wheel's own rows as ``path,hash``; None where one has no strong hash or a native library's size on
    disk is not its row's."""
    own: list[str] = []
    for row in rows:
        if not row or _installers(row[0], ours):
            continue
        path, digest = row[0], row[1] if len(row) > 1 else ""
        if not digest.startswith(STRONG):
            return None
        if _NATIVE.search(path) and not _size_matches(site / path, row[2] if len(row) > 2 else ""):
            return None
        own.append(f"{path},{digest}")
    return own


def _installers(path: str, ours: str) -> bool:
    """Is this RECORD row one the installer wrote for this env (not a file of the wheel)? ``ours``: the
    dist-info directory's name and a slash."""
    if path.endswith(".pyc") or "__pycache__/" in path or path.startswith(("../", "/")):
        return True
    return path.startswith(ours) and path[len(ours) :] in INSTALLER_FILES


def _size_matches(path: Path, size: str) -> bool:
    try:
        return path.stat().st_size == int(size)
    except (OSError, ValueError):
        return False


class ArchCache:
    """The arch lists of torch wheels already read, under ``home``'s ``settings.torch_builds_cache``."""

    def __init__(self, home: Path, log: Callable[[str], None] = lambda _: None) -> None:
        self.home = home
        self.dir = settings.torch_builds_cache(home)
        self.log = log

    def path(self, digest: str) -> Path:
        return self.dir / f"{digest}.json"

    def recall(self, digest: str) -> Optional[tuple[str, ...]]:
        """The arch list remembered for the wheel of this digest; None (with a warning where an entry was there
        but cannot be trusted or read) otherwise."""
        path = self.path(digest)
        if not _DIGEST.fullmatch(digest) or not os.path.lexists(path):
            return None
        flags, why = _read_entry(path, self.home, digest)
        if why:
            text = f"ignoring the torch build cache entry {path}: {why}; reading the arch list from torch instead"
            self.log(f"warning: {text}")
            Out().warn(text)
        return flags

    def remember(self, digest: str, version: str, flags: tuple[str, ...]) -> None:
        """Keep ``flags`` for the wheel of this digest (atomically; a cache that cannot be written is said once)."""
        if not _DIGEST.fullmatch(digest):
            return
        path = self.path(digest)
        entry = {"version": VERSION, "digest": digest, "torch": version, "arch_flags": list(flags)}
        try:  # the directory, not the entry: a foreign or open entry is replaced by the user's own
            strictmodes.check(
                self.dir, root=self.home, what="the torch build cache", elsewhere="", above=False
            )
        except UnsafePath:
            return  # nothing is written where others could change it
        try:
            fsutil.write_atomic(path, json.dumps(entry, sort_keys=True).encode("utf-8"))
        except OSError as exc:
            fsutil.cache_unwritable(self.dir, exc)


def _read_entry(path: Path, home: Path, digest: str) -> tuple[Optional[tuple[str, ...]], str]:
    """The arch list of the entry at ``path``, or why it is not used ("" where it is)."""
    if path.is_symlink():
        return None, "it is a symbolic link"
    try:
        strictmodes.check(
            path, root=home, what="the torch build cache", elsewhere=f"remove {path}", above=False
        )
    except UnsafePath as exc:
        return None, str(exc)
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        return None, f"it cannot be read ({exc})"
    flags = _entry_flags(data, digest)
    return flags, "" if flags is not None else "it is not an entry of this release"


def _entry_flags(data: Any, digest: str) -> Optional[tuple[str, ...]]:
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("digest") != digest:
        return None
    flags = data.get("arch_flags")
    if not isinstance(flags, list) or not all(isinstance(f, str) and _FLAG.fullmatch(f) for f in flags):
        return None
    return tuple(flags)
