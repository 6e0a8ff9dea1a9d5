"""Wheels back from an installed env, and the content-addressed store that keeps each one once.

A distribution installed from a wheel leaves a RECORD: every file it put in the env with its sha256. From that
RECORD alone we get a *digest* that names the wheel's content, whatever env or prefix it sits in; two envs with
the same torch give the same digest, so the store keeps torch once. Packing reads every file, checks it against
its RECORD hash (a file changed or lost since install is refused, not silently backed up), and writes a wheel
that installs the same files again: package files at the wheel's root, other files under ``.data/data`` (paths
relative to the prefix), non-entry-point scripts under ``.data/scripts`` with their ``#!python`` header back.
Files the installer generates (entry-point scripts, INSTALLER, REQUESTED, direct_url.json, RECORD, bytecode) are
left out: the installer writes them again on restore.

Store layout: ``store/ab/<digest>.whl.zst`` (zstd when the ``zstd`` command exists, else ``.whl``): one file per
wheel, so a backup costs few inodes. Blobs are written to a temp name and renamed: a reader sees a whole blob
or none.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import stat
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import field
from pathlib import Path
from typing import IO, Any, Optional, cast

from packaging.utils import canonicalize_name

from envbuilder.backup import hashmemo
from envbuilder.core.errors import BackupError, CommandFailed
from envbuilder.core.structs import dataclass
from envbuilder.system import proc, removal, transaction

#: dist-info files the installer writes (not part of the wheel).
GENERATED = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"})
CHUNK = 1 << 20
#: zstd level 1 on one worker: about 550 MB/s here, a third of gzip's output size lost at most.
ZSTD_PACK = ("-T1", "-1", "-q", "-f")
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def b64_sha256(data_digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(data_digest).rstrip(b"=").decode()


@dataclass(frozen=True)
class Entry:
    """One file of a distribution: where it lies now, where it goes in the wheel, what RECORD says it holds."""

    source: str  # a plain string: a torch env has 16,000 of these
    arcname: str
    hash: str  # RECORD's "sha256=..." (empty when RECORD gave none)
    script: bool = False  # a .data/scripts file: its installer-written header is put back to #!python


@dataclass(frozen=True)
class Dist:
    name: str
    version: str
    info: Path
    entries: tuple[Entry, ...]
    tags: tuple[str, ...]
    digest: str
    missing: tuple[str, ...] = ()
    editable: bool = False
    problems: tuple[str, ...] = field(default=())

    @property
    def key(self) -> str:
        return str(canonicalize_name(self.name))

    def wheel_filename(self) -> str:
        """A valid wheel file name for the repacked wheel (its tags compressed as the spec allows)."""
        stem = self.info.name[: -len(".dist-info")]
        dist_name, _, _ = stem.partition("-")
        py, abi, plat = (sorted({t.split("-")[i] for t in self.tags}) for i in range(3))
        tag = "-".join(".".join(part) for part in (py, abi, plat))
        return f"{_escape(dist_name)}-{_escape(self.version)}-{tag}.whl"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "digest": self.digest, "files": len(self.entries)}


def _escape(part: str) -> str:
    out = []
    prev = ""
    for ch in part:
        c = "_" if ch in "-_" else ch
        if not (c == "_" and prev == "_"):
            out.append(c)
        prev = c
    return "".join(out)


def _entry_points(info: Path) -> set[str]:
    """Names of console and GUI scripts (the installer generates these; they are not wheel content)."""
    names: set[str] = set()
    section = ""
    with contextlib.suppress(OSError):
        for raw in (info / "entry_points.txt").read_text(encoding="utf-8", errors="replace").splitlines():
            line = raw.strip()
            if line.startswith("["):
                section = line.strip("[]").strip()
            elif "=" in line and section in ("console_scripts", "gui_scripts"):
                names.add(line.split("=", 1)[0].strip())
    return names


def restore_header(data: bytes) -> bytes:
    """A script as the wheel had it: the installer's header (``#!/prefix/bin/python`` or the ``/bin/sh``
    trampoline that relocatable envs and long paths use) replaced by ``#!python``."""
    if not data.startswith(b"#!"):
        return data
    lines = data.split(b"\n", 3)
    if (
        lines[0] == b"#!/bin/sh"
        and len(lines) >= 3
        and lines[1].startswith(b"'''exec'")
        and lines[2] == b"' '''"
    ):
        return b"#!python\n" + (lines[3] if len(lines) > 3 else b"")
    first = lines[0][2:].strip().split(b" ")[0]
    if first.rsplit(b"/", 1)[-1].startswith(b"python"):
        return b"#!python\n" + data.split(b"\n", 1)[1] if b"\n" in data else b"#!python\n"
    return data


def scan(prefix: Path) -> list[Dist]:
    """Every distribution installed in the env, with its digest (from RECORD; only script headers are read)."""
    dists = []
    listing = _Listing()
    for site in sorted(prefix.glob("lib/python*/site-packages")):
        for info in sorted(site.glob("*.dist-info")):
            dist = _scan_one(prefix, site, info, listing)
            if dist is not None:
                dists.append(dist)
    return dists


def headers(text: str) -> dict[str, list[str]]:
    """The header fields of a METADATA or WHEEL file (RFC 822 style), by lower-cased name, each with its values in
    order: the lines up to the first empty one, a line that starts with white space continuing the field above it
    (joined with a space). The description after the empty line is never read. (``email.parser`` reads the same,
    at some 17 ms of imports per backup or restore on the 2-core VM.)"""
    found: dict[str, list[str]] = {}
    last: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            break
        if line[0] in " \t":
            if last:
                last[-1] = f"{last[-1]} {line.strip()}"
            continue
        key, sep, value = line.partition(":")
        if sep:
            last = found.setdefault(key.strip().lower(), [])
            last.append(value.strip())
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _scan_one(prefix: Path, site: Path, info: Path, listing: _Listing) -> Optional[Dist]:
    meta = headers(_read(info / "METADATA"))
    name, version = (meta.get("name") or [""])[0], (meta.get("version") or [""])[0]
    if not name or not version:
        return None
    tags = tuple(headers(_read(info / "WHEEL")).get("tag") or ("py3-none-any",))
    stem = info.name[: -len(".dist-info")]
    data_dir = f"{stem}.data"
    direct = _read(info / "direct_url.json")
    editable = bool(direct) and bool(json.loads(direct).get("dir_info", {}).get("editable"))
    scripts = _entry_points(info)
    entries: list[Entry] = []
    missing: list[str] = []
    problems: list[str] = []
    lines: list[str] = []
    # Plain strings, not Path objects: a torch RECORD has 16,000 rows and pathlib would triple the scan time.
    site_s, prefix_s, info_s = str(site), str(prefix), str(info)
    inside_prefix, inside_site, bin_s = prefix_s + os.sep, site_s + os.sep, os.path.join(prefix_s, "bin")
    for row in _read(info / "RECORD").splitlines():
        if not row.strip():
            continue
        rel, digest = _record_row(row)
        target = _joined(site_s, rel)
        if "__pycache__" in target or target.endswith(".pyc"):
            continue
        parent, _, base = target.rpartition("/")
        if parent == info_s and base in GENERATED:
            continue
        if not target.startswith(inside_prefix):
            problems.append(f"{rel} lies outside the env")
            continue
        inside = target[len(prefix_s) + 1 :]
        if target.startswith(inside_site):
            arc, is_script = target[len(site_s) + 1 :], False
        elif parent == bin_s:
            if base in scripts:
                continue  # generated from entry_points.txt on install
            arc, is_script = f"{data_dir}/scripts/{base}", True
        else:
            arc, is_script = f"{data_dir}/data/{inside}", False
        if not listing.has(parent, base):
            missing.append(inside)
            continue
        entry_hash = digest
        if is_script:
            # The header differs from env to env; the digest uses the script as the wheel had it.
            with open(target, "rb") as fh:
                entry_hash = b64_sha256(hashlib.sha256(restore_header(fh.read())).digest())
        entries.append(Entry(target, arc, digest, is_script))
        lines.append(f"{arc},{entry_hash}")
    content = hashlib.sha256("\n".join(sorted([*lines, *(f"tag {t}" for t in tags)])).encode()).hexdigest()
    return Dist(name, version, info, tuple(entries), tags, content, tuple(missing), editable, tuple(problems))


def _joined(site: str, rel: str) -> str:
    """``os.path.normpath(os.path.join(site, rel))``, with the joins and splits done only for the rows that need
    them (an absolute path, a ``.`` or ``..`` part, a doubled or trailing slash): a torch RECORD has 16,000 rows,
    nearly all plain relative paths."""
    if rel.startswith(("/", ".")) or "/." in rel or "//" in rel or rel.endswith("/"):
        return os.path.normpath(os.path.join(site, rel))
    return f"{site}/{rel}"


class _Listing:
    """Whether a file is there, from the names of its directory, each directory listed once: one ``listdir`` for
    a directory's files instead of one ``lstat`` for each (a torch env has some 16,000 files in 1,200
    directories). A name is there as ``os.path.lexists`` has it: a broken symlink is."""

    def __init__(self) -> None:
        self.names: dict[str, frozenset[str]] = {}

    def has(self, directory: str, name: str) -> bool:
        names = self.names.get(directory)
        if names is None:
            try:
                names = frozenset(os.listdir(directory))
            except OSError:  # gone, not a directory, unreadable: nothing in it is there
                names = frozenset()
            self.names[directory] = names
        return name in names


def _record_row(row: str) -> tuple[str, str]:
    # RECORD is CSV; paths with commas are quoted. The hash and size never contain commas.
    path, digest, _size = row.rsplit(",", 2)
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1].replace('""', '"')
    return path, digest


# ---------------------------------------------------------------------------------------------------------------
# Packing


class Modified(BackupError):
    """A file differs from its RECORD hash: the env is not what was installed."""


class Cancelled(Exception):
    """Another part of the same backup failed or was interrupted: stop at the next file."""


def _check_cancel(cancel: Optional[threading.Event]) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled


class _Counter:
    """A write-only stream that counts (zipfile needs tell() on a pipe)."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.count = 0

    def write(self, data: bytes) -> int:
        self.sink.write(data)
        self.count += len(data)
        return len(data)

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        self.sink.flush()


def pack(dist: Dist, sink: IO[bytes], cancel: Optional[threading.Event] = None) -> int:
    """Write ``dist`` as a wheel to ``sink`` (a stream; no seeking), checking each file against RECORD; the
    wheel's size. ``cancel`` set by another thread stops it at the next file."""
    record: list[str] = []
    changed: list[str] = []
    counter = _Counter(sink)
    with zipfile.ZipFile(cast(IO[bytes], counter), "w", zipfile.ZIP_STORED) as zf:
        for entry in dist.entries:
            _check_cancel(cancel)
            st = os.stat(entry.source)
            info = zipfile.ZipInfo(entry.arcname, ZIP_EPOCH)
            info.external_attr = (stat.S_IFREG | (st.st_mode & 0o755)) << 16
            info.file_size = st.st_size
            whole = hashlib.sha256()
            if entry.script:
                with open(entry.source, "rb") as fh:
                    raw = fh.read()
                whole.update(raw)
                data = restore_header(raw)
                zf.writestr(info, data)
                out_digest = hashlib.sha256(data).digest()
                size = len(data)
            else:
                size = 0
                with open(entry.source, "rb") as src:
                    dst = zf.open(info, "w", force_zip64=st.st_size > 2**31)
                    with dst:
                        while True:
                            chunk = src.read(CHUNK)
                            if not chunk:
                                break
                            whole.update(chunk)
                            dst.write(chunk)
                            size += len(chunk)
                out_digest = whole.digest()
            if entry.hash and b64_sha256(whole.digest()) != entry.hash:
                changed.append(entry.arcname)
            record.append(f"{_csv(entry.arcname)},{b64_sha256(out_digest)},{size}")
        record_name = f"{dist.info.name}/RECORD"
        record.append(f"{record_name},,")
        rinfo = zipfile.ZipInfo(record_name, ZIP_EPOCH)
        rinfo.external_attr = (stat.S_IFREG | 0o644) << 16
        zf.writestr(rinfo, "\n".join(record) + "\n")
    if changed:
        raise Modified(
            f"{dist.name} {dist.version}: {len(changed)} file(s) differ from what was installed, e.g. {changed[0]}",
            hint="a wheelhouse backup restores packages as installed; --mode archive keeps the env as it is",
        )
    return counter.count


def _csv(path: str) -> str:
    return f'"{path.replace(chr(34), chr(34) * 2)}"' if ("," in path or '"' in path) else path


def check_unchanged(dist: Dist, cancel: Optional[threading.Event] = None) -> None:
    """Hash every file of ``dist`` against RECORD without packing (for a wheel the store already has)."""
    changed = []
    for entry in dist.entries:
        _check_cancel(cancel)
        if not entry.hash:
            continue
        whole = hashlib.sha256()
        with open(entry.source, "rb") as src:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                whole.update(chunk)
        if b64_sha256(whole.digest()) != entry.hash:
            changed.append(entry.arcname)
    if changed:
        raise Modified(
            f"{dist.name} {dist.version}: {len(changed)} file(s) differ from what was installed, e.g. {changed[0]}",
            hint="a wheelhouse backup restores packages as installed; --mode archive keeps the env as it is",
        )


# ---------------------------------------------------------------------------------------------------------------
# Store


@dataclass(frozen=True)
class Blob:
    digest: str
    filename: str  # the wheel file name to install it under
    path: str  # relative to the backup root
    sha256: str  # of the stored bytes
    size: int  # stored bytes
    compression: str  # zstd | none
    new: bool = False  # written by this backup (not shared with an earlier one)
    wheel_size: Optional[int] = (
        None  # the wheel's bytes once decompressed (the scratch space a restore needs)
    )
    #: Why the stored blob this one replaced was unusable (damaged or changed), if it replaced one.
    replaced: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "filename": self.filename,
            "path": self.path,
            "sha256": self.sha256,
            "size": self.size,
            "compression": self.compression,
            "wheel_size": self.wheel_size,
        }


def _copy_hashing(src: IO[bytes], sink: Optional[IO[bytes]], digest: Any) -> int:
    size = 0
    for chunk in iter(lambda: src.read(CHUNK), b""):
        digest.update(chunk)
        if sink is not None:
            sink.write(chunk)
        size += len(chunk)
    return size


def _stored_problem(
    root: Path, rel: str, known: dict[str, Any], cancel: Optional[threading.Event]
) -> Optional[str]:
    """What is wrong with a stored blob, against the size and sha256 its backup recorded (None: nothing); one
    reached through a symlink is not the store's (it is stored again, the link replaced)."""

    def digest_of(fh: IO[bytes]) -> str:
        h = hashlib.sha256()
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            _check_cancel(cancel)
            h.update(chunk)
        return h.hexdigest()

    try:
        with removal.open_below(root, rel) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size != known.get("size"):
                return f"{size} bytes, {known.get('size')} were written"
            if not hashmemo.matches(root, rel, fh, str(known.get("sha256")), digest_of):
                return "its sha256 differs from the one written (a changed or damaged byte)"
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    return None


def file_sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return fh_sha256(fh)


def fh_sha256(fh: IO[bytes]) -> str:
    h = hashlib.sha256()
    _copy_hashing(fh, None, h)
    return h.hexdigest()


def zstd() -> Optional[str]:
    return shutil.which("zstd")


class Store:
    """Content-addressed wheels under ``root/store``."""

    def __init__(self, root: Path, file_mode: int = 0o600, zstd_bin: Optional[str] = None) -> None:
        self.root = root
        self.file_mode = file_mode
        self.zstd = zstd_bin

    def _rel(self, digest: str, compression: str) -> str:
        suffix = ".whl.zst" if compression == "zstd" else ".whl"
        return f"store/{digest[:2]}/{digest}{suffix}"

    def existing(self, digest: str) -> Optional[tuple[str, str]]:
        for compression in ("zstd", "none"):
            rel = self._rel(digest, compression)
            if (self.root / rel).is_file():
                return rel, compression
        return None

    def put(
        self, dist: Dist, known: Optional[dict[str, Any]] = None, cancel: Optional[threading.Event] = None
    ) -> Blob:
        """The blob for ``dist``: the stored one if an earlier backup wrote it and its bytes still hash to what
        that backup recorded (hashed now, unless hashmemo holds a digest for this very file, unchanged since it
        was hashed), its files checked against RECORD either way; else packed now, replacing a damaged one. Safe to call from several threads
        for different dists."""
        found = self.existing(dist.digest)
        damaged = None
        if found is not None and known is not None:
            rel, compression = found
            check_unchanged(dist, cancel)
            path = self.root / rel
            damaged = _stored_problem(self.root, rel, known, cancel)
            if damaged is None:
                self._widen(path)
                return Blob(
                    dist.digest,
                    dist.wheel_filename(),
                    rel,
                    known["sha256"],
                    int(known["size"]),
                    compression,
                    wheel_size=known.get("wheel_size"),
                )
        compression = "zstd" if self.zstd else "none"
        rel = self._rel(dist.digest, compression)
        final = self.root / rel
        # Named .NAME.tmp-PID-NS: threads pack blobs at once, and writer_mutex sweeps store/*/.*.tmp-*.
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{time.monotonic_ns()}")
        # Never written through a link planted where a directory of the store should be.
        removal.refuse_link(final.parent, "a directory of the store envbuilder wrote")
        with transaction.Transaction(final, tmp) as tx:
            if self.zstd:
                with proc.feeding([self.zstd, *ZSTD_PACK, "-o", str(tmp)]) as pipe:
                    wheel_size = pack(dist, pipe, cancel)
            else:
                with tmp.open("wb") as fh:
                    wheel_size = pack(dist, fh, cancel)
            with tmp.open("rb+") as fh:
                os.fsync(fh.fileno())
            tmp.chmod(self.file_mode)
            digest = file_sha256(tmp)
            tx.swap()
        written = final.lstat()  # after the rename, which moved its change time
        hashmemo.remember(self.root, rel, digest, written, written)
        return Blob(
            dist.digest,
            dist.wheel_filename(),
            rel,
            digest,
            final.stat().st_size,
            compression,
            new=True,
            wheel_size=wheel_size,
            replaced=damaged,
        )

    def _widen(self, path: Path) -> None:
        mode = path.stat().st_mode & 0o777
        if mode | self.file_mode != mode:
            with contextlib.suppress(PermissionError):
                path.chmod(mode | self.file_mode)

    def extract(self, blob: dict[str, Any], into: Path) -> Path:
        """The blob as an installable wheel file in ``into`` (decompressed if it was stored compressed). The stored
        bytes are hashed as they are read, in the same pass: a blob that is not the one the backup wrote raises
        BackupError (its partial output is removed), so verifying costs no second read."""
        src = self.root / blob["path"]
        out = into / str(blob["filename"])
        if blob["compression"] == "zstd" and not self.zstd:
            raise BackupError(
                f"{src} is zstd-compressed and no zstd command is on PATH", hint="load a zstd module"
            )
        digest = hashlib.sha256()
        what = blob.get("name", src.name)
        try:
            with removal.open_below(self.root, str(blob["path"])) as fh:  # never a link planted in the store
                before = os.fstat(fh.fileno())
                size = 0
                try:
                    if blob["compression"] == "zstd":
                        with proc.feeding([str(self.zstd), "-d", "-q", "-f", "-o", str(out)]) as pipe:
                            size = _copy_hashing(fh, pipe, digest)
                    else:
                        with out.open("wb") as sink:
                            size = _copy_hashing(fh, sink, digest)
                except CommandFailed:
                    # zstd stopped: a damaged blob, or no room for its output. The rest of the hash tells which.
                    size += _copy_hashing(fh, None, digest)
                    if digest.hexdigest() == blob["sha256"]:
                        raise
                    size = -1
                after = os.fstat(fh.fileno())
        except OSError as exc:
            if exc.filename == str(src):
                raise BackupError(f"{what}: cannot read {src}: {exc.strerror}") from None
            raise
        finally:
            if digest.hexdigest() != blob["sha256"]:
                with contextlib.suppress(FileNotFoundError):
                    out.unlink()
        if size != blob["size"] or digest.hexdigest() != blob["sha256"]:
            raise BackupError(f"{what}: {src} does not match its sha256 (a changed or damaged byte)")
        hashmemo.remember(self.root, str(blob["path"]), blob["sha256"], before, after)
        return out

    def blobs(self) -> Iterator[Path]:
        """The store's entries (``store/ab/DIGEST.whl.zst``), listed without following a link: a symlink where
        the store or one of its directories should be is listed itself, never what it points to."""
        base = self.root / "store"
        if base.is_symlink():
            yield base
            return
        for sub in sorted(base.iterdir()) if base.is_dir() else ():
            if sub.is_symlink():
                yield sub
            elif sub.is_dir():
                yield from sorted(p for p in sub.iterdir() if not p.name.startswith("."))


def stored_paths(blobs: Sequence[dict[str, Any]]) -> set[str]:
    return {b["path"] for b in blobs}
