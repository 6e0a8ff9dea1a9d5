"""An exact copy of an env directory: tar streamed through zstd (or squashfs where mksquashfs exists), with a
manifest of every entry (type, mode, size, sha256 of each file, link targets), for envs that hold more than
wheels (conda envs, hand-edited files). Restored at another prefix, the copy is relocated (envbuilder.system.relocate).
"""

from __future__ import annotations

import hashlib
import shutil
import stat
import tarfile
from pathlib import Path
from typing import IO, Any, BinaryIO, Optional

from envbuilder.backup import extract
from envbuilder.core.errors import BackupError
from envbuilder.core.structs import dataclass
from envbuilder.system import fsutil, proc, removal

CHUNK = 1 << 20
ZSTD_PACK = ("-T0", "-3", "-q", "-f")


class _Hashing:
    """A file object that hashes what tarfile reads through it."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.fh.read(size)
        self.digest.update(data)
        return data


def write_tar(prefix: Path, sink: IO[bytes]) -> list[dict[str, Any]]:
    """Stream ``prefix`` as a tar archive to ``sink``, hashing each file as it is read; the manifest."""
    manifest: list[dict[str, Any]] = []
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        # The default 16 KiB reads make a torch env slow to stream.
        tar.copybufsize = CHUNK  # type: ignore[attr-defined]
        for path in fsutil.walk(prefix):
            rel = str(path.relative_to(prefix))
            info = tar.gettarinfo(str(path), arcname=rel)
            entry: dict[str, Any] = {"path": rel, "mode": stat.S_IMODE(info.mode)}
            if info.isreg():
                with path.open("rb") as fh:
                    reader = _Hashing(fh)
                    tar.addfile(info, reader)
                entry.update(type="file", size=info.size, sha256=reader.digest.hexdigest())
            else:
                tar.addfile(info)
                if info.islnk():
                    entry.update(type="hardlink", target=info.linkname)
                elif info.issym():
                    entry.update(type="symlink", target=info.linkname)
                elif info.isdir():
                    entry.update(type="dir")
                else:
                    entry.update(type="other")
            manifest.append(entry)
    return manifest


def hash_tree(prefix: Path) -> list[dict[str, Any]]:
    """The same manifest as write_tar, read straight from the directory (for squashfs)."""
    manifest: list[dict[str, Any]] = []
    seen: dict[tuple[int, int], str] = {}
    for path in fsutil.walk(prefix):
        st = path.lstat()
        rel = str(path.relative_to(prefix))
        entry: dict[str, Any] = {"path": rel, "mode": stat.S_IMODE(st.st_mode)}
        if stat.S_ISLNK(st.st_mode):
            entry.update(type="symlink", target=str(path.readlink()))
        elif stat.S_ISDIR(st.st_mode):
            entry.update(type="dir")
        elif stat.S_ISREG(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key in seen:
                entry.update(type="hardlink", target=seen[key])
            else:
                seen[key] = rel
                h = hashlib.sha256()
                with path.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(CHUNK), b""):
                        h.update(chunk)
                entry.update(type="file", size=st.st_size, sha256=h.hexdigest())
        else:
            entry.update(type="other")
        manifest.append(entry)
    return manifest


@dataclass(frozen=True)
class Tools:
    zstd: Optional[str]
    tar: Optional[str]
    mksquashfs: Optional[str]
    unsquashfs: Optional[str]

    @classmethod
    def find(cls) -> Tools:
        return cls(*(shutil.which(t) for t in ("zstd", "tar", "mksquashfs", "unsquashfs")))


def pack(prefix: Path, out_dir: Path, fmt: str, tools: Tools) -> tuple[str, list[dict[str, Any]]]:
    """Write the archive of ``prefix`` into ``out_dir``; (file name, manifest)."""
    if fmt == "squashfs":
        if not tools.mksquashfs:
            raise BackupError(
                "--format squashfs needs mksquashfs, which is not on PATH",
                hint="install squashfs-tools or load its module, or use --format tar",
            )
        name = "env.sqfs"
        argv = [tools.mksquashfs, str(prefix), str(out_dir / name), "-noappend", "-quiet", "-no-progress"]
        argv += ["-comp", "zstd", "-Xcompression-level", "3"] if squashfs_zstd(tools.mksquashfs) else []
        manifest = hash_tree(prefix)
        proc.run(argv)
        return name, manifest
    if tools.zstd:
        name = "env.tar.zst"
        with proc.feeding([tools.zstd, *ZSTD_PACK, "-o", str(out_dir / name)]) as pipe:
            manifest = write_tar(prefix, pipe)
        return name, manifest
    name = "env.tar"
    with (out_dir / name).open("wb") as fh:
        manifest = write_tar(prefix, fh)
    return name, manifest


def squashfs_zstd(mksquashfs: str) -> bool:
    res = proc.run([mksquashfs, "-help"], check=False)
    return "zstd" in res.stdout + res.stderr


def unpack(archive: Path, into: Path, tools: Tools, root: Optional[Path] = None) -> None:
    """Extract ``archive`` so that ``into`` (which must not exist) becomes the env directory, never writing
    outside it (``extract``). With ``root`` (a backup root), the archive is a file of that tree, read only if
    no symlink leads to it."""
    if archive.name.endswith(".sqfs"):
        if not tools.unsquashfs:
            raise BackupError(
                f"{archive} is a squashfs image and unsquashfs is not on PATH", hint="install squashfs-tools"
            )
        _open(archive, root).close()
        proc.run([tools.unsquashfs, "-no-progress", "-q", "-d", str(into), str(archive)], timeout=None)
        extract.tidy(into, archive)
        return
    if archive.name.endswith(".zst") and not tools.zstd:
        raise BackupError(f"{archive} is zstd-compressed and zstd is not on PATH", hint="load a zstd module")
    with _open(archive, root) as fh:
        if archive.name.endswith(".zst"):
            with proc.reading([str(tools.zstd), "-d", "-q", "-c"], fh) as stream:
                extract.untar(stream, into, archive)
        else:
            extract.untar(fh, into, archive)


def _open(archive: Path, root: Optional[Path]) -> BinaryIO:
    try:
        if root is not None:
            return removal.open_below(root, archive.relative_to(root).as_posix())
        return archive.open("rb")  # an image at the path its record names (the user may have linked it there)
    except OSError as exc:
        raise BackupError(f"cannot read {archive}: {exc.strerror}") from None


def check_tree(root: Path, manifest: list[dict[str, Any]]) -> list[str]:
    """What in ``root`` differs from the manifest (types, sizes, link targets; contents are checked through the
    archive's own hash before extraction)."""
    problems = []
    for entry in manifest:
        path = root / entry["path"]
        if not path.is_symlink() and not path.exists():
            problems.append(f"{entry['path']}: missing after extraction")
        elif entry["type"] == "file" and path.stat().st_size != entry["size"]:
            problems.append(
                f"{entry['path']}: {path.stat().st_size} bytes, the manifest says {entry['size']}"
            )
        elif entry["type"] == "symlink" and str(path.readlink()) != entry["target"]:
            problems.append(
                f"{entry['path']}: link to {path.readlink()}, the manifest says {entry['target']}"
            )
    return problems
