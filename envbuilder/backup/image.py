"""A container env's backup (mode ``image``): its one image file copied to the backup root as it is (a SIF or
squashfs is compressed already), hashed as it is read and checked against the sha256 create recorded, so that a
backup never holds an image other than the one the env was built and checked with; the env's record goes into
``backup.json`` as for every backup. Where container.packages made an overlay venv beside the image, an archive of
that venv goes beside the image file (``overlay.tar.zst`` and its manifest, as an archive backup of an env), so
that the restored env runs the same packages on the same image. Restore copies the image back beside the target,
hashed again, unpacks the overlay (relocated at another prefix), and writes the record inside. Neither reads the
backup through a symlink."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Callable, Optional

from envbuilder.backup import archive, wheelhouse
from envbuilder.core.errors import BackupError
from envbuilder.plan.container import OVERLAY_DIR
from envbuilder.system import fsutil, relocate, removal, state

#: The overlay venv's archive and manifest in an image backup (the archive's suffix is the compressor's).
OVERLAY_STEM = "overlay"
OVERLAY_MANIFEST = "overlay-manifest.json"


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
    overlay = bool(((record.plan or {}).get("container") or {}).get("overlay"))
    if overlay:  # before the image is read: a missing overlay stops the backup at once
        _overlay_dir(record, prefix)
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
    data: dict[str, Any] = {
        "image": {"file": name, "sha256": sha, "size": size},
        "bytes": size,
        "new_bytes": size,
    }
    if overlay:
        data["overlay"] = _store_overlay(record, prefix, partial, file_mode, step)
        data["bytes"] = data["new_bytes"] = size + data["overlay"]["size"]
    return data


def _overlay_dir(record: state.EnvRecord, prefix: Path) -> Path:
    """The env's overlay venv, a directory of its own (not a link); else the BackupError that says so."""
    venv = prefix / OVERLAY_DIR
    removal.refuse_link(venv, "the overlay venv envbuilder made")
    if not venv.is_dir():
        raise BackupError(
            f"{record.name}'s overlay venv {venv} (container.packages) is missing: a backup of the image alone "
            "would restore an env without its packages, so nothing was backed up",
            hint=f"envbuilder create {record.name} --force, then back it up",
        )
    return venv


def _store_overlay(
    record: state.EnvRecord, prefix: Path, partial: Path, file_mode: int, step: Callable[[str], None]
) -> dict[str, Any]:
    """The overlay venv (container.packages) archived into ``partial`` with its manifest; what backup.json says."""
    venv = _overlay_dir(record, prefix)
    step(f"archiving the overlay venv {venv}")
    packed, manifest = archive.pack(venv, partial, "tar", archive.Tools.find())
    name = OVERLAY_STEM + packed[len("env") :]  # env.tar.zst -> overlay.tar.zst
    (partial / packed).rename(partial / name)
    (partial / name).chmod(file_mode)
    text = (json.dumps(manifest, separators=(",", ":")) + "\n").encode()
    fsutil.write_atomic(partial / OVERLAY_MANIFEST, text, file_mode)
    return {
        "file": name,
        "dir": OVERLAY_DIR,
        "sha256": wheelhouse.file_sha256(partial / name),
        "size": (partial / name).stat().st_size,
        "manifest_sha256": hashlib.sha256(text).hexdigest(),
        "entries": len(manifest),
    }


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


def put_back_overlay(
    root: Path, rel: str, data: Mapping[str, Any], partial: Path, moved: Optional[tuple[str, str]]
) -> Optional[relocate.Relocation]:
    """The backup's overlay venv (if it holds one) unpacked into ``partial`` (checked against its sha256 and
    manifest), relocated where ``moved`` (old prefix, new prefix) says the env moves."""
    layer = data.get("overlay")
    if not layer:
        return None
    where = f"{rel}/{layer['file']}"
    problems = _file_problems(root, where, layer["size"], layer["sha256"])
    try:
        with removal.open_below(root, f"{rel}/{OVERLAY_MANIFEST}") as fh:
            text = fh.read()
    except OSError as exc:
        problems.append(f"{OVERLAY_MANIFEST} is unreadable: {exc.strerror}")
        text = b""
    if text and hashlib.sha256(text).hexdigest() != layer["manifest_sha256"]:
        problems.append(f"{OVERLAY_MANIFEST} changed since the backup was written")
    if problems:
        raise BackupError(
            f"the backup's overlay venv {root / where}: {problems[0]}, so nothing was restored",
            hint="envbuilder verify-backup checks it; restore an older one: envbuilder backups NAME, then --backup ID",
        )
    venv = partial / str(layer.get("dir") or OVERLAY_DIR)
    archive.unpack(root / where, venv, archive.Tools.find(), root=root)
    left = archive.check_tree(venv, json.loads(text))
    if left:
        raise BackupError(f"the unpacked overlay venv differs from its manifest: {left[0]}")
    if moved is None or moved[0] == moved[1]:
        return None
    return relocate.relocate(venv, f"{moved[0]}/{OVERLAY_DIR}", f"{moved[1]}/{OVERLAY_DIR}")


def _file_problems(root: Path, rel: str, size: int, sha256: str) -> list[str]:
    """What is wrong with the backup's file ``rel`` (read without following a link): missing, size, sha256."""
    try:
        with removal.open_below(root, rel) as fh:
            if os.fstat(fh.fileno()).st_size != size:
                return [f"{os.fstat(fh.fileno()).st_size} bytes, {size} were written"]
            if wheelhouse.fh_sha256(fh) != sha256:
                return ["it does not match its sha256 (a changed or damaged byte)"]
    except OSError as exc:
        return [f"unreadable: {exc.strerror}"]
    return []


def rebased(value: Any, old: str, new: str) -> Any:
    """``value`` (a record's container part) with each path under ``old`` (the prefix) moved under ``new``."""
    if isinstance(value, str):
        return value.replace(old.rstrip("/") + "/", new.rstrip("/") + "/")
    if isinstance(value, list):
        return [rebased(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: rebased(v, old, new) for k, v in value.items()}
    return value
