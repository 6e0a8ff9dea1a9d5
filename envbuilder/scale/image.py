"""Scale mode: an env as one squashfs image, used from a node-local mount (squashfuse, user space) or, where
FUSE is not available, from a node-local unpacked copy. ``import torch`` then makes its thousands of metadata
calls against the node, not the shared file system: one image file is all the job opens there.

The image is built beside its final name and renamed into place, its sha256 and what it was built from (the
env's package inventory and its newest package-directory mtime) kept in the env's record: an image older than
its env (a later ``pip install``) is stale, reported and refused. The record is written before the rename and
names the complete image still beside its place (``pending``): a pack killed between the two is finished by
the next command that uses or packs the image, so the record and the image at its path always go together. Mount points live in a directory of this
user's own (mode 0700) under ``$TMPDIR`` or ``/tmp``; a mount whose squashfuse died (a killed job) is unmounted
on the next use.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from envbuilder.backup import archive, wheelhouse
from envbuilder.core import kinds, settings
from envbuilder.core.errors import StateError
from envbuilder.core.shells import registry as shells
from envbuilder.core.structs import dataclass
from envbuilder.render import activate_scripts
from envbuilder.system import fsutil, proc, state, strictmodes, transaction

SUFFIX = ".sqfs"
#: In a record's image: the partial image (its name, beside the final one) that pack recorded and has yet to
#: rename into place. A kill in between leaves it for :func:`finish`.
PENDING = "pending"
#: Set to 1: use the unpacked copy even where squashfuse and /dev/fuse exist (a node without FUSE, in tests).
NO_FUSE_VAR = "ENVBUILDER_NO_FUSE"
#: Inside an unpacked copy: the digest of the image it came from, written last (its presence means complete).
UNPACKED_MARK = ".envbuilder-image"
#: How long a use of an image waits for another process that is mounting or unpacking it on this node.
MOUNT_WAIT_S = 600.0


# ---------------------------------------------------------------------------------------------------------------
# What an image was built from, and whether it is still the env


def _site_dirs(prefix: Path) -> list[Path]:
    return sorted(prefix.glob("lib/python*/site-packages"))


def inventory(prefix: Path) -> list[str]:
    """The env's installed distributions, as their metadata directories name them (``torch-2.13.0.dist-info``)."""
    return sorted(p.name for site in _site_dirs(prefix) for p in site.glob("*.dist-info"))


def stamp(prefix: Path) -> float:
    """The newest change to what is installed: an install, upgrade or removal touches site-packages, ``bin`` or
    a distribution's metadata directory."""
    dirs = [prefix / "bin", *_site_dirs(prefix)]
    dirs += [p for site in _site_dirs(prefix) for p in site.glob("*.dist-info")]
    return max((d.stat().st_mtime for d in dirs if d.is_dir()), default=0.0)


@dataclass(frozen=True)
class Freshness:
    status: str  # none | ok | stale | missing
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"status": self.status, "detail": self.detail}


def freshness(record: state.EnvRecord) -> Freshness:
    """Whether the env's image (if it has one) still holds what the env holds."""
    img = record.image
    if not img:
        return Freshness("none", "no image (envbuilder pack makes one)")
    path = Path(img["path"])
    if not path.is_file():
        return Freshness("missing", f"{path} is gone (purged or removed)")
    prefix = Path(record.prefix)
    if not prefix.is_dir():
        return Freshness("ok", f"{path}; the env directory itself is gone")
    now = inventory(prefix)
    built = list(img.get("packages", ()))
    if now != built:
        added = sorted(set(now) - set(built))
        gone = sorted(set(built) - set(now))
        change = ", ".join([*(f"+{p}" for p in added[:3]), *(f"-{p}" for p in gone[:3])])
        return Freshness("stale", f"{path} is older than the env: its packages changed since ({change})")
    if stamp(prefix) > float(img.get("stamp", 0)):
        return Freshness(
            "stale", f"{path} is older than the env: packages were reinstalled after it was packed"
        )
    return Freshness("ok", str(path))


# ---------------------------------------------------------------------------------------------------------------
# pack


def container_file(record: state.EnvRecord) -> Optional[Path]:
    """A container env's image file (None for other kinds): one file already, which pack leaves as it is and
    stage copies node-local as it is."""
    if not kinds.kind_info(record.kind).container:
        return None
    return Path(record.prefix) / str(record.tools.get("image_file") or "image.sif")


def refusal(record: state.EnvRecord) -> Optional[str]:
    """Why the env cannot be used from an image mounted elsewhere (None: it can)."""
    kind = kinds.kind_info(record.kind)
    if kind.container:
        return (
            "it is a container env: its image file is the env, run through its runtime (envbuilder stage copies "
            "it node-local), not a squashfs of a venv to mount"
        )
    if kind.overlay:
        return (
            "it is an overlay env: it uses the site's python and packages outside its own directory, "
            "which an image of that directory does not hold"
        )
    if kind.conda or record.kind != "venv":
        return (
            f"it is a {record.kind} env, whose files name its directory ({record.prefix}); from an image "
            "mounted elsewhere they would point back at the shared file system. Expected a venv built by uv"
        )
    installer = record.tools.get("installer") or record.plan.get("installer")
    if installer != "uv":
        return (
            f"it was built by {installer or 'an unknown installer'}, whose scripts name the env's "
            "directory; an image works only for a relocatable venv (expected installer uv)"
        )
    return None


def image_path(record: state.EnvRecord, to: Optional[Path]) -> Path:
    """Where the image goes: ``to`` (a directory, e.g. on $WORK), else beside the env."""
    where = to if to is not None else Path(record.prefix).parent
    return where / f"{record.name}{SUFFIX}"


def pack(home: Path, record: state.EnvRecord, to: Optional[Path]) -> state.EnvRecord:
    """Write the env's image (beside its final name, then renamed in), record it; the updated record."""
    why = refusal(record)
    if why:
        raise StateError(
            f"cannot pack {record.name}: {why}",
            hint="rebuild it as a uv venv (env.kind = venv, installer uv)",
        )
    prefix = Path(record.prefix)
    if not prefix.is_dir():
        raise StateError(
            f"{record.name} is gone from {record.prefix}: there is nothing to pack",
            hint=f"envbuilder restore {record.name}, or envbuilder create {record.recipe}",
        )
    mksquashfs = _mksquashfs()
    final = image_path(record, to)
    final.parent.mkdir(parents=True, exist_ok=True)
    # What a killed pack of this env left (the env's mutex is held): a renaming to finish, its partial image.
    record = finish(home, record)
    transaction.recover(final)
    partial = transaction.partial_of(final)
    packages, newest = inventory(prefix), stamp(prefix)
    recorded = False
    try:
        compression = _squash(mksquashfs, prefix, partial)
        image = {
            "path": str(final),
            "sha256": wheelhouse.file_sha256(partial),
            "bytes": partial.stat().st_size,
            "compression": compression,
            "packed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "packages": packages,
            "stamp": newest,
        }
        # The record first, naming the complete partial: from here on the next command finishes the rename.
        state.save(home, replace(record, image={**image, PENDING: partial.name}))
        recorded = True
        transaction.pause(os.environ, "pack-recorded")
        partial.replace(final)
    finally:
        if not recorded:
            transaction.delete(partial)
    fsutil.fsync_dir(final.parent)
    transaction.pause(os.environ, "after-rename")
    updated = replace(record, image=image)
    state.save(home, updated)
    return updated


def _mksquashfs() -> str:
    mksquashfs = archive.Tools.find().mksquashfs
    if not mksquashfs:
        raise StateError(
            "envbuilder pack needs mksquashfs, which is not on PATH",
            hint="install squashfs-tools or load its module",
        )
    return mksquashfs


def _squash(mksquashfs: str, prefix: Path, into: Path) -> str:
    """``prefix`` squashed into the image ``into``; its compression."""
    argv = [mksquashfs, str(prefix), str(into), "-noappend", "-quiet", "-no-progress"]
    compression = "zstd" if archive.squashfs_zstd(mksquashfs) else "gzip"
    if compression == "zstd":
        argv += ["-comp", "zstd", "-Xcompression-level", "3"]  # as fast as tar+zstd; level 15 is 20x slower
    proc.run(argv, timeout=None)
    return compression


def finish(home: Path, record: state.EnvRecord) -> state.EnvRecord:
    """Finish the pack a kill stopped after it recorded its image (call with the env's mutex held): the image it
    made, complete beside its final name, is renamed in, and the record no longer says that is pending. The
    record as it stands now."""
    pending = record.image.get(PENDING)
    if not pending:
        return record
    final = Path(record.image["path"])
    made = final.parent / str(pending)
    with contextlib.suppress(FileNotFoundError):  # renamed in already, by the pack the kill stopped
        st = made.lstat()
        ours = made.name.startswith(f".{final.name}{transaction.PARTIAL}") and made.parent == final.parent
        if ours and stat.S_ISREG(st.st_mode) and st.st_size == record.image.get("bytes"):
            made.replace(final)
            fsutil.fsync_dir(final.parent)
    done = replace(record, image={k: v for k, v in record.image.items() if k != PENDING})
    state.save(home, done)
    return done


def settled(record: state.EnvRecord, env: Mapping[str, str]) -> state.EnvRecord:
    """The record, with a pack a kill stopped half-way finished first (under the env's mutex, which a running
    pack holds until it is done): the image it names is then the one at its path."""
    if not record.image.get(PENDING):
        return record
    home = settings.home(env)
    with state.mutex(home, record.name, timeout=MOUNT_WAIT_S):
        return finish(home, state.load(home, record.name))


# ---------------------------------------------------------------------------------------------------------------
# Using an image on this node


def node_base(env: Mapping[str, str]) -> Path:
    """Where :func:`node_dir` is on this node: under ``$TMPDIR`` where that is a directory here, else under /tmp
    (a job inherits its submit host's TMPDIR, which a compute node may lack; Python's tempfile falls back alike)."""
    tmp = env.get("TMPDIR")
    root = Path(tmp) if tmp and Path(tmp).is_dir() else Path("/tmp")  # noqa: S108 - a private 0700 dir below
    return root / f"envbuilder-{os.getuid()}"


#: The way out when this node's directory for images (:func:`node_base`) cannot be written.
NODE_WAY_OUT = "set TMPDIR to a node-local directory of yours with space (image mounts and unpacked images)"


def default_base() -> Path:
    """The node-local directory every node names alike, whatever its TMPDIR: :func:`node_base` without one."""
    return node_base({})


def node_dir(env: Mapping[str, str]) -> Path:
    """This user's directory for mounts and unpacked copies on this node: mode 0700, ours, not a link."""
    base = node_base(env)
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    st = base.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise StateError(
            f"{base} is not a directory of your own (expected one owned by uid {os.getuid()}, mode 0700)",
            hint="remove it, or set TMPDIR to a node-local directory of yours",
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        base.chmod(0o700)
    # Its parents too ($TMPDIR, /tmp): another user's or an open one could swap this directory for theirs.
    strictmodes.check(
        base, what="the node-local image directory", elsewhere="set TMPDIR to a node-local directory of yours"
    )
    return base


def _unescape(field: str) -> str:
    """A path as /proc/mounts writes it (space, tab, newline and backslash as octal escapes)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounted(path: Path) -> bool:
    """Whether a file system is mounted at ``path`` (by /proc/mounts: a dead FUSE mount cannot be stat'ed)."""
    try:
        lines = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return False
    return any(len(f) > 1 and _unescape(f[1]) == str(path) for f in (line.split(" ") for line in lines))


def fusermount() -> Optional[str]:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def _fuse(env: Mapping[str, str]) -> Optional[tuple[str, str]]:
    """squashfuse and fusermount, where this node can mount with FUSE (and ENVBUILDER_NO_FUSE is not set)."""
    if env.get(NO_FUSE_VAR) == "1" or not Path("/dev/fuse").exists():
        return None
    squashfuse, unmount = shutil.which("squashfuse"), fusermount()
    return (squashfuse, unmount) if squashfuse and unmount else None


def clean_stale(path: Path) -> bool:
    """Unmount a mount at ``path`` whose squashfuse is gone (a killed job's): it is listed but cannot be read.
    True when one was cleaned up."""
    if not mounted(path):
        return False
    try:
        path.stat()
        return False  # alive: its squashfuse still answers
    except OSError:
        pass
    unmount = fusermount()
    if not unmount:
        raise StateError(f"{path} is a dead FUSE mount and neither fusermount3 nor fusermount is on PATH")
    # -z: the dead mount may still be some shell's current directory.
    proc.run([unmount, "-u", "-z", str(path)])
    return True


@dataclass(frozen=True)
class InUse:
    """An image ready on this node: where the env is (``path``), and how (squashfuse or unpacked)."""

    name: str
    path: Path
    how: str
    cleaned: bool  # a dead mount was cleaned up first

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "how": self.how, "cleaned_stale_mount": self.cleaned}


def usable(record: state.EnvRecord) -> Path:
    """The env's image, when it has one that is still the env; else the error says what was expected."""
    why = refusal(record)
    if why:
        raise StateError(f"{record.name} cannot run from an image: {why}")
    fresh = freshness(record)
    if fresh.status == "none":
        raise StateError(
            f"{record.name} has no image (expected one made by envbuilder pack)",
            hint=f"envbuilder pack {record.name}",
        )
    if fresh.status != "ok":
        raise StateError(
            f"the image of {record.name} cannot be used: {fresh.detail} (expected one packed from the env as it is)",
            hint=f"envbuilder pack {record.name} again",
        )
    return Path(record.image["path"])


def image_key(record: state.EnvRecord) -> str:
    """The name of the env's image on a node: a new pack (a container env: a new image) gets a new one."""
    digest = record.tools.get("image_sha256") if container_file(record) else record.image["sha256"]
    return f"{record.name}-{str(digest)[:16]}"


def container_usable(record: state.EnvRecord) -> tuple[Path, str]:
    """A container env's image file and the sha256 it was recorded with, where it is there; else the error says
    how to get it back."""
    path = container_file(record)
    digest = str(record.tools.get("image_sha256") or "")
    if path is None or not path.is_file() or not digest:
        raise StateError(
            f"{record.name} has no image file to stage: {path} "
            + ("is gone (purged or removed)" if digest else "has no sha256 recorded"),
            hint=f"envbuilder restore {record.name} --force, or envbuilder create {record.name} --force",
        )
    return path, digest


def staged_file(base: Path, key: str, name: str) -> Path:
    """A container env's image file ``name`` (``image.sif``) staged on a node under ``base``."""
    return base / f"{key}.{name}"


def unpacked_path(base: Path, key: str) -> Path:
    return base / f"{key}.unpacked"


def use(record: state.EnvRecord, env: Mapping[str, str]) -> InUse:
    """Mount the env's image on this node (or reuse its mount), else unpack it there."""
    record = settled(record, env)
    image = usable(record)
    digest = str(record.image["sha256"])
    base = node_dir(env)
    key = image_key(record)
    mount_point = base / key
    # One mount per image and node: the ranks of a job that each start from the image wait for the first.
    with fsutil.Mutex(base / f".{key}.lock", timeout=MOUNT_WAIT_S):
        cleaned = clean_stale(mount_point)
        fuse = _fuse(env)
        if fuse is not None:
            if not mounted(mount_point):
                verify(image, digest)
                mount_point.mkdir(mode=0o700, exist_ok=True)
                proc.run([fuse[0], "-o", "ro", str(image), str(mount_point)])
            return InUse(record.name, mount_point, "squashfuse", cleaned)
        unpacked = unpacked_path(base, key)
        unpack_once(image, unpacked, digest)
        return InUse(record.name, unpacked, "unpacked", cleaned)


def unpack_once(image: Path, into: Path, digest: str, checked: bool = False) -> None:
    """``image`` unpacked at ``into``, unless a complete copy of it is there already. ``checked``: the caller
    has compared it with ``digest`` already (an image is read once for that)."""
    if not (into / UNPACKED_MARK).is_file():
        if not checked:
            verify(image, digest)
        _unpack(image, into, digest)


def verify(image: Path, digest: str) -> None:
    if wheelhouse.file_sha256(image) != digest:
        raise StateError(
            f"{image} does not match its recorded sha256 {digest[:16]}… (damaged or replaced)",
            hint="envbuilder pack the env again",
        )


def _unpack(image: Path, into: Path, digest: str) -> None:
    """unsquashfs beside ``into``, marked complete, renamed in (a killed unpack leaves only a partial)."""
    tools = archive.Tools.find()
    # The image's mutex on this node is held: every partial here is a killed unpack's, not a running one's.
    transaction.recover(into)
    partial = transaction.partial_of(into)
    if os.path.lexists(into):  # an unmarked copy (an older envbuilder's killed unpack), or a dangling alias
        transaction.delete(into)
    try:
        archive.unpack(image, partial, tools)
        (partial / UNPACKED_MARK).write_text(digest + "\n", encoding="utf-8")
        partial.replace(into)
    finally:
        transaction.delete(partial)


def activate_line(used: InUse, shell: str) -> str:
    """The line that activates the env from ``used`` in ``shell`` (a registered name); its deactivate also
    unmounts a squashfuse mount. The scripts are written beside the mount (the image itself is read-only)."""
    chosen = shells.get(shell)
    syntax = chosen.syntax
    needs = syntax.image_needs
    if needs and not (used.path / needs).is_file():
        raise StateError(
            f"the image of {used.name} has no {needs}: it was packed from an env built before envbuilder wrote "
            f"{shell} activation",
            hint=f"envbuilder create {used.name} --force, then envbuilder pack {used.name}; or use "
            + shells.in_every_env(),
        )
    unmount = fusermount() if used.how == "squashfuse" else None
    scripts = activate_scripts.render_image_activate(str(used.path), unmount, syntax)
    for path, text in scripts.items():
        fsutil.write_atomic(Path(path), text.encode())
    line = syntax.line(next(iter(scripts)))
    if not line_has_comment(shell):
        return line  # an interactive shell that takes no comments: `#` would be read as words for source
    return f"{line}  # {described(used)}"


def line_has_comment(shell: str) -> bool:
    """Whether :func:`activate_line` says in a comment how the image is used (else say it on its own)."""
    return shells.get(shell).comments


def described(used: InUse) -> str:
    """How the image is used, in words (the activate line's comment, or a message where it takes none)."""
    return "image " + (
        "mounted with squashfuse" if used.how == "squashfuse" else "unpacked (no FUSE on this node)"
    )


def runs_dir(used: InUse) -> Path:
    """Where validation runs of the env from ``used`` write their files: beside the (read-only) mount."""
    return used.path.parent / f"{used.path.name}.validation"


def mounted_record(record: state.EnvRecord, used: InUse) -> state.EnvRecord:
    """The record as commands that run the env see it: the env at the mount (never saved)."""
    return replace(record, prefix=str(used.path))
