"""An installer's version for the env's record, remembered per program file in the envbuilder home.

Asking ``uv --version`` costs a process start on every create (~12 ms of a warm create's few hundred). The answer
is kept with the program file's identity and times (``fsutil.file_key``: device, inode, size, mtime, ctime, mode),
so an upgraded or replaced program is asked again. Only a program that is one file of its own is remembered (not
``python -m something``, whose answer depends on the env). An unreadable or malformed cache is ignored, and one that
cannot be written is left as it was: it only ever saves time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from envbuilder.backends.buildlog import BuildLog, run_logged
from envbuilder.core.errors import EnvbuilderError
from envbuilder.system import fsutil

VERSION = 1


def version(program: Sequence[str], env: Mapping[str, str], log: BuildLog, cache: Path) -> Optional[str]:
    """What ``program --version`` says (its second word), from ``cache`` while the program file is unchanged;
    None where the program cannot say."""
    key = fsutil.file_key(Path(program[0])) if len(program) == 1 else None
    kept = fsutil.read_cache(cache, VERSION, "tools")
    entry = kept.get(program[0]) if key is not None else None
    if isinstance(entry, dict) and entry.get("key") == key and isinstance(entry.get("version"), str):
        log.write(f"{program[0]} --version: {entry['version']} (remembered: the program is unchanged)")
        return str(entry["version"])
    try:
        said = run_logged([*program, "--version"], env, log).stdout.split()[1]
    except (EnvbuilderError, IndexError):
        return None
    if key is not None:
        kept[program[0]] = {"key": key, "version": said}
        fsutil.write_cache(cache, VERSION, "tools", kept)
    return said
