"""Putting the payloads where the env's python runs them. This module is envbuilder's, not a payload: the copy
leaves out every file whose name starts with an underscore (this one, ``__init__.py``)."""

import shutil
from pathlib import Path

#: Where the payloads are, for the commands that run them (never imported by the payloads themselves).
DIR = Path(__file__).resolve().parent


def copy_to(dest: Path) -> Path:
    """Copy the payloads into ``dest`` (made if missing): compute nodes see the env's file system, not
    necessarily where envbuilder is installed. Returns ``dest``."""
    dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    for src in DIR.iterdir():
        if src.suffix in (".py", ".sh") and not src.name.startswith("_"):
            # A new file with its own times (not copy2's): the scratch purge removes files by access time, and
            # the installed payload's may be a day old (relatime), which made a new env's oldest file a day old.
            shutil.copyfile(src, dest / src.name)
            (dest / src.name).chmod(0o755 if src.suffix == ".sh" else 0o644)
    return dest


def into_env(prefix: Path) -> Path:
    """The env's own copy of the payloads, ``PREFIX/envbuilder/payloads`` (written by create and restore,
    refreshed before run and sbatch): job scripts name it, because compute nodes see the env's file system."""
    return copy_to(prefix / "envbuilder" / "payloads")
