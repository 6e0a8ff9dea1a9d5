"""A container env's backup (mode ``image``): its one image file copied to the backup root as it is (a SIF or
squashfs is compressed already), hashed as it is read and checked against the sha256 create recorded, so that a
backup never holds an image other than the one the env was built and checked with; the env's record goes into
``backup.json`` as for every backup. Restore copies it back beside the target, hashed again, and writes the
record inside it. Neither reads the image through a symlink."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Callable

from envbuilder.core.errors import BackupError
from envbuilder.system import removal, state


def image_file(record: state.EnvRecord) -> str:
    """The image file's name under the env's prefix."""
    box = (record.plan or {}).get("container") or {}
    return Path(str(record.tools.get("image_file") or box.get("file") or "image.sif")).name


def copy_hashing(source: IO[bytes], dest: Path, file_mode: int) -> tuple[str, int]:
    """``source`` written to the new file ``dest`` (never an existing one, nor through a link); its sha256 and
    size."""
    digest = hashlib.sha256()
    size = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, file_mode)
    with os.fdopen(fd, "wb") as out:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
            out.write(block)
            size += len(block)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest(), size


def store(
    record: state.EnvRecord, prefix: Path, partial: Path, file_mode: int, step: Callable[[str], None]
) -> dict[str, Any]:
    """The env's image copied into the backup being written at ``partial``; what ``backup.json`` says of it."""
    name = image_file(record)
    recorded = str(record.tools.get("image_sha256") or "")
    if ((record.plan or {}).get("container") or {}).get("overlay"):
        # Its venv of packages on top is not part of an image backup: a restore of the image alone would report
        # an env whose programs cannot find their python.
        raise BackupError(
            f"{record.name} has packages on top of its image (container.packages, the venv in {prefix / 'venv'}), "
            "which an image backup does not hold yet: nothing was backed up",
            hint=f"rebuild it where needed with envbuilder create {record.name} (the image's digest is recorded)",
        )
    step(f"copying {prefix / name}")
    try:
        with removal.open_below(prefix, name) as fh:
            sha, size = copy_hashing(fh, partial / name, file_mode)
    except FileNotFoundError:
        raise BackupError(
            f"{record.name}'s image {prefix / name} is missing: there is nothing to back up",
            hint=f"envbuilder restore {record.name} --force (from an earlier backup) or "
            f"envbuilder create {record.name} --force",
        ) from None
    if recorded and sha != recorded:
        raise BackupError(
            f"{record.name}'s image {prefix / name} is not the one recorded (sha256 {sha[:16]}…, recorded "
            f"{recorded[:16]}…): it changed since it was built, so it was not backed up",
            hint=f"envbuilder create {record.name} --force (or restore an earlier backup), then back it up",
        )
    return {"image": {"file": name, "sha256": sha, "size": size}, "bytes": size, "new_bytes": size}


def put_back(root: Path, rel: str, data: Mapping[str, Any], partial: Path) -> None:
    """The backup's image (``rel``: the backup's directory under ``root``) copied into ``partial``, hashed
    again; a byte that differs from what the backup recorded stops the restore."""
    image = data["image"]
    partial.mkdir(mode=0o755)
    try:
        with removal.open_below(root, f"{rel}/{image['file']}") as fh:
            sha, _ = copy_hashing(fh, partial / image["file"], 0o644)
    except OSError as exc:
        raise BackupError(
            f"cannot read the backup's image {root / rel / image['file']}: {exc.strerror}"
        ) from None
    if sha != image["sha256"]:
        raise BackupError(
            f"the backup's image {root / rel / image['file']} does not match its sha256 (a changed or damaged "
            f"byte: {sha[:16]}…, written as {image['sha256'][:16]}…), so nothing was restored",
            hint="envbuilder verify-backup checks it; restore an older one: envbuilder backups NAME, then --backup ID",
        )
