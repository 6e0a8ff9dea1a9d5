"""What the catalog's scan learned from each recipe file, kept in the envbuilder home between runs.

Every command that names a recipe scans the whole recipe path, because a recipe's name is inside its file: with
the shipped recipes that is some 20 TOML parses (about 20 ms) before the command can start. A file whose
identity and times are unchanged since the last scan (device, inode, size, mtime, ctime, mode: ``os.stat``
taken before the file is read, so a file changed during the read is parsed again next time) gives what the scan
needs from it without a parse: whether it holds a recipe, the name, the description and the site. Only parsed
files are kept; a broken file is parsed again on every scan, so its error is always the file's own. An unreadable
or malformed cache is ignored, and a cache that cannot be written is left as it was: it only ever saves time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from envbuilder.system import fsutil
from envbuilder.system.fsutil import Key

VERSION = 1
#: What a summary holds besides its key: ``recipe`` (a bool: False for a base file) and these strings.
FIELDS = ("name", "description", "site", "status")


class ScanCache:
    """The summaries of one scan's files, read from ``path`` (None: nothing is kept)."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self._old: dict[str, dict[str, Any]] = (
            {} if path is None else fsutil.read_cache(path, VERSION, "files")
        )
        self._new: dict[str, dict[str, Any]] = {}

    def get(self, path: Path, key: Optional[Key]) -> Optional[dict[str, Any]]:
        """The summary kept for ``path`` when its key is still ``key``."""
        if key is None:
            return None
        kept = self._old.get(str(path))
        if kept is None or not _valid(kept) or kept["key"] != key:
            return None
        self._new[str(path)] = kept
        return kept

    def put(self, path: Path, key: Optional[Key], summary: dict[str, Any]) -> None:
        if key is not None:
            self._new[str(path)] = {"key": key, **summary}

    def save(self) -> None:
        """Write what this scan saw (files no longer on the path drop out), unless nothing changed."""
        if self.path is None or self._new == self._old:
            return
        fsutil.write_cache(self.path, VERSION, "files", self._new)


def _valid(kept: Any) -> bool:
    return (
        isinstance(kept, dict)
        and isinstance(kept.get("key"), list)
        and isinstance(kept.get("recipe"), bool)
        and all(isinstance(kept.get(name), str) for name in FIELDS)
    )
