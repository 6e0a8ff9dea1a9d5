"""Backups of envs to a place the scratch purge does not reach ($WORK), and their upkeep.

Layout under the backup root::

    envs/NAME/STAMP/backup.json      what the backup holds (the env's record, its wheels or its archive)
    envs/NAME/STAMP/manifest.json    archive mode: every entry of the env with its sha256
    envs/NAME/STAMP/env.tar.zst      archive mode: the env itself (or env.sqfs, env.tar)
    envs/NAME/STAMP/image.sif        image mode: a container env's image file as it is (``image``)
    envs/NAME/STAMP/overlay.tar.zst  image mode: its overlay venv (container.packages), with overlay-manifest.json
    envs/NAME/STAMP/verify.json      the last verify-backup result
    store/ab/DIGEST.whl.zst          wheelhouse mode: each wheel once, shared by every backup
    locks/backups.lock               one writer at a time (fsutil.Mutex: works on Lustre and NFS)

A backup is written in ``envs/NAME/.partial-STAMP-PID`` and renamed to ``STAMP`` when complete (a
``transaction``), so an interrupted backup is never listed; the next writer removes what it left. ``backup.json``
carries a checksum of its own content.

Listing and reading backups is ``catalog``'s, making them ``writer``'s, verifying and pruning them (and the advice
on an env's safety) ``upkeep``'s; ``restore`` puts one back. This package names what callers use from all three.
"""

from __future__ import annotations

from envbuilder.backup.catalog import BACKUP_VERSION, Backup, backups, checksum, find, listing
from envbuilder.backup.upkeep import PruneResult, advice, prune, verify
from envbuilder.backup.writer import (
    BackupResult,
    default_mode,
    make,
    make_all,
    pack_workers,
    writer_mutex,
)

__all__ = [
    "BACKUP_VERSION",
    "Backup",
    "BackupResult",
    "PruneResult",
    "advice",
    "backups",
    "checksum",
    "default_mode",
    "find",
    "listing",
    "make",
    "make_all",
    "pack_workers",
    "prune",
    "verify",
    "writer_mutex",
]
