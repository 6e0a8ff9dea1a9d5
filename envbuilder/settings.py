"""Where envbuilder keeps things, decided in one place: its home (records, locks, caches, logs)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def home(env: Mapping[str, str]) -> Path:
    """Where records live: $ENVBUILDER_HOME, else $WORK/.envbuilder (not purged), else ~/.envbuilder."""
    if env.get("ENVBUILDER_HOME"):
        return Path(env["ENVBUILDER_HOME"])
    if env.get("WORK"):
        return Path(env["WORK"]) / ".envbuilder"
    return Path(env.get("HOME") or Path.home()) / ".envbuilder"
