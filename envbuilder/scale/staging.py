"""``envbuilder stage ENV`` inside a Slurm allocation: the env's image on every node's local storage, copied by the
scheduler's own broadcast (``sbcast``, one read of the shared file system fanned out by Slurm), then unpacked there
on each node by a one-task-per-node step, so the job's ranks import from node-local files.

Unpacked, not mounted: a squashfuse started in a step of its own is a process of that step, which Slurm ends
(proctrack) when the step ends, leaving a dead mount for the next step. An unpacked copy outlives the step that
made it. It sits where ``--image`` on a node without FUSE looks for its copy (:func:`image.unpacked_path` under
:func:`image.node_base`), keyed by the image's digest, so a new pack is staged afresh (the env's older copies on
the node are dropped then) and a repeated stage of the same image copies nothing. ``stage --clean`` removes them.

Each node resolves its own local directory (its ``$TMPDIR``, else /tmp), when the step runs there. A job script
is written before any node is known, so its ranks name the copy by its alias in :func:`image.default_base`, the
directory every node names alike: each node links the alias to its own copy (or holds the copy there).

PBS has no broadcast of its own: in a PBS job each node copies the image from where it was packed (``$WORK``, the
shared file system) in parallel, started on every node of ``$PBS_NODEFILE`` by the job's own remote start, the
site's node launcher (``mpiexec``, one task per node), and unpacks it as under Slurm. That is the issue's fallback;
a site's documented staging tool, where it has one, is the better way there.

The steps run envbuilder's hidden ``__stage-node`` command on each node, with the python envbuilder runs on (the
env's own may not be on the node yet).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from envbuilder.core import containers, schedulers
from envbuilder.core.errors import UsageError
from envbuilder.core.space import Need
from envbuilder.core.structs import dataclass
from envbuilder.plan import preflight as estimate
from envbuilder.render import activate_scripts
from envbuilder.scale import image
from envbuilder.system import fsutil, proc, removal, space, state, transaction
from envbuilder.validate import runner

#: What the node side prints when the node holds a complete copy already.
READY = "ready"


@dataclass(frozen=True)
class Staged:
    """The env's image unpacked at ``path`` on each of ``nodes`` nodes; ``copied``: some node got a copy (else
    every node had it already)."""

    name: str
    path: Path
    nodes: int
    copied: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "nodes": self.nodes, "copied": self.copied}


@dataclass(frozen=True)
class Cleaned:
    """What ``stage --clean`` removed: per node, the env's staged copies (any digest)."""

    name: str
    removed: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": len(self.removed), "removed": self.removed}


def _allocation(env: Mapping[str, str]) -> tuple[schedulers.Scheduler, schedulers.Where]:
    """This job's scheduler and where it runs (a PBS job's node count read from its $PBS_NODEFILE)."""
    here = runner.locate(env)
    adapter = schedulers.get(here.scheduler)
    refused = adapter.unstageable(here) if adapter else None
    if refused:
        raise UsageError(refused[0], hint=refused[1])
    if adapter is None or not here.job:
        raise UsageError(
            "envbuilder stage copies the image to the nodes of a job: run it inside an allocation",
            hint="salloc --nodes=N envbuilder stage ENV, or envbuilder run ENV --stage in the job",
        )
    return adapter, here


def planned(record: state.EnvRecord, env: Mapping[str, str]) -> Staged:
    """Where :func:`stage` puts the env in this allocation, without copying (refusing what it would refuse)."""
    _, here = _allocation(env)
    if image.container_file(record) is not None:  # the image file itself, copied as it is
        source, _ = image.container_usable(record)
        path = image.staged_file(image.node_base(env), image.image_key(record), source.name)
        return Staged(record.name, path, here.nodes or 1, copied=False)
    image.usable(record)  # refuses a missing or stale image, saying which
    path = image.unpacked_path(image.node_base(env), image.image_key(record))
    return Staged(record.name, path, here.nodes or 1, copied=False)


def stage(record: state.EnvRecord, env: Mapping[str, str], preflight: bool = True) -> Staged:
    """Copy the env's image to every node of this allocation and unpack it there (a container env's image file:
    copied there as it is). ``preflight``: each node first checks that its directory has room for the copy and
    what it unpacks to (``--need``), and refuses before writing where it has not."""
    if image.container_file(record) is not None:
        return _stage_file(record, env, preflight)
    record = image.settled(record, env)
    plan = planned(record, env)
    key, digest = image.image_key(record), str(record.image["sha256"])
    adapter, here = _allocation(env)
    need = _need(record, int(record.image.get("bytes") or 0)) if preflight else ()
    if not adapter.broadcasts:
        return _stage_fetch(record, plan, adapter, here, env, need=need)
    run_env = proc.scrubbed_env(env)
    prepare = proc.run(_on_each_node(adapter, here, "prepare", key, digest, *need), env=run_env).stdout
    answers = [line.split(" ", 1) for line in prepare.splitlines()]
    if answers and all(a[0] == READY for a in answers):
        return plan
    # sbcast writes one path on every node: the nodes' own directory where they agree, else the one named alike.
    # A temporary name there, which the node step unpacks and removes: a killed sbcast leaves no image under
    # the copy's own name, and the next stage on the node removes what it left.
    bases = {a[1] for a in answers if len(a) == 2}
    into = Path(bases.pop()) if len(bases) == 1 else image.default_base()
    sent = _sent(into, key, str(here.job), adapter.title)
    proc.run(adapter.broadcast(str(image.usable(record)), str(sent)), env=run_env)
    proc.run(_on_each_node(adapter, here, "unpack", key, digest, str(sent)), env=run_env)
    return replace(plan, copied=True)


def _stage_file(record: state.EnvRecord, env: Mapping[str, str], preflight: bool) -> Staged:
    """A container env's image file on every node, as :func:`stage` puts a squashfs image there (one broadcast,
    or each node's own copy where the scheduler has none), checked against its sha256 there and renamed into
    place: never unpacked, since the runtime runs the file."""
    plan = planned(record, env)
    source, digest = image.container_usable(record)
    key = image.image_key(record)
    adapter, here = _allocation(env)
    run_env = proc.scrubbed_env(env)
    need = ("--need", f"{source.stat().st_size}:1") if preflight else ()
    if not adapter.broadcasts:
        fetch = _on_each_node(adapter, here, "fetch-file", key, digest, str(source), *need)
        lines = proc.run(fetch, env=run_env).stdout.splitlines()
        return replace(plan, copied=any(line.split(" ", 1)[0] != READY for line in lines if line))
    prepare = proc.run(
        _on_each_node(adapter, here, "prepare-file", key, digest, source.name, *need), env=run_env
    )
    answers = [line.split(" ", 1) for line in prepare.stdout.splitlines()]
    if answers and all(a[0] == READY for a in answers):
        return plan
    bases = {a[1] for a in answers if len(a) == 2}
    into = Path(bases.pop()) if len(bases) == 1 else image.default_base()
    sent = _sent(into, key, str(here.job), adapter.title, source.name)
    proc.run(adapter.broadcast(str(source), str(sent)), env=run_env)
    proc.run(_on_each_node(adapter, here, "place", key, digest, str(sent)), env=run_env)
    return replace(plan, copied=True)


def _stage_fetch(
    record: state.EnvRecord,
    plan: Staged,
    adapter: schedulers.Scheduler,
    here: schedulers.Where,
    env: Mapping[str, str],
    *,
    need: tuple[str, ...] = (),
) -> Staged:
    """Each node of a job whose scheduler has no broadcast (PBS) copies the image from the shared file system
    and unpacks it, all at once."""
    key, digest = image.image_key(record), str(record.image["sha256"])
    fetch = _on_each_node(adapter, here, "fetch", key, digest, str(image.usable(record)), *need)
    lines = proc.run(fetch, env=proc.scrubbed_env(env)).stdout.splitlines()
    return replace(plan, copied=any(line.split(" ", 1)[0] != READY for line in lines if line))


def _need(record: state.EnvRecord, image_bytes: int) -> tuple[str, ...]:
    """``--need BYTES:FILES`` for the node steps: the image's copy and the env it unpacks to, both there at once
    until the copy is dropped."""
    fig = estimate.of_record(record.to_json())
    return ("--need", f"{image_bytes + fig.bytes}:{fig.files + 1}")


def clean(record: state.EnvRecord, env: Mapping[str, str]) -> Cleaned:
    """Remove the env's staged copies (every digest) from every node of this allocation."""
    adapter, here = _allocation(env)
    out = proc.run(_on_each_node(adapter, here, "clean", record.name), env=proc.scrubbed_env(env)).stdout
    removed = {}
    for line in out.splitlines():
        host, _, count = line.rpartition(" ")
        if host and count.isdigit():  # a launcher's own chatter, if any, is not a node's answer
            removed[host] = int(count)
    return Cleaned(record.name, removed)


def in_job_script(record: state.EnvRecord) -> tuple[Staged, list[str]]:
    """For a job to be submitted: where its ranks will find the env, and the script's command that stages it
    there first. Nothing of this host's node-local storage goes in: the job's nodes resolve their own when the
    command runs, and the ranks use the alias every node names alike."""
    image.usable(record)
    argv = [sys.executable, "-m", "envbuilder", "stage", record.name]
    alias = image.unpacked_path(image.default_base(), image.image_key(record))
    return Staged(record.name, alias, 0, copied=False), argv


def staged_record(record: state.EnvRecord, staged: Staged) -> state.EnvRecord:
    """The record as the job's ranks see it: the env at its node-local copy (never saved)."""
    return image.mounted_record(record, image.InUse(record.name, staged.path, "staged", False))


def _copy(base: Path, key: str) -> Path:
    return base / f"{key}{image.SUFFIX}"


#: How the image broadcast to a node is named until its unpack there: ``.KEY.sqfs.partial-JOB``.
_SENT = re.compile(r"\.(?P<key>.+)" + re.escape(image.SUFFIX + transaction.PARTIAL) + r"\d+")
#: A container env's image file names (``image.sif``), one per runtime.
_FILES = "|".join(sorted({re.escape(r.image_file) for r in containers.RUNTIMES.values()}))
#: How a container env's image file broadcast to a node is named until it is checked: ``.KEY.image.sif.partial-JOB``.
_SENT_FILE = re.compile(rf"\.(?P<key>.+)\.(?P<file>{_FILES}){re.escape(transaction.PARTIAL)}\d+")


def _sent(base: Path, key: str, job: str, scheduler: str, file: str = "") -> Path:
    """Where the broadcast writes the image (``file``: a container env's image file) on each node for job
    ``job`` of ``scheduler`` (its title): beside the copy's name, never at it."""
    name = (
        f".{key}.{file}{transaction.PARTIAL}{job}"
        if file
        else f".{key}{image.SUFFIX}{transaction.PARTIAL}{job}"
    )
    if not (_SENT_FILE if file else _SENT).fullmatch(name):
        raise UsageError(f"job id {job!r} is not a {scheduler} job id (expected digits)")
    return base / name


def _on_each_node(adapter: schedulers.Scheduler, here: schedulers.Where, *args: str) -> list[str]:
    """``__stage-node ARGS`` once on every node of the allocation, as its scheduler starts one task per node (a
    Slurm step, the PBS job's node launcher); each argument passed as one, never through a shell of ours."""
    return adapter.on_each_node(here, (sys.executable, "-m", "envbuilder", "__stage-node", *args))


# ---------------------------------------------------------------------------------------------------------------
# The node side, one task per node


def _there(step: str, key: str, into: str) -> bool:
    """Whether this node has the copy already (then nothing is written, and nothing is checked)."""
    base, _ = _bases()
    if step.endswith("-file"):
        return image.staged_file(base, key, _file_name(Path(into).name)).is_file()
    return _complete(image.unpacked_path(base, key))


def _check_room(need: str) -> None:
    """Refuse (a DiskError, exit 15, on this node's stderr) before copying what this node's directory cannot
    hold."""
    size, _, files = need.partition(":")
    if not (size.isdigit() and files.isdigit()):
        raise UsageError(f"--need {need!r} is not BYTES:FILES")
    base, _ = _bases()
    what = f"the staged copy on {socket.gethostname()}"
    space.check(
        [Need(str(base), what, int(size), int(files), "the env's record and its image")],
        env=os.environ,
        warn=lambda text: print(text, file=sys.stderr),
        way_out="stage where each node has room: a TMPDIR on a larger node-local disk",
    )


def _bases() -> tuple[Path, Path]:
    """This node's directory for copies (its TMPDIR's) and the one every node names alike, both made."""
    here = image.node_dir(proc.scrubbed_env())
    return here, image.node_dir({})


def _complete(path: Path) -> bool:
    return (path / image.UNPACKED_MARK).is_file()


def _prepare(key: str) -> str:
    """Make this node's directories (sbcast writes only into one that exists); whether the copy is there, and
    where this node keeps it."""
    base, _ = _bases()
    if _complete(image.unpacked_path(base, key)):
        with fsutil.Mutex(base / f".{key}.lock", timeout=image.MOUNT_WAIT_S):
            _drop_sent(key)  # a stage killed after its unpack, before it removed the image it was sent
        _link_alias(base, key)
        return f"{READY} {base}"
    return f"empty {base}"


def _unpack(key: str, digest: str, sent: Path) -> str:
    """Unpack the image broadcast to ``sent`` (checked against its digest) into this node's directory, drop it
    (the unpacked files are what the ranks read) with what killed stages left beside it, and the env's older
    copies."""
    base, alias_base = _bases()
    match = _SENT.fullmatch(sent.name)
    if not match or match["key"] != key or sent.parent not in (base, alias_base):
        raise UsageError(
            f"{sent} is not where stage broadcasts the image {key} (.{key}.sqfs.partial-JOB here)"
        )
    return _unpacked(key, digest, _copy(sent.parent, key), sent)


def _unpacked(key: str, digest: str, copy: Path, sent: Optional[Path] = None) -> str:
    """Unpack ``copy`` (or the image broadcast to ``sent``, renamed to ``copy`` once checked) as
    :func:`_unpack` says; this node's line."""
    base, _ = _bases()
    into = image.unpacked_path(base, key)
    with fsutil.Mutex(base / f".{key}.lock", timeout=image.MOUNT_WAIT_S):
        checked = False
        if sent is not None and not _complete(into):
            image.verify(sent, digest)
            sent.replace(copy)  # checked whole: only now under the copy's own name
            checked = True
        image.unpack_once(copy, into, digest, checked=checked)
        copy.unlink(missing_ok=True)
        _drop_sent(key)
    _link_alias(base, key)
    name = key.rsplit("-", 1)[0]
    for where in {base, image.default_base()}:
        _remove_copies(where, name, keep=key)
    return f"{socket.gethostname()} {into}"


def _drop_sent(key: str) -> None:
    """With the image's mutex on this node held and its copy complete: what broadcasts of it left here (a killed
    stage's partial image, or the copy an older envbuilder's sbcast wrote under its own name). A stage of it
    still on its way finds the copy complete and needs none of it."""
    for where in set(_bases()):
        for entry in where.glob(f".{glob.escape(key + image.SUFFIX + transaction.PARTIAL)}*"):
            if _SENT.fullmatch(entry.name):
                transaction.delete(entry)
        transaction.delete(_copy(where, key))


def _fetch(key: str, digest: str, source: Path) -> str:
    """Copy the image from the shared file system onto this node (one read there; the digest check and the
    unpack then read the local copy), and unpack it as :func:`_unpack` does."""
    base, _ = _bases()
    if _complete(image.unpacked_path(base, key)):
        _link_alias(base, key)
        return f"{READY} {base}"
    copy = _copy(base, key)
    # Under the image's mutex on this node, as its unpack: a partial copy here is a killed fetch's.
    with fsutil.Mutex(base / f".{key}.lock", timeout=image.MOUNT_WAIT_S):
        transaction.recover(copy)
        partial = transaction.partial_of(copy)
        try:
            shutil.copyfile(source, partial)
            partial.replace(copy)
        finally:
            transaction.delete(partial)
    return f"copied {_unpacked(key, digest, copy)}"


def _link_alias(base: Path, key: str, file: str = "") -> None:
    """The copy (``file``: of a container env's image file) at its alias in the directory every node names alike
    (a link, unless the copy is there)."""
    alias_base = image.default_base()
    if file:
        alias, target = image.staged_file(alias_base, key, file), image.staged_file(base, key, file)
    else:
        alias, target = image.unpacked_path(alias_base, key), image.unpacked_path(base, key)
    if alias_base == base or (alias.is_file() if file else _complete(alias)):
        return  # a complete copy of the same digest (another job's, or an --image unpack) serves as well
    with fsutil.Mutex(alias_base / f".{key}.lock", timeout=image.MOUNT_WAIT_S):
        if alias.is_dir() and not alias.is_symlink():
            removal.remove_tree(alias)  # an unmarked copy, or one made before this node's TMPDIR was set
        for left in alias_base.glob(f".{glob.escape(alias.name)}.link-*"):
            transaction.delete(left)  # a killed stage's link, never renamed in
        link = alias_base / f".{alias.name}.link-{os.getpid()}"
        link.symlink_to(target)
        link.replace(alias)


def _file_name(file: str) -> str:
    """``file`` as a container env's image file name of a runtime, else a UsageError (it comes from a command
    line: never a path)."""
    if not re.fullmatch(_FILES, file):
        raise UsageError(f"{file!r} is not a container image file name envbuilder writes ({_FILES})")
    return file


def _prepare_file(key: str, file: str) -> str:
    """:func:`_prepare` for a container env's image file: made only once checked, so there means complete."""
    base, _ = _bases()
    if image.staged_file(base, key, _file_name(file)).is_file():
        _link_alias(base, key, file)
        return f"{READY} {base}"
    return f"empty {base}"


def _place(key: str, digest: str, sent: Path) -> str:
    """The image file broadcast to ``sent``, checked against its digest, renamed to its copy's name; the env's
    older copies on the node dropped."""
    base, alias_base = _bases()
    match = _SENT_FILE.fullmatch(sent.name)
    if not match or match["key"] != key or sent.parent not in (base, alias_base):
        raise UsageError(
            f"{sent} is not where stage broadcasts the image file {key} (.{key}.FILE.partial-JOB)"
        )
    return _placed(key, digest, match["file"], sent)


def _fetch_file(key: str, digest: str, source: Path) -> str:
    """This node's copy of a container env's image file from the shared file system (no broadcast: PBS)."""
    base, _ = _bases()
    file = _file_name(source.name)
    if image.staged_file(base, key, file).is_file():
        _link_alias(base, key, file)
        return f"{READY} {base}"
    with fsutil.Mutex(base / f".{key}.lock", timeout=image.MOUNT_WAIT_S):
        partial = base / f".{key}.{file}{transaction.PARTIAL}{os.getpid()}"
        try:
            shutil.copyfile(source, partial)
        except BaseException:
            transaction.delete(partial)
            raise
    return f"copied {_placed(key, digest, file, partial)}"


def _placed(key: str, digest: str, file: str, partial: Path) -> str:
    base, _ = _bases()
    copy = image.staged_file(base, key, file)
    with fsutil.Mutex(base / f".{key}.lock", timeout=image.MOUNT_WAIT_S):
        try:
            if not copy.is_file():
                image.verify(partial, digest)
                if partial.parent != base:  # broadcast to the directory every node names alike
                    moved = base / partial.name
                    shutil.move(str(partial), str(moved))
                    partial = moved
                partial.replace(copy)  # checked whole: only now under the copy's own name
        finally:
            transaction.delete(partial)
    _link_alias(base, key, file)
    name = key.rsplit("-", 1)[0]
    for where in {base, image.default_base()}:
        _remove_copies(where, name, keep=key)
    return f"{socket.gethostname()} {copy}"


def _keys_of(name: str, entry: str) -> bool:
    """Whether ``entry`` (a file name in a node directory) is one of env ``name``'s staged files: a copy, its
    alias, activate script, broadcast image, or a killed unpack's or link's leftover."""
    key = re.escape(name) + r"-[0-9a-f]{16}"
    scripts = "|".join(re.escape(t) for t in activate_scripts.image_script_tails())
    tail = rf"\.unpacked({scripts}|\.partial-\d+|\.link-\d+)?|{re.escape(image.SUFFIX)}(\.partial-\d+)?"
    tail += rf"|\.({_FILES})(\.partial-\d+|\.link-\d+)?"
    return re.fullmatch(rf"\.?{key}({tail})", entry) is not None


def _remove_copies(base: Path, name: str, keep: str = "") -> int:
    """Remove env ``name``'s staged files in ``base`` but those of key ``keep``; how many went."""
    gone = 0
    for entry in sorted(base.iterdir()) if base.is_dir() else ():
        if not _keys_of(name, entry.name) or (keep and entry.name.lstrip(".").startswith(f"{keep}.")):
            continue
        copy = entry.is_dir() and not entry.is_symlink()
        counted = (copy and entry.name.endswith(".unpacked")) or _is_file_copy(entry)
        if copy:
            removal.remove_tree(entry)
        else:
            entry.unlink(missing_ok=True)
        gone += counted
    return gone


def _is_file_copy(entry: Path) -> bool:
    """Whether ``entry`` is a container env's staged image file (a copy, not its alias's link or a partial)."""
    if entry.name.startswith(".") or entry.is_symlink():
        return False
    return re.search(rf"\.({_FILES})$", entry.name) is not None


def _clean(name: str) -> str:
    base, alias_base = _bases()
    gone = sum(_remove_copies(where, name) for where in {base, alias_base})
    return f"{socket.gethostname()} {gone}"


#: A container env's image file: staged as it is (``prepare-file`` with its file name, ``place`` the broadcast
#: file, ``fetch-file`` from the env's prefix).
_FILE_STEPS = {
    "prepare-file": lambda key, digest, into: _prepare_file(key, into),
    "place": lambda key, digest, into: _place(key, digest, Path(into)),
    "fetch-file": lambda key, digest, into: _fetch_file(key, digest, Path(into)),
}


def on_node(step: str, key: str, digest: str = "", into: str = "", need: str = "") -> str:
    """One node's part of a staging step (``prepare``, ``unpack``, ``fetch`` from the image at ``into``, or
    ``clean`` with the env's name as ``key``; ``into``: for ``unpack`` the image sbcast wrote): the line it
    reports. ``need`` ("BYTES:FILES"): the first step that writes on this node checks its room for them first."""
    if step == "clean":
        return _clean(key)
    if need and step in ("prepare", "fetch", "prepare-file", "fetch-file") and not _there(step, key, into):
        _check_room(need)
    if step in _FILE_STEPS:
        return _FILE_STEPS[step](key, digest, into)
    if step == "fetch":
        return _fetch(key, digest, Path(into))
    return _prepare(key) if step == "prepare" else _unpack(key, digest, Path(into))
