"""``envbuilder stage ENV`` inside a Slurm allocation: the env's image on every node's local storage, copied by the
scheduler's own broadcast (``sbcast``, one read of the shared file system fanned out by Slurm), then unpacked there
on each node by a one-task-per-node step, so the job's ranks import from node-local files.

Unpacked, not mounted: a squashfuse started in a step of its own is a process of that step, which Slurm ends
(proctrack) when the step ends, leaving a dead mount for the next step. An unpacked copy outlives the step that
made it. It sits where ``--image`` on a node without FUSE looks for its copy (:func:`image.unpacked_path` under
:func:`image.node_base`), keyed by the image's digest, so a new pack is staged afresh and a repeated stage of the
same image copies nothing.

PBS has no broadcast of its own, and a parallel copy through the site's MPI launcher is untested here: ``stage``
refuses there, saying so.

The steps run envbuilder's hidden ``__stage-node`` command on each node, with the python envbuilder runs on (the
env's own may not be on the node yet).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envbuilder import fsutil, image, proc, state
from envbuilder.errors import UsageError
from envbuilder.validate import schedulers

#: What the node side prints when the node holds a complete copy already.
READY = "ready"


@dataclass(frozen=True)
class Staged:
    """The env's image unpacked at ``path`` on each of ``nodes`` nodes; ``copied``: sbcast ran (else every node
    had it already)."""

    name: str
    path: Path
    nodes: int
    copied: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "nodes": self.nodes, "copied": self.copied}


def _allocation(env: Mapping[str, str]) -> schedulers.Where:
    here = schedulers.locate(env)
    if here.scheduler == "pbs":
        raise UsageError(
            "envbuilder stage needs Slurm's sbcast; PBS has no broadcast of its own and a parallel copy is "
            "not supported yet",
            hint="run from the env directory, or stage by hand with the site's documented copy tool",
        )
    if here.scheduler != "slurm" or not here.job:
        raise UsageError(
            "envbuilder stage copies the image to the nodes of a job: run it inside an allocation",
            hint="salloc --nodes=N envbuilder stage ENV, or envbuilder run ENV --stage in the job",
        )
    return here


def step_argv(here: schedulers.Where) -> list[str]:
    """One task on every node of the allocation (sharing resources when this already runs inside a step)."""
    nodes = here.nodes or 1
    argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
    return [*argv, "--overlap"] if here.in_step else argv


def planned(record: state.EnvRecord, env: Mapping[str, str]) -> Staged:
    """Where :func:`stage` puts the env in this allocation, without copying (refusing what it would refuse)."""
    here = _allocation(env)
    image.usable(record)  # refuses a missing or stale image, saying which
    path = image.unpacked_path(image.node_base(env), image.image_key(record))
    return Staged(record.name, path, here.nodes or 1, copied=False)


def stage(record: state.EnvRecord, env: Mapping[str, str]) -> Staged:
    """Copy the env's image to every node of this Slurm allocation and unpack it there."""
    plan = planned(record, env)
    key, digest = image.image_key(record), str(record.image["sha256"])
    step = [*step_argv(schedulers.locate(env)), sys.executable, "-m", "envbuilder", "__stage-node"]
    run_env = proc.scrubbed_env(env)
    answers = proc.run([*step, "prepare", key, digest], env=run_env).stdout.split()
    if answers and all(a == READY for a in answers):
        return plan
    copy = _copy(image.node_base(env), key)
    proc.run(["sbcast", "--force", str(image.usable(record)), str(copy)], env=run_env)
    proc.run([*step, "unpack", key, digest], env=run_env)
    return replace(plan, copied=True)


def in_job_script(record: state.EnvRecord, env: Mapping[str, str]) -> tuple[Staged, list[str]]:
    """For a job to be submitted: where its ranks will find the env, and the script's command that stages it
    there first. TMPDIR is pinned to this one's for that command, so the path holds where the job's own TMPDIR
    differs (the ranks keep the job's)."""
    image.usable(record)
    base = image.node_base(env)
    argv = ["env", f"TMPDIR={base.parent}", sys.executable, "-m", "envbuilder", "stage", record.name]
    return Staged(record.name, image.unpacked_path(base, image.image_key(record)), 0, copied=False), argv


def staged_record(record: state.EnvRecord, staged: Staged) -> state.EnvRecord:
    """The record as the job's ranks see it: the env at its node-local copy (never saved)."""
    return image.mounted_record(record, image.InUse(record.name, staged.path, "staged", False))


def _copy(base: Path, key: str) -> Path:
    return base / f"{key}{image.SUFFIX}"


# ---------------------------------------------------------------------------------------------------------------
# The node side, one task per node


def _prepare(key: str) -> str:
    """Make this node's directory (sbcast writes only into one that exists); whether the copy is there."""
    base = image.node_dir(proc.scrubbed_env())
    return READY if (image.unpacked_path(base, key) / image.UNPACKED_MARK).is_file() else "empty"


def _unpack(key: str, digest: str) -> str:
    """Unpack the broadcast image (checked against its digest) and drop the copy: the unpacked files are what
    the ranks read."""
    base = image.node_dir(proc.scrubbed_env())
    copy = _copy(base, key)
    with fsutil.Mutex(base / f".{key}.lock", timeout=image.MOUNT_WAIT_S):
        image.unpack_once(copy, image.unpacked_path(base, key), digest)
    copy.unlink(missing_ok=True)
    return f"{socket.gethostname()} {image.unpacked_path(base, key)}"


def on_node(step: str, key: str, digest: str) -> str:
    """One node's part of a staging step (``prepare`` or ``unpack``): the line it reports."""
    return _prepare(key) if step == "prepare" else _unpack(key, digest)
