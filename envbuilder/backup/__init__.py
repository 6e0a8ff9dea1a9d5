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

from typing import TYPE_CHECKING

from envbuilder.core.faces import lazy

if TYPE_CHECKING:  # `X as X`: mypy's strict re-exports; several on a line (ruff's I001 is off for faces)
    from envbuilder.backup.catalog import BACKUP_VERSION as BACKUP_VERSION, Backup as Backup, find as find
    from envbuilder.backup.catalog import backups as backups, checksum as checksum, listing as listing
    from envbuilder.backup.upkeep import PruneResult as PruneResult, advice as advice, prune as prune
    from envbuilder.backup.upkeep import verify as verify
    from envbuilder.backup.writer import BackupResult as BackupResult, default_mode as default_mode
    from envbuilder.backup.writer import make as make, make_all as make_all, pack_workers as pack_workers
    from envbuilder.backup.writer import writer_mutex as writer_mutex

__all__, __getattr__ = lazy(
    __name__,
    {
        "catalog": "BACKUP_VERSION Backup backups checksum find listing",
        "upkeep": "PruneResult advice prune verify",
        "writer": "BackupResult default_mode make make_all pack_workers writer_mutex",
    },
)
