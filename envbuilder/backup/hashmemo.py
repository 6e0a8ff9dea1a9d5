"""What a stored file of a backup root hashed to, remembered beside it so that it is not read again unchanged.

A backup's wheels are large (4.5 GiB for a CUDA torch env): hashing them all costs restore and every new backup of
the same env more than the rest of the work. When a blob has been hashed in full and matched (written by backup,
read back by verify-backup, decompressed by restore), ``.NAME.sha256`` beside it records that digest with the
file's identity at that moment: size, modification and change times in nanoseconds, inode and device. A later
reader trusts the digest only where all of these are still the same. Writing the file's bytes, replacing it,
copying it back from elsewhere or changing its mode moves its change time, which only the kernel sets (``touch``
and ``utime`` cannot put it back), so a changed or swapped blob is hashed again. Not covered: a byte flipped by the
storage itself underneath the file system; ``envbuilder verify-backup`` always re-reads every byte for that.

The memo lives in the store, owned and written like the blob (someone who could forge it could also rewrite the
backup's record of the digest). A memo that is missing, unreadable, a symlink or of another shape is no memo."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import IO, Callable

from envbuilder.system import fsutil, removal

SUFFIX = ".sha256"


def _memo_rel(rel: str) -> str:
    head, _, name = rel.rpartition("/")
    return f"{head}/.{name}{SUFFIX}" if head else f".{name}{SUFFIX}"


def identity(st: os.stat_result) -> list[int]:
    """What must be unchanged for a remembered digest to hold."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def holds(root: Path, rel: str, sha256: str, st: os.stat_result) -> bool:
    """Whether the file ``rel`` of ``root``, whose ``fstat`` is ``st``, was hashed to ``sha256`` and is the same
    file, unchanged, since."""
    try:
        with removal.open_below(root, _memo_rel(rel)) as fh:
            memo = json.loads(fh.read(4096))
    except (OSError, ValueError):
        return False
    return isinstance(memo, dict) and memo.get("sha256") == sha256 and memo.get("identity") == identity(st)


def remember(root: Path, rel: str, sha256: str, before: os.stat_result, after: os.stat_result) -> None:
    """Record that ``rel`` hashed to ``sha256``: only where the file was the same before and after it was read
    (``before``/``after`` its fstat then). Best effort: a store that cannot take the memo is hashed next time."""
    if identity(before) != identity(after):
        return
    data = json.dumps({"sha256": sha256, "identity": identity(after)}).encode()
    mode = after.st_mode & 0o644
    with contextlib.suppress(OSError):
        fsutil.write_atomic(root / _memo_rel(rel), data, mode)


def matches(
    root: Path,
    rel: str,
    fh: IO[bytes],
    sha256: str,
    digest_of: Callable[[IO[bytes]], str],
    *,
    trust: bool = True,
) -> bool:
    """Whether the file ``rel`` of ``root``, open as ``fh``, holds ``sha256``: the remembered digest where
    ``trust`` and it holds for this very file, else ``digest_of(fh)`` (remembered when it matched)."""
    before = os.fstat(fh.fileno())
    if trust and holds(root, rel, sha256, before):
        return True
    if digest_of(fh) != sha256:
        return False
    remember(root, rel, sha256, before, os.fstat(fh.fileno()))
    return True


def beside(blob: Path) -> Path:
    """Where the memo of the blob at ``blob`` is (removed with the blob)."""
    return blob.with_name(f".{blob.name}{SUFFIX}")
