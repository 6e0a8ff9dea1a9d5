"""The upkeep of a backup root: verifying a backup (every byte it holds re-hashed), pruning old backups and the
stored wheels no backup uses any more, and the advice ``list`` and ``create`` give about an env's safety."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import field
from pathlib import Path
from typing import Any, Optional

from envbuilder.backup import hashmemo, image, wheelhouse
from envbuilder.backup.catalog import Backup, backups, listing, read
from envbuilder.backup.writer import modes, pack_workers
from envbuilder.core.errors import UsageError
from envbuilder.core.structs import dataclass
from envbuilder.system import fsutil, purge, removal, state, transaction


def verify(
    b: Backup,
    record_result: bool = True,
    hash_wheels: bool = True,
    cancel: Optional[threading.Event] = None,
    memo: bool = False,
) -> list[str]:
    """Re-hash everything the backup holds; the problems found (none: it restores as written). With
    ``hash_wheels`` false the stored wheels (or a container env's image) are only checked for presence and size
    (restore hashes them as it decompresses or copies them, before anything is put in place). Once ``cancel`` is
    set, wheels not yet started are skipped (restore stops checking when it turns to decompressing, which checks
    them anyway). ``memo``: a stored wheel whose digest is remembered for it, unchanged since it was hashed
    (hashmemo), is not read again (restore from uv's cache); verify-backup reads every byte."""
    problems: list[str] = [b.error] if b.error else []
    if not b.error:
        if b.mode == "wheelhouse":
            wheels = list(b.data.get("wheels", ()))
            with ThreadPoolExecutor(max_workers=pack_workers(len(wheels))) as pool:
                found = pool.map(
                    lambda w: (
                        []
                        if cancel is not None and cancel.is_set()
                        else _check_file(
                            b.root,
                            w["path"],
                            w["size"],
                            w["sha256"] if hash_wheels else None,
                            w["name"],
                            memo=memo,
                        )
                    ),
                    wheels,
                )
                for more in found:
                    problems += more
        elif b.mode == "image":
            img = b.data.get("image", {})
            rel = b.path.relative_to(b.root).as_posix()
            digest = img["sha256"] if hash_wheels else None
            problems += _check_file(b.root, f"{rel}/{img['file']}", img["size"], digest, "the image")
            layer = b.data.get("overlay")
            if layer:  # the overlay venv's archive: small beside the image, hashed always
                problems += _check_file(
                    b.root, f"{rel}/{layer['file']}", layer["size"], layer["sha256"], "the overlay venv"
                )
                problems += _manifest(b, rel, image.OVERLAY_MANIFEST, layer.get("manifest_sha256"))
        else:
            arc = b.data.get("archive", {})
            rel = b.path.relative_to(b.root).as_posix()
            problems += _check_file(b.root, f"{rel}/{arc['file']}", arc["size"], arc["sha256"], "the archive")
            problems += _manifest(b, rel, "manifest.json", arc.get("manifest_sha256"))
    if record_result and b.path.is_dir():
        result = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "ok": not problems, "problems": problems}
        file_mode, _ = modes(b.path)
        with contextlib.suppress(OSError):
            fsutil.write_atomic(b.path / "verify.json", json.dumps(result).encode(), file_mode & 0o644)
    return problems


def _manifest(b: Backup, rel: str, name: str, recorded: Optional[str]) -> list[str]:
    """A problem where the backup's manifest ``name`` is missing or not the one written."""
    try:
        digest = hashlib.sha256(read(b.root, f"{rel}/{name}")).hexdigest()
    except OSError:
        digest = "missing"
    return [] if digest == recorded else [f"{name} is missing or changed"]


def _check_file(
    root: Path, rel: str, size: int, digest: Optional[str], what: str, *, memo: bool = False
) -> list[str]:
    """Problems with the file ``rel`` of the backup root, read without following a symlink. ``memo``: a digest
    remembered for this very file, unchanged since (hashmemo), is taken without reading it again."""
    path = root / rel
    try:
        with removal.open_below(root, rel) as fh:
            actual_size = os.fstat(fh.fileno()).st_size
            if actual_size != size:
                return [f"{what}: {path} has {actual_size} bytes, {size} were written"]
            if digest is not None and not hashmemo.matches(
                root, rel, fh, digest, wheelhouse.fh_sha256, trust=memo
            ):
                return [f"{what}: {path} does not match its sha256 (a changed or damaged byte)"]
    except FileNotFoundError:
        return [f"{what}: {path} is missing"]
    except OSError as exc:
        return [f"{what}: {path} is unreadable: {exc.strerror}"]
    return []


@dataclass
class PruneResult:
    removed: list[str]
    blobs: int
    freed: int
    #: What was in the way and left, in words: a symlink (or another entry envbuilder did not write) in the root.
    left: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "removed": self.removed,
            "blobs_removed": self.blobs,
            "bytes_freed": self.freed,
            "left": self.left,
        }


def prune(root: Path, keep: int, env: Optional[str] = None, dry_run: bool = False) -> PruneResult:
    """Keep the newest ``keep`` backups of each env (of ``env`` only, if given); then remove the stored wheels
    no remaining backup uses. Only what envbuilder wrote goes: an entry reached through a symlink, or one that
    is a symlink, is left and named in ``left``. Call with writer_mutex held."""
    if keep < 1:
        raise UsageError("--keep must be 1 or more (remove backups by hand to drop every one)")
    by_env: dict[str, list[Backup]] = {}
    found, skipped = listing(root)
    for b in found:
        by_env.setdefault(b.env, []).append(b)
    doomed = []
    for name, mine in by_env.items():
        if env is None or name == env:
            doomed += mine[: max(0, len(mine) - keep)]
    result = PruneResult([], 0, 0, left=skipped)
    gone = []
    for b in doomed:
        size = _files_size(b.path)
        # Out of the listing first (one rename), then deleted; named so that writer_mutex clears what an
        # interrupted prune left.
        aside = f"{transaction.PARTIAL}pruned-{b.stamp}"
        why = removal.remove_below(root, b.path, aside=aside, dirs=True, dry_run=dry_run)
        if why:
            result.left.append(why)
            continue
        gone.append(b)
        result.removed.append(b.id)
        result.freed += size
    keep_paths = {w["path"] for b in backups(root) if b not in gone for w in b.data.get("wheels", ())}
    for blob in list(wheelhouse.Store(root).blobs()):
        if str(blob.relative_to(root)) in keep_paths:
            continue
        size = 0
        with contextlib.suppress(OSError):
            size = blob.lstat().st_size
        why = removal.remove_below(root, blob, dry_run=dry_run)
        if why:
            result.left.append(why)
            continue
        result.blobs += 1
        result.freed += size
        memo = hashmemo.beside(blob)
        if memo.is_symlink() or memo.exists():
            why = removal.remove_below(root, memo, dry_run=dry_run)
            if why:
                result.left.append(why)
    return result


def _files_size(path: Path) -> int:
    """The bytes of the regular files directly in ``path`` (none followed through a link)."""
    total = 0
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def advice(record: state.EnvRecord, health: str, have_backup: bool) -> Optional[str]:
    """The one thing to do about an env's safety (for list and create), or None."""
    if health in ("gone", "damaged") and have_backup:
        return f"envbuilder restore {record.name}" + (" --force" if health == "damaged" else "")
    if health == "ok" and not have_backup and purge.policy(record):
        return f"envbuilder backup {record.name}"
    return None
