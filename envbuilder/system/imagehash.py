"""The sha256 of a container env's image file (one file, often several GB): read in full where asked to verify
(backup, restore), or kept with the file's identity and times (``fsutil.file_key``: device, inode, size, mtime,
ctime, mode) so that a check that runs often (doctor) reads an image once and again only once it was replaced or
written."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import IO

from envbuilder.system import fsutil

#: The cache file's format (``fsutil.read_cache``).
CACHE_VERSION = 1


def fh_sha256(fh: IO[bytes]) -> str:
    """The sha256 of what ``fh`` holds from where it stands."""
    digest = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return fh_sha256(fh)


def cached_sha256(path: Path, cache: Path) -> str:
    """``path``'s sha256, read only where ``cache`` holds none for the file as it is now (raises OSError where
    the file cannot be read)."""
    key = fsutil.file_key(path)  # before the read: a change during it is a new key next time
    entries = fsutil.read_cache(cache, CACHE_VERSION, "images")
    known = entries.get(str(path))
    if key is not None and isinstance(known, dict) and known.get("key") == key and known.get("sha256"):
        return str(known["sha256"])
    digest = sha256(path)
    if key is not None:
        entries = {p: e for p, e in entries.items() if p == str(path) or Path(p).exists()}
        entries[str(path)] = {"key": key, "sha256": digest}
        fsutil.write_cache(cache, CACHE_VERSION, "images", entries)
    return digest
