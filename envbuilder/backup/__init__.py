"""Backups of envs to a place the scratch purge does not reach ($WORK), and their upkeep.

Layout under the backup root::

    envs/NAME/STAMP/backup.json      what the backup holds (the env's record, its wheels or its archive)
    envs/NAME/STAMP/manifest.json    archive mode: every entry of the env with its sha256
    envs/NAME/STAMP/env.tar.zst      archive mode: the env itself (or env.sqfs, env.tar)
    envs/NAME/STAMP/verify.json      the last verify-backup result
    store/ab/DIGEST.whl.zst          wheelhouse mode: each wheel once, shared by every backup
    locks/backups.lock               one writer at a time (fsutil.Mutex: works on Lustre and NFS)

A backup is written in ``envs/NAME/.partial-STAMP-PID`` and renamed to ``STAMP`` when complete (a
``transaction``), so an interrupted backup is never listed; the next writer removes what it left. ``backup.json``
carries a checksum of its own content.
"""

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
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import field
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder import __version__, fsutil, purge, removal, settings, state, transaction
from envbuilder.backends import registry
from envbuilder.backup import archive, wheelhouse
from envbuilder.errors import BackupError, CommandFailed, DiskError, EnvbuilderError, UsageError
from envbuilder.structs import dataclass

BACKUP_VERSION = 1
MODES = ("wheelhouse", "archive")
FORMATS = ("tar", "squashfs")
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _modes(prefix: Path) -> tuple[int, int]:
    """File and directory modes for a backup of ``prefix``: private, plus the read access the env itself gives
    its group and others (a backup is never more readable than the env)."""
    try:
        bits = prefix.stat().st_mode
    except OSError:
        bits = 0
    file_mode = 0o600 | (bits & 0o044)
    dir_mode = 0o700 | (0o050 if bits & 0o040 else 0) | (0o005 if bits & 0o004 else 0)
    return file_mode, dir_mode


def checksum(data: Mapping[str, Any]) -> str:
    body = {k: v for k, v in data.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# Listing


@dataclass(frozen=True)
class Backup:
    root: Path
    path: Path
    data: Mapping[str, Any]
    verified: Optional[Mapping[str, Any]]
    error: Optional[str] = None

    @property
    def env(self) -> str:
        return self.path.parent.name

    @property
    def stamp(self) -> str:
        return self.path.name

    @property
    def id(self) -> str:
        return f"{self.env}@{self.stamp}"

    @property
    def mode(self) -> str:
        return str(self.data.get("mode", "?"))

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "env": self.env,
            "mode": self.mode,
            "created": self.data.get("created"),
            "prefix": self.data.get("prefix"),
            "bytes": self.data.get("bytes"),
            "new_bytes": self.data.get("new_bytes"),
            "packages": len(self.data.get("wheels", ())),
            "verified": dict(self.verified) if self.verified else None,
            "path": str(self.path),
            "error": self.error,
        }


def _load(root: Path, path: Path) -> Backup:
    rel = path.relative_to(root).as_posix()
    verified = None
    with contextlib.suppress(OSError, ValueError):
        verified = json.loads(_read(root, f"{rel}/verify.json"))
    try:
        data = json.loads(_read(root, f"{rel}/backup.json"))
    except OSError as exc:
        return Backup(root, path, {}, verified, f"backup.json is unreadable: {exc.strerror}")
    except ValueError as exc:
        return Backup(root, path, {}, verified, f"backup.json is unreadable: {exc}")
    if not isinstance(data, dict) or data.get("version") != BACKUP_VERSION:
        return Backup(root, path, {}, verified, f"backup.json has format {data.get('version')!r}")
    if data.get("checksum") != checksum(data):
        return Backup(
            root, path, data, verified, "backup.json does not match its checksum (changed or damaged)"
        )
    return Backup(root, path, data, verified)


def _read(root: Path, rel: str) -> bytes:
    """A file of the backup root, read only if envbuilder could have written it (no symlink on the way)."""
    with removal.open_below(root, rel) as fh:
        return fh.read()


def backups(root: Path, env: Optional[str] = None) -> list[Backup]:
    """Complete backups, oldest first (partial ones, named with a leading dot, are not backups)."""
    return listing(root, env)[0]


def listing(root: Path, env: Optional[str] = None) -> tuple[list[Backup], list[str]]:
    """Complete backups, oldest first, and what was skipped, in words: a symlink where the ``envs`` directory, an
    env's directory or a backup should be (the root itself may be a link: the user's choice). Nothing a link
    planted in the root points to is listed or read."""
    skipped: list[str] = []
    found = []
    for env_dir in _directories(
        root / "envs", "a directory of backups envbuilder wrote", skipped, env, top=True
    ):
        for path in _directories(env_dir, "a backup envbuilder wrote", skipped):
            if os.path.lexists(path / "backup.json"):
                found.append(_load(root, path))
    return sorted(found, key=lambda b: (b.stamp, b.env)), skipped


def _directories(
    base: Path, what: str, skipped: list[str], only: Optional[str] = None, top: bool = False
) -> list[Path]:
    """The directories in ``base`` (none named with a leading dot; ``only`` that one if given), sorted, none
    followed through a symlink: a link is named in ``skipped``. With ``top``, ``base`` itself is checked too."""
    if top and base.is_symlink():
        skipped.append(_skip(base, what))
        return []
    try:
        with os.scandir(base) as listed:
            entries = sorted(listed, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(".") or only not in (None, entry.name):
            continue
        if entry.is_symlink():
            skipped.append(_skip(Path(entry.path), what))
        elif entry.is_dir(follow_symlinks=False):
            found.append(Path(entry.path))
    return found


def _skip(path: Path, what: str) -> str:
    with contextlib.suppress(OSError):
        return f"{path} is a symlink (to {path.readlink()}), not {what}; skipped it"
    return f"{path} is a symlink, not {what}; skipped it"


def _because(skipped: Sequence[str]) -> str:
    return f" ({'; '.join(skipped)})" if skipped else ""


def find(root: Path, what: str, backup_id: Optional[str] = None) -> Backup:
    """``what`` is an env name (its newest backup, or ``backup_id``) or a backup id ``NAME@STAMP``."""
    if "@" in what and backup_id is None:
        what, backup_id = what.split("@", 1)
    state.record_path(root, what)  # validates the name
    mine, skipped = listing(root, what)
    if backup_id is not None:
        stamp = backup_id.split("@", 1)[1] if "@" in backup_id else backup_id
        for b in mine:
            if b.stamp == stamp:
                return b
        raise BackupError(
            f"no backup {what}@{stamp} in {root}" + _because(skipped),
            hint=f"envbuilder backups {what}" if mine else "envbuilder backups",
        )
    if not mine:
        others = sorted({b.env for b in backups(root)})
        from envbuilder.errors import did_you_mean  # noqa: PLC0415 - only on this error path

        raise BackupError(
            f"no backup of {what!r} in {root}" + _because(skipped),
            hint=did_you_mean(what, others) or f"envbuilder backup {what} makes one",
        )
    return mine[-1]


# ---------------------------------------------------------------------------------------------------------------
# Writing


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
) -> BackupResult:
    """Back ``record``'s env up under ``root`` (call with writer_mutex and the env's mutex held)."""
    prefix = Path(record.prefix)
    _refuse_unbackable(record, prefix, mode)
    file_mode, dir_mode = _modes(prefix)
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
                data.update(_wheelhouse(record, prefix, root, file_mode, step=step, notes=notes))
            else:
                data.update(_archive(prefix, tx.partial, fmt, file_mode, step))
            data["verified"] = data["created"]
            data["checksum"] = checksum(data)
            text = (json.dumps(data, indent=1) + "\n").encode()
            fsutil.write_atomic(tx.partial / "backup.json", text, file_mode)
            tx.swap()
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise _no_space(root, exc.errno, exc.strerror or str(exc)) from None
        raise
    except CommandFailed as exc:
        if exc.returncode == -signal.SIGXFSZ:  # the compressor passed the file size limit (ulimit -f)
            raise _no_space(root, errno.EFBIG, "the file size limit (ulimit -f) was reached") from None
        for number, words in ((errno.EDQUOT, "quota"), (errno.ENOSPC, "space"), (errno.EFBIG, "too large")):
            if words in exc.stderr_tail.lower():
                raise _no_space(root, number, exc.stderr_tail.strip().splitlines()[-1]) from None
        raise
    return BackupResult(_load(root, tx.final), notes)


def _refuse_unbackable(record: state.EnvRecord, prefix: Path, mode: str) -> None:
    """A BackupError where this env cannot be backed up this way: gone, damaged, or a wheelhouse of a non-venv."""
    if not prefix.is_dir():
        raise BackupError(
            f"{record.name} is gone ({prefix} does not exist); there is nothing to back up",
            hint=f"envbuilder restore {record.name}",
        )
    # A wheelhouse backup finds missing files itself while reading RECORDs (one pass instead of two).
    health = state.health(record) if mode == "archive" else state.Health("ok", "")
    if health.status == "damaged":
        raise BackupError(
            f"{record.name} is damaged ({health.detail}): a backup of it would not restore",
            hint=f"envbuilder restore {record.name} --force (from an earlier backup) or "
            f"envbuilder create {record.name} --force",
        )
    if mode == "wheelhouse" and not registry.kind_info(record.kind).venv:
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


# ---------------------------------------------------------------------------------------------------------------
# Verifying and pruning


def verify(
    b: Backup, record_result: bool = True, hash_wheels: bool = True, cancel: Optional[threading.Event] = None
) -> list[str]:
    """Re-hash everything the backup holds; the problems found (none: it restores as written). With
    ``hash_wheels`` false the stored wheels are only checked for presence and size (restore hashes them as it
    decompresses them, before anything is installed). Once ``cancel`` is set, wheels not yet started are
    skipped (restore stops checking when it turns to decompressing, which checks them anyway)."""
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
                            b.root, w["path"], w["size"], w["sha256"] if hash_wheels else None, w["name"]
                        )
                    ),
                    wheels,
                )
                for more in found:
                    problems += more
        else:
            arc = b.data.get("archive", {})
            rel = b.path.relative_to(b.root).as_posix()
            problems += _check_file(b.root, f"{rel}/{arc['file']}", arc["size"], arc["sha256"], "the archive")
            try:
                digest = hashlib.sha256(_read(b.root, f"{rel}/manifest.json")).hexdigest()
            except OSError:
                digest = "missing"
            if digest != arc.get("manifest_sha256"):
                problems.append("manifest.json is missing or changed")
    if record_result and b.path.is_dir():
        result = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "ok": not problems, "problems": problems}
        file_mode, _ = _modes(b.path)
        with contextlib.suppress(OSError):
            fsutil.write_atomic(b.path / "verify.json", json.dumps(result).encode(), file_mode & 0o644)
    return problems


def _check_file(root: Path, rel: str, size: int, digest: Optional[str], what: str) -> list[str]:
    """Problems with the file ``rel`` of the backup root, read without following a symlink."""
    path = root / rel
    try:
        with removal.open_below(root, rel) as fh:
            actual_size = os.fstat(fh.fileno()).st_size
            if actual_size != size:
                return [f"{what}: {path} has {actual_size} bytes, {size} were written"]
            if digest is not None and wheelhouse.fh_sha256(fh) != digest:
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
    return result


def _files_size(path: Path) -> int:
    """The bytes of the regular files directly in ``path`` (none followed through a link)."""
    total = 0
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def make_all(
    records: Sequence[state.EnvRecord],
    root: Path,
    mode: Optional[str],
    step: Callable[[str], None],
    *,
    home: Path,
) -> tuple[list[BackupResult], list[tuple[str, EnvbuilderError]]]:
    """Back every env up (wheelhouse for venvs, archive otherwise, unless ``mode`` says), each under its env's
    mutex (an env another envbuilder is changing is a failure, not a wait); failures are collected, not fatal,
    so one broken env does not stop the rest."""
    done, failed = [], []
    for record in records:
        try:
            with state.mutex(home, record.name):
                done.append(make(record, root, mode or default_mode(record), step=step))
        except EnvbuilderError as exc:
            failed.append((record.name, exc))
    return done, failed


def default_mode(record: state.EnvRecord) -> str:
    """A wheelhouse for an env of wheels (venvs), else an archive."""
    return "wheelhouse" if registry.kind_info(record.kind).venv else "archive"


def advice(record: state.EnvRecord, health: str, have_backup: bool) -> Optional[str]:
    """The one thing to do about an env's safety (for list and create), or None."""
    if health in ("gone", "damaged") and have_backup:
        return f"envbuilder restore {record.name}" + (" --force" if health == "damaged" else "")
    if health == "ok" and not have_backup and purge.policy(record):
        return f"envbuilder backup {record.name}"
    return None
