"""What an env's files are measured for once, when envbuilder makes the env (create, restore) or refreshes their
access times (touch), and kept in its record: so that ``list``, ``show`` and ``doctor`` stat a few files per env
instead of walking it. The walk itself is :mod:`envwalk`'s.

- ``sentinels``: one file of each installed distribution (the first its RECORD lists outside its dist-info), which
  a removed package takes with it, and SPREAD files spread evenly over all the packages' files, which damage
  here and there hits.
- ``oldest`` (envs on a purged file system only): the SAMPLE least recently read files with their access times,
  and ``next``: the access time of the least recently read file outside the sample. Access times only move
  forward (a read, a touch), so the least recently read file of the env is never older than the oldest of the
  sample's current times and ``next``: the estimate is exact while that file is in the sample (it is: the files
  nobody reads stay the oldest) and errs on the early side otherwise. These are also the purge's first victims,
  which the health check looks for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

#: How many of the least recently read files are kept.
SAMPLE = 16
#: How many files spread over the installed packages the health check looks for (beside one per package): with
#: 5% of an env's files deleted at random, none of the ~64 it checks is gone about once in 25.
SPREAD = 48


def sentinels(prefix: Path) -> list[str]:
    """The files of the env the health check looks for, relative to ``prefix``: the first file of each installed
    distribution and SPREAD more spread evenly over all of them."""
    first, every = [], []
    for record in sorted(prefix.glob("lib/python*/site-packages/*.dist-info/RECORD")):
        site = os.path.relpath(record.parent.parent, prefix)
        try:
            lines = record.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        # Strings, not Paths: a CUDA torch's RECORDs list some 30,000 files.
        listed = [f"{site}/{rel}" for rel in map(_listed, lines) if rel]
        first += listed[:1]
        every += listed
    step = max(1, len(every) // SPREAD)
    return list(dict.fromkeys([*first, *every[step // 2 :: step][:SPREAD]]))


def _listed(line: str) -> str:
    """The file a RECORD line names, where it is one of the package's own (not bytecode, its dist-info or a
    script outside site-packages)."""
    rel = line.split(",", 1)[0]
    if not rel or rel.startswith("..") or "__pycache__" in rel or rel.split("/", 1)[0].endswith(".dist-info"):
        return ""
    return rel


def recorded(files: Mapping[str, Any]) -> bool:
    """Whether a record's ``files`` were measured (records of earlier releases have none)."""
    return "sentinels" in files


def checked(files: Mapping[str, Any]) -> list[str]:
    """The files the health check looks for: the sentinels and the purge's first victims."""
    oldest = [str(rel) for rel, _ in files.get("oldest") or () if "__pycache__" not in str(rel)]
    return list(dict.fromkeys([*files.get("sentinels", ()), *oldest]))


def oldest_access(prefix: Path, files: Mapping[str, Any]) -> tuple[Optional[float], Optional[str]]:
    """The earliest access time of the env's files from the sample (one lstat per sampled file), and which file
    had it (None where it is one outside the sample: then the time is ``next``, as measured)."""
    least: Optional[float] = files.get("next")
    which: Optional[str] = None
    for rel, _ in files.get("oldest") or ():
        try:
            atime = os.lstat(prefix / rel).st_atime
        except OSError:
            continue  # purged or removed: the health check says so
        if least is None or atime < least:
            least, which = atime, str(rel)
    return least, which
