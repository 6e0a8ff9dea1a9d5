"""A portable archive of one env (``backup ENV --portable``): a single tar that unpacks and relocates with no
envbuilder, as conda-pack's and pixi-pack's do. It holds, at its top::

    unpack.sh        POSIX sh (envbuilder/payloads/_unpack.sh): checks, extracts and rewrites the old prefix
    portable.json    env name, recipe, torch build, old prefix, created-at, what names the old prefix
    prefix.txt       the old prefix, exactly
    rewrite.txt      the files unpack.sh rewrites, one a line (relocate's knowledge, decided here)
    links.txt        the symlinks whose absolute target is in the old prefix: each one's path, then the rest
                     of its target, one a line (unpack.sh makes them point into the new prefix)
    payload.tar.zst  the env's files (archive mode's tar), zstd where zstd is on PATH, else payload.tar.gz
    payload.sha256   sha256sum's format, for the payload and every file above but unpack.sh: unpack.sh checks it

The outer tar is not compressed (its payload is). It is written beside its final name and renamed into place,
no more readable than the env (as a backup).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Callable, cast

from envbuilder import __version__, payloads
from envbuilder.backup import archive, wheelhouse
from envbuilder.backup.writer import modes
from envbuilder.core import kinds
from envbuilder.core.errors import BackupError
from envbuilder.core.structs import dataclass
from envbuilder.system import fsutil, proc, relocate, removal, state

VERSION = 1
SCRIPT = payloads.DIR / "_unpack.sh"


@dataclass(frozen=True)
class Portable:
    path: Path
    manifest: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), **self.manifest}


def default_path(record: state.EnvRecord, cwd: Path) -> Path:
    return cwd / f"{record.name}.portable.tar"


def make(record: state.EnvRecord, out: Path, step: Callable[[str], None] = lambda text: None) -> Portable:
    """Write the portable archive of ``record``'s env to ``out`` (call with the env's mutex held)."""
    prefix = Path(record.prefix)
    _refuse(record, prefix, out)
    step(f"finding the files that name {prefix}")
    found = relocate.find(prefix, record.prefix, every_text_file=not kinds.kind_info(record.kind).venv)
    links = _links(prefix, record.prefix)
    odd = [rel for rel in [*found.safe, *(x for pair in links for x in pair)] if "\n" in rel or "\r" in rel]
    if odd:
        raise BackupError(f"{record.name}: {odd[0]!r} has a line break in it; unpack.sh cannot list it")
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        payload = _payload(prefix, work, step)
        manifest = _manifest(record, payload, found, [rel for rel, _ in links])
        files = {
            "unpack.sh": SCRIPT.read_bytes(),
            "portable.json": (json.dumps(manifest, indent=1) + "\n").encode(),
            "prefix.txt": (record.prefix + "\n").encode(),
            "rewrite.txt": "".join(f"{rel}\n" for rel in found.safe).encode(),
            "links.txt": "".join(f"{rel}\n{rest}\n" for rel, rest in links).encode(),
        }
        sums = [f"{_sha256_bytes(data)}  {name}\n" for name, data in files.items() if name != "unpack.sh"]
        sums.append(f"{manifest['payload']['sha256']}  {payload.name}\n")
        files["payload.sha256"] = "".join(sums).encode()
        step(f"writing {out}")
        tmp = work / "portable.tar"
        _outer(tmp, files, payload)
        tmp.chmod(modes(prefix)[0])
        _place(tmp, out)
    finally:
        removal.remove_below(work.parent, work, dirs=True)
    return Portable(out, manifest)


def _refuse(record: state.EnvRecord, prefix: Path, out: Path) -> None:
    if not prefix.is_dir():
        raise BackupError(
            f"{record.name} is gone ({prefix} does not exist); there is nothing to pack",
            hint=f"envbuilder restore {record.name}",
        )
    health = state.health(record, full=True)
    if health.status == "damaged":
        raise BackupError(
            f"{record.name} is damaged ({health.detail}): a portable archive of it would not work",
            hint=f"envbuilder create {record.name} --force",
        )
    if out.exists() or out.is_symlink():
        raise _exists(out)
    if not out.parent.is_dir():
        raise BackupError(f"cannot write {out}: {out.parent} is not a directory")


def _place(tmp: Path, out: Path) -> None:
    """``tmp`` renamed to ``out``, which must not exist: a hard link never replaces a file that came there
    meanwhile (a rename would); a file system without hard links gets the rename, after one more look."""
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise _exists(out) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if out.exists() or out.is_symlink():
            raise _exists(out) from None
        tmp.rename(out)


def _links(prefix: Path, old: str) -> list[tuple[str, str]]:
    """The symlinks under ``prefix`` whose target is an absolute path into ``old``: (the link, the rest of its
    target after ``old``)."""
    found = []
    for path in fsutil.walk(prefix):
        if path.is_symlink():
            target = str(path.readlink())
            if target == old or target.startswith(old + "/"):
                found.append((str(path.relative_to(prefix)), target[len(old) :]))
    return found


def _exists(out: Path) -> BackupError:
    return BackupError(
        f"{out} exists; a portable archive never replaces a file",
        hint="remove it, or name another file with --output FILE",
    )


def _payload(prefix: Path, work: Path, step: Callable[[str], None]) -> Path:
    """The env's files as archive mode's tar: through zstd where it is on PATH, else gzip (Python's own)."""
    step(f"archiving {prefix}")
    zstd = archive.Tools.find().zstd
    if zstd:
        path = work / "payload.tar.zst"
        with proc.feeding([zstd, *archive.ZSTD_PACK, "-o", str(path)]) as pipe:
            archive.write_tar(prefix, pipe)
        return path
    path = work / "payload.tar.gz"
    with gzip.open(path, "wb", compresslevel=6) as fh:
        archive.write_tar(
            prefix, cast(IO[bytes], fh)
        )  # a GzipFile is a binary file; typeshed says BufferedIOBase
    return path


def _manifest(
    record: state.EnvRecord, payload: Path, found: relocate.Found, links: list[str]
) -> dict[str, Any]:
    torch = record.plan.get("torch")
    return {
        "version": VERSION,
        "env": record.name,
        "kind": record.kind,
        "recipe": record.recipe,
        "torch": {
            "version": record.torch,
            "variant": torch.get("variant") if isinstance(torch, Mapping) else None,
        },
        "prefix": record.prefix,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "envbuilder": __version__,
        "python": record.plan.get("python"),
        "payload": {
            "file": payload.name,
            "compression": "zstd" if payload.suffix == ".zst" else "gzip",
            "size": payload.stat().st_size,
            "sha256": wheelhouse.file_sha256(payload),
        },
        "rewrite": list(found.safe),
        "links": links,
        "left": list(found.left),
        "bytecode": found.bytecode,
    }


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _outer(path: Path, files: Mapping[str, bytes], payload: Path) -> None:
    now = time.time()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), now
            info.mode = 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
        info = tar.gettarinfo(str(payload), arcname=payload.name)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        with payload.open("rb") as fh:
            tar.addfile(info, fh)
