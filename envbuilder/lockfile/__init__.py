"""Lockfiles: the exact packages a recipe resolves to, per target platform, with their hashes.

The package's face: what callers outside it use. ``model`` is the format (the lock, its platforms and packages,
written as TOML); ``targets`` what a lock is for (architectures, platform tags, the inputs it was resolved from);
``reader`` parses a lock or a resolver's output. All of it is pure and below the recipe: whether a lock applies to a
plan is ``plan.lockfit``'s, making one ``build.lockers``'.
"""

from __future__ import annotations

from envbuilder.lockfile import condalock, pylock
from envbuilder.lockfile.model import (
    ARCHES,
    ENGINES,
    SUFFIX,
    Lock,
    LockedFile,
    LockedPackage,
    Locker,
    LockSummary,
    PlatformLock,
    nightly_warning,
)
from envbuilder.lockfile.reader import parse, read, user_path
from envbuilder.lockfile.targets import arch_name, conda_subdir, inputs, python_platform, recipe_sha256

__all__ = [
    "ARCHES",
    "ENGINES",
    "SUFFIX",
    "Lock",
    "LockSummary",
    "LockedFile",
    "LockedPackage",
    "Locker",
    "PlatformLock",
    "arch_name",
    "conda_subdir",
    "condalock",
    "inputs",
    "nightly_warning",
    "parse",
    "pylock",
    "python_platform",
    "read",
    "recipe_sha256",
    "user_path",
]
