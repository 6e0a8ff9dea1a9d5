"""Moving an env's files to another prefix: the old prefix is rewritten where that is known to be safe (script
headers and activate files in ``bin``, ``pyvenv.cfg``, ``.pth`` files, conda's activate.d/deactivate.d, the
env's own record); every other file that still names the old prefix is reported, not touched. Used by conda
builds (built beside, renamed into place), conda clones and archive restores at a new prefix.
"""

from __future__ import annotations

import re
import shlex
import stat
from pathlib import Path
from typing import Any

from envbuilder.core.structs import dataclass
from envbuilder.system import fsutil


@dataclass(frozen=True)
class Relocation:
    rewritten: tuple[str, ...]
    left: tuple[str, ...]  # files that still name the old prefix (binaries, data): not touched
    bytecode: int  # .pyc files naming the old prefix (only their tracebacks show it)

    def to_json(self) -> dict[str, Any]:
        return {"rewritten": list(self.rewritten), "left": list(self.left), "bytecode": self.bytecode}


def _safe_to_rewrite(rel: Path) -> bool:
    parts = rel.parts
    if len(parts) == 2 and parts[0] == "bin":
        return True  # script headers and activate files
    if rel.name == "pyvenv.cfg" and len(parts) == 1:
        return True
    if rel.suffix == ".pth" and "site-packages" in parts:
        return True
    if len(parts) >= 4 and parts[:2] == ("etc", "conda") and parts[2] in ("activate.d", "deactivate.d"):
        return True
    return parts[0] == "envbuilder" and rel.suffix in (".sh", ".json", ".txt")


@dataclass(frozen=True)
class Found:
    """The files of an env that name its prefix, by what a move may do with them."""

    safe: tuple[str, ...]  # text files where the prefix is known to be safe to rewrite
    left: tuple[str, ...]  # every other file that names it (binaries, data)
    bytecode: int  # .pyc files naming it (only their tracebacks show it)


def find(root: Path, old: str, *, every_text_file: bool = False) -> Found:
    """The files under ``root`` (never through a link, nor a link itself) that name ``old``. ``every_text_file``:
    any text file is safe to rewrite (a conda env's, whose packages had their prefix placeholders filled in as
    text, as conda-unpack rewrites them)."""
    safe: list[str] = []
    left: list[str] = []
    bytecode = 0
    for path in fsutil.walk(root):
        if path.is_symlink() or not path.is_file():
            continue
        rel = path.relative_to(root)
        data = path.read_bytes()
        if old.encode() not in data:
            continue
        if rel.suffix == ".pyc":
            bytecode += 1
            continue
        text = b"\0" not in data[:8192]
        (safe if text and (every_text_file or _safe_to_rewrite(rel)) else left).append(str(rel))
    return Found(tuple(safe), tuple(left), bytecode)


def relocate(root: Path, old: str, new: str) -> Relocation:
    """Rewrite ``old`` to ``new`` (as a whole path: ``/a/env`` never matches inside ``/a/env2``) in the files
    where that is safe; list the rest. A new path that would need shell or JSON quoting is never written into
    scripts: every file is then listed as left."""
    plain = shlex.quote(new) == new and '"' not in new and "\\" not in new
    found = find(root, old)
    if not plain:
        return Relocation((), found.safe + found.left, found.bytecode)
    for rel in found.safe:
        path = root / rel
        mode = path.stat().st_mode
        path.write_bytes(whole_path(old).sub(new.encode(), path.read_bytes()))
        path.chmod(stat.S_IMODE(mode))
    return Relocation(found.safe, found.left, found.bytecode)


def whole_path(old: str) -> re.Pattern[bytes]:
    """``old`` as a whole path: followed by ``/``, white space, a quote, ``:;=)]``, NUL or the end (unpack.sh's
    awk rewrite, envbuilder/payloads/_unpack.sh, follows the same rule)."""
    return re.compile(re.escape(old.encode()) + rb"(?=[/\s\"':;=)\]]|\x00|$)")
