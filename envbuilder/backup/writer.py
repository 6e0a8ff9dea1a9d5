"""Making backups: one env's (a wheelhouse of its wheels, or an archive of the env), or every env's, one writer
at a time on a backup root, each written beside its final name and renamed into place when complete."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import field
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder import __version__
from envbuilder.backup import archive, image, wheelhouse
from envbuilder.backup.catalog import BACKUP_VERSION, Backup, backups, checksum, load
from envbuilder.core import kinds, settings
from envbuilder.core.errors import BackupError, CommandFailed, DiskError, EnvbuilderError
from envbuilder.core.space import Need
from envbuilder.core.structs import dataclass
from envbuilder.plan import preflight as estimate
from envbuilder.system import fsutil, removal, state, transaction

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


#: Handed what an operation will write; refuses (raises) what cannot fit.
Preflight = Callable[[Sequence[Need]], object]


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def modes(prefix: Path) -> tuple[int, int]:
    """File and directory modes for a backup of ``prefix``: private, plus the read access the env itself gives
    its group and others (a backup is never more readable than the env)."""
    try:
        bits = prefix.stat().st_mode
    except OSError:
        bits = 0
    file_mode = 0o600 | (bits & 0o044)
    dir_mode = 0o700 | (0o050 if bits & 0o040 else 0) | (0o005 if bits & 0o004 else 0)
    return file_mode, dir_mode


@contextlib.contextmanager
def writer_mutex(
    root: Path, timeout: float, on_wait: Optional[Callable[[fsutil.Owner], None]] = None
) -> Iterator[None]:
    """One writer at a time on a backup root; what an interrupted writer left is cleared first: its partial
    backup (or a pruned one half removed) and its temporary blobs."""
    # A read-only, full or over-quota root is a disk error with the way out (--to) wherever it shows.
    with (
        fsutil.disk_errors((root, settings.BACKUP_WAY_OUT)),
        fsutil.Mutex(root / "locks" / "backups.lock", timeout=timeout, on_wait=on_wait),
    ):
        partials = sorted((root / "envs").glob(f"*/{transaction.PARTIAL}*"))
        for left in [*partials, *sorted((root / "store").glob("*/.*.tmp-*"))]:
            removal.remove_below(root, left, dirs=True)  # never through a link, nor a link itself
        yield


@dataclass
class BackupResult:
    backup: Backup
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**self.backup.summary(), "notes": self.notes}


def _known(root: Path) -> dict[str, dict[str, Any]]:
    """Wheels earlier backups stored: digest -> their blob entry (with the stored bytes' sha256)."""
    known: dict[str, dict[str, Any]] = {}
    for b in backups(root):
        if b.error:
            continue
        for wheel in b.data.get("wheels", ()):
            if (root / wheel["path"]).is_file():
                known.setdefault(wheel["digest"], wheel)
    return known


def make(
    record: state.EnvRecord,
    root: Path,
    mode: str,
    fmt: str = "tar",
    step: Callable[[str], None] = lambda text: None,
    *,
    preflight: Optional[Preflight] = None,
) -> BackupResult:
    """Back ``record``'s env up under ``root`` (call with writer_mutex and the env's mutex held). ``preflight``
    is handed what the backup will write before it writes it (and refuses what cannot fit)."""
    prefix = Path(record.prefix)
    _refuse_unbackable(record, prefix, mode)
    if preflight is not None and mode == "archive":
        fig = estimate.of_record(record.to_json())
        preflight([Need(str(root), f"the archive of {record.name}", fig.bytes, 4, fig.source)])
    file_mode, dir_mode = modes(prefix)
    stamp = _stamp()
    env_dir = root / "envs" / record.name
    for where in (root / "envs", env_dir, root / "store"):  # a backup is never written through a planted link
        removal.refuse_link(where, "a directory of backups envbuilder wrote")
    while (env_dir / stamp).exists():  # two backups within a second
        time.sleep(1)
        stamp = _stamp()
    # Named .partial-STAMP-PID, not .STAMP.partial-PID: a backup never replaces another (each stamp is new), and
    # its recovery is no one stamp's: writer_mutex clears every env's .partial-* at once.
    tx = transaction.Transaction(
        env_dir / stamp, env_dir / f"{transaction.PARTIAL}{stamp}-{os.getpid()}", dir_mode
    )
    notes: list[str] = []
    try:
        with tx:  # removes the partial on any failure
            data: dict[str, Any] = {
                "version": BACKUP_VERSION,
                "mode": mode,
                "env": record.name,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "host": socket.gethostname(),
                "envbuilder": __version__,
                "prefix": record.prefix,
                "record": record.to_json(),
            }
            if mode == "wheelhouse":
                data.update(
                    _wheelhouse(record, prefix, root, file_mode, step=step, notes=notes, preflight=preflight)
                )
            elif mode == "image":
                data.update(image.store(record, prefix, tx.partial, file_mode, step))
            else:
                data.update(_archive(prefix, tx.partial, fmt, file_mode, step))
            data["verified"] = data["created"]
            data["checksum"] = checksum(data)
            text = (json.dumps(data, indent=1) + "\n").encode()
            fsutil.write_atomic(tx.partial / "backup.json", text, file_mode)
            transaction.pause(os.environ, "backup-written")  # the test hook: a backup that holds its mutexes
            tx.swap()
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise _no_space(root, exc.errno, exc.strerror or str(exc)) from None
        raise
    except CommandFailed as exc:
        if exc.returncode == -signal.SIGXFSZ:  # the compressor passed the file size limit (ulimit -f)
            raise _no_space(root, errno.EFBIG, "the file size limit (ulimit -f) was reached") from None
        said = fsutil.command_disk_error(exc, (root, settings.BACKUP_WAY_OUT))  # what the compressor said
        if said is not None and said.errno in _NO_SPACE:
            raise _no_space(root, said.errno, exc.stderr_tail.strip().splitlines()[-1]) from None
        raise
    return BackupResult(load(root, tx.final), notes)


def _refuse_unbackable(record: state.EnvRecord, prefix: Path, mode: str) -> None:
    """A BackupError where this env cannot be backed up this way: gone, damaged, or a wheelhouse of a non-venv."""
    if not prefix.is_dir():
        raise BackupError(
            f"{record.name} is gone ({prefix} does not exist); there is nothing to back up",
            hint=f"envbuilder restore {record.name}",
        )
    container = kinds.kind_info(record.kind).container
    if (mode == "image") != container:
        raise BackupError(
            f"{record.name} is a {record.kind} env: an image backup holds a container env's image file"
            if not container
            else f"{record.name} is a container env: its backup is its image file (--mode image)",
            hint=f"envbuilder backup {record.name} --mode {default_mode(record)}",
        )
    # A wheelhouse backup finds missing files itself while reading RECORDs (one pass instead of two); an image
    # backup checks the one file it copies.
    health = state.health(record, full=True) if mode == "archive" else state.Health("ok", "")
    if health.status == "damaged":
        raise BackupError(
            f"{record.name} is damaged ({health.detail}): a backup of it would not restore",
            hint=f"envbuilder restore {record.name} --force (from an earlier backup) or "
            f"envbuilder create {record.name} --force",
        )
    if mode == "wheelhouse" and not kinds.kind_info(record.kind).venv:
        raise BackupError(
            f"{record.name} is a {record.kind} env: a wheelhouse backup holds venvs (their wheels)",
            hint=f"envbuilder backup {record.name} --mode archive",
        )


def _no_space(root: Path, number: int, why: str) -> DiskError:
    return DiskError(
        f"the backup could not be written to {root}: {why} ({errno.errorcode[number]}); earlier backups are intact",
        path=str(root),
        errno=number,
        hint="free space or quota there (envbuilder prune-backups --keep 1), or back up elsewhere with --to DIR "
        f"or {settings.BACKUP_ROOT_VAR}",
    )


def _wheelhouse(
    record: state.EnvRecord,
    prefix: Path,
    root: Path,
    file_mode: int,
    *,
    step: Callable[[str], None],
    notes: list[str],
    preflight: Optional[Preflight] = None,
) -> dict[str, Any]:
    dists = wheelhouse.scan(prefix)
    damaged = [d for d in dists if d.missing]
    if damaged:
        raise BackupError(
            f"{record.name} is damaged ({damaged[0].name}: {damaged[0].missing[0]} is missing)",
            hint=f"envbuilder restore {record.name} --force (from an earlier backup) or "
            f"envbuilder create {record.name} --force",
        )
    for d in dists:
        if d.problems:
            raise BackupError(
                f"{d.name} {d.version}: {d.problems[0]}",
                hint=f"envbuilder backup {record.name} --mode archive",
            )
    store = wheelhouse.Store(root, file_mode, wheelhouse.zstd())
    known = _known(root)
    _check_room(preflight, root, [d for d in dists if not d.editable and d.digest not in known])
    todo = []
    for d in dists:
        if d.editable:
            notes.append(f"{d.name} is an editable install: not in the backup (reinstall it from its source)")
        else:
            todo.append(d)
    # Largest first (by file count): the long part starts at once, and the small wheels are packed beside it
    # while its compressor is busy. Threads suffice: hashing, crc32 and file I/O release the GIL.
    todo.sort(key=lambda d: -len(d.entries))
    cancel = threading.Event()
    pool = ThreadPoolExecutor(max_workers=pack_workers(len(todo)), thread_name_prefix="pack")
    wheels: list[dict[str, Any]] = []
    new_bytes = 0
    try:
        futures = [pool.submit(store.put, d, known.get(d.digest), cancel) for d in todo]
        for fut in futures:  # the first failure stops the others at once, not when its turn comes
            fut.add_done_callback(lambda f: cancel.set() if not f.cancelled() and f.exception() else None)
        for d, fut in zip(todo, futures):
            step(f"{'checking' if d.digest in known else 'storing'} {d.name} {d.version}")
            try:
                blob = fut.result()
            except wheelhouse.Cancelled:
                pool.shutdown(wait=True, cancel_futures=True)
                raise _first_failure(futures) from None
            new_bytes += blob.size if blob.new else 0
            if blob.replaced:
                notes.append(
                    f"{d.name} {d.version}: the stored wheel was damaged ({blob.replaced}); stored again from "
                    "the env (earlier backups that share it verify again if it came out the same)"
                )
            wheels.append({"name": d.name, "version": d.version, **blob.to_json()})
    except BaseException:
        cancel.set()  # the other workers stop at their next file and remove their temp blobs
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return {
        "wheels": wheels,
        "bytes": sum(w["size"] for w in wheels),
        "new_bytes": new_bytes,
        "compression": "zstd" if store.zstd else "none",
    }


def _check_room(preflight: Optional[Preflight], root: Path, new: Sequence[wheelhouse.Dist]) -> None:
    if preflight is not None:
        preflight([_new_wheels(root, new)])


def _new_wheels(root: Path, new: Sequence[wheelhouse.Dist]) -> Need:
    """What the wheels the store lacks take at most: their files' bytes as installed (the store compresses),
    one blob each."""
    size = 0
    for d in new:
        for e in d.entries:
            with contextlib.suppress(OSError):
                size += os.lstat(e.source).st_size
    return Need(
        str(root),
        f"{len(new)} wheel(s) the store does not have",
        size,
        len(new) + 2,
        "the env's installed files of the wheels not yet stored (uncompressed: an upper bound)",
    )


def _first_failure(futures: Sequence[Future[Any]]) -> BaseException:
    """The error that stopped the other workers (theirs is only Cancelled)."""
    for fut in futures:
        if fut.done() and not fut.cancelled():
            exc = fut.exception()
            if exc is not None and not isinstance(exc, wheelhouse.Cancelled):
                return exc
    return BackupError("packing was stopped")  # not reached: something set cancel


def pack_workers(count: int) -> int:
    """Wheels packed at once: each is a Python thread and a one-thread zstd, so at most one per core, and four
    at most (more only competes for the file system)."""
    return max(1, min(count, os.cpu_count() or 1, 4))


def _archive(
    prefix: Path, partial: Path, fmt: str, file_mode: int, step: Callable[[str], None]
) -> dict[str, Any]:
    tools = archive.Tools.find()
    step(f"archiving {prefix} ({fmt})")
    name, manifest = archive.pack(prefix, partial, fmt, tools)
    (partial / name).chmod(file_mode)
    text = (json.dumps(manifest, separators=(",", ":")) + "\n").encode()
    fsutil.write_atomic(partial / "manifest.json", text, file_mode)
    size = (partial / name).stat().st_size
    step("hashing the archive")
    return {
        "archive": {
            "file": name,
            "format": fmt,
            "sha256": wheelhouse.file_sha256(partial / name),
            "size": size,
            "manifest_sha256": hashlib.sha256(text).hexdigest(),
            "entries": len(manifest),
        },
        "bytes": size,
        "new_bytes": size,
    }


def make_all(
    records: Sequence[state.EnvRecord],
    root: Path,
    mode: Optional[str],
    step: Callable[[str], None],
    *,
    home: Path,
    preflight: Optional[Preflight] = None,
) -> tuple[list[BackupResult], list[tuple[str, EnvbuilderError]]]:
    """Back every env up (wheelhouse for venvs, the image file for container envs, archive otherwise, unless
    ``mode`` says), each under its env's mutex (an env another envbuilder is changing is a failure, not a wait);
    failures are collected, not fatal, so one broken env does not stop the rest."""
    done, failed = [], []
    for record in records:
        try:
            with state.mutex(home, record.name):
                done.append(make(record, root, mode or default_mode(record), step=step, preflight=preflight))
        except EnvbuilderError as exc:
            failed.append((record.name, exc))
    return done, failed


def default_mode(record: state.EnvRecord) -> str:
    """A wheelhouse for an env of wheels (venvs), the image file for a container env, else an archive."""
    kind = kinds.kind_info(record.kind)
    return "wheelhouse" if kind.venv else "image" if kind.container else "archive"
