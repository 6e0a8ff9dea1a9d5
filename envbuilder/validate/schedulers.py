"""Pure scheduler adapters, one :data:`SCHEDULERS` entry each: a job script's directives and set-up lines, and
the argv that submits a job, asks for its state and exit code and cancels it, with parsers for what they print.

``runner`` runs these commands through ``proc``; ``batch`` writes the script around the directives. The recipe
schema and the host probe read the names (and how to recognise each scheduler) from the registry.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Optional

from envbuilder.structs import dataclass
from envbuilder.validate.launchers import Arg, ShellVar

if TYPE_CHECKING:  # only a type here: batch builds the job shape (and imports this module)
    from envbuilder.validate.batch import JobShape


@dataclass(frozen=True)
class Where:
    """Where a command runs, as the scheduler's variables tell: a login node (``job`` None), a job's allocation
    (an ``salloc`` shell, a batch script, a PBS job) or one of the job's steps (an ``srun --pty`` shell), whose
    resources a second step can only share (``srun --overlap``)."""

    scheduler: Optional[str] = None
    job: Optional[str] = None
    in_step: bool = False
    #: Nodes of the allocation, where the scheduler says.
    nodes: Optional[int] = None
    #: CPUs the job holds on this node (or on each node), where the scheduler says.
    cpus_per_node: Optional[int] = None
    partition: Optional[str] = None

    @property
    def in_job(self) -> bool:
        return self.job is not None


class Scheduler(ABC):
    """One batch system: each subclass fills the attributes and builds its own argv."""

    name: str
    #: The directive prefix of a job script (``#SBATCH``).
    directive: str
    #: The submit command; where it is on PATH, this host submits to this scheduler.
    submit_tool: str
    #: Set inside a job of this scheduler: this host is in an allocation.
    job_id_var: str
    #: The partition (queue) a job runs in, as the job's environment tells.
    partition_var: str
    #: The launcher that starts one torchrun agent per node here (torchrun alone reaches one node).
    node_launcher: str
    #: The torchrun rendezvous id of a job.
    rdzv_id: Arg = "envbuilder"
    #: Script lines right after ``set -euo pipefail``.
    setup: tuple[str, ...] = ()
    #: The script line that sets MASTER_ADDR to the allocation's first host.
    first_host: str

    #: The script expression for the CPUs the job holds on this node.
    cpus_var: str
    #: One-letter options and the long option each is (forbidden_flags = ["--error"] also forbids -e).
    short_options: Mapping[str, str] = MappingProxyType({})

    @abstractmethod
    def where(self, env: Mapping[str, str]) -> Where:
        """Where ``env`` (which holds ``job_id_var``) runs inside this scheduler's job."""

    def on_node(self, env: Mapping[str, str]) -> bool:
        """Whether ``env``'s process runs on a node of its job (not in a shell the job's allocation left on a
        login node)."""
        return True

    @abstractmethod
    def directives(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> list[str]:
        """The directives for ``job`` (without the prefix), asking for GPUs in the site's ``gpu_request`` style,
        then the site's ``required`` flags."""

    @abstractmethod
    def submit(self, script: str, output: str) -> list[str]:
        """argv that submits ``script`` with its output going to ``output``."""

    def job_id(self, stdout: str) -> str:
        """The job id the submit command printed."""
        return stdout.strip().split(";", 1)[0]

    @abstractmethod
    def state_query(self, job: str) -> list[str]:
        """argv that asks for the job's state (:meth:`state` reads the answer)."""

    @abstractmethod
    def state(self, returncode: int, stdout: str) -> Optional[str]:
        """The job's state while it is queued or running; None once it has left the queue."""

    def exit_query(self, job: str) -> Optional[list[str]]:
        """argv that tells a finished job's exit code; None where the scheduler keeps no such record."""
        return None

    def exit_code(self, stdout: str) -> Optional[int]:
        """The exit code in what :meth:`exit_query` printed."""
        return None

    @abstractmethod
    def cancel(self, job: str) -> list[str]:
        """argv that cancels the job."""


class Slurm(Scheduler):
    name = "slurm"
    directive = "#SBATCH"
    submit_tool = "sbatch"
    job_id_var = "SLURM_JOB_ID"
    partition_var = "SLURM_JOB_PARTITION"
    node_launcher = "srun"
    rdzv_id = ShellVar("SLURM_JOB_ID")
    first_host = 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
    cpus_var = "SLURM_CPUS_ON_NODE"
    #: Those sbatch, salloc and srun agree on.
    short_options = MappingProxyType(
        {
            "-A": "--account",
            "-C": "--constraint",
            "-c": "--cpus-per-task",
            "-D": "--chdir",
            "-d": "--dependency",
            "-e": "--error",
            "-G": "--gpus",
            "-i": "--input",
            "-J": "--job-name",
            "-L": "--licenses",
            "-M": "--clusters",
            "-m": "--distribution",
            "-N": "--nodes",
            "-n": "--ntasks",
            "-o": "--output",
            "-p": "--partition",
            "-q": "--qos",
            "-t": "--time",
            "-w": "--nodelist",
            "-x": "--exclude",
        }
    )

    def where(self, env: Mapping[str, str]) -> Where:
        # A batch script and a step know their node's CPUs; an salloc shell (on the login node) only the
        # allocation's list, "32(x2),16" style.
        cpus = _int(env.get("SLURM_CPUS_ON_NODE")) or _int(
            env.get("SLURM_JOB_CPUS_PER_NODE", "").split("(")[0]
        )
        return Where(
            scheduler=self.name,
            job=env[self.job_id_var],
            in_step="SLURM_STEP_ID" in env,
            nodes=_int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")),
            cpus_per_node=cpus,
            partition=env.get(self.partition_var) or None,
        )

    def on_node(self, env: Mapping[str, str]) -> bool:
        # Slurm sets it in a batch script and a step, on the node; an salloc shell lacks it.
        return "SLURM_CPUS_ON_NODE" in env

    def directives(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> list[str]:
        flags = [
            f"--job-name={job.name}",
            f"--nodes={job.nodes}",
            f"--ntasks={job.nodes * job.tasks_per_node}",
            f"--ntasks-per-node={job.tasks_per_node}",
            f"--time={job.walltime}",
        ]
        if job.partition:
            flags.append(f"--partition={job.partition}")
        if job.account:
            flags.append(f"--account={job.account}")
        if job.cpus_per_task:
            flags.append(f"--cpus-per-task={job.cpus_per_task}")
        if job.gpus_per_node:
            flags += _gpu_flags(job, gpu_request)
        return flags + list(required)

    def submit(self, script: str, output: str) -> list[str]:
        return ["sbatch", "--parsable", f"--output={output}", script]

    def state_query(self, job: str) -> list[str]:
        return ["squeue", "-h", "-j", job, "-o", "%T"]

    def state(self, returncode: int, stdout: str) -> Optional[str]:
        text = stdout.strip()
        return (text or None) if returncode == 0 else None

    def exit_query(self, job: str) -> Optional[list[str]]:
        return ["scontrol", "show", "job", job]

    def exit_code(self, stdout: str) -> Optional[int]:
        for word in stdout.split():
            if word.startswith("ExitCode="):
                return int(word.split("=", 1)[1].split(":", 1)[0])
        return None

    def cancel(self, job: str) -> list[str]:
        return ["scancel", job]


def _gpu_flags(job: JobShape, gpu_request: str) -> list[str]:
    """How a Slurm job asks for its GPUs, in the site's dialect (``none``: it does not)."""
    if gpu_request == "gpus-per-node":
        return [f"--gpus-per-node={job.gpus_per_node}"]
    if gpu_request == "gres":
        return [f"--gres=gpu:{job.gpus_per_node}"]
    if gpu_request == "gpus":
        return [f"--gpus={job.gpus_per_node * job.nodes}"]
    return []


class Pbs(Scheduler):
    name = "pbs"
    directive = "#PBS"
    submit_tool = "qsub"
    job_id_var = "PBS_JOBID"
    partition_var = "PBS_QUEUE"
    node_launcher = "mpiexec"
    setup = ('cd "${PBS_O_WORKDIR:-$PWD}"',)
    first_host = 'MASTER_ADDR=$(head -n 1 "$PBS_NODEFILE")'
    cpus_var = "NCPUS"

    def where(self, env: Mapping[str, str]) -> Where:
        # PBS tells the node count only through $PBS_NODEFILE (locate counts it; the runner reads the file).
        # NCPUS is the first chunk's.
        return Where(
            scheduler=self.name,
            job=env[self.job_id_var],
            cpus_per_node=_int(env.get("NCPUS")),
            partition=env.get(self.partition_var) or None,
        )

    def directives(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> list[str]:
        flags = [f"-N {job.name}", f"-l select={job.nodes}", f"-l walltime={job.walltime}"]
        if job.partition:
            flags.append(f"-q {job.partition}")
        if job.account:
            flags.append(f"-A {job.account}")
        return flags + list(required)

    def submit(self, script: str, output: str) -> list[str]:
        return ["qsub", "-o", output, "-j", "oe", script]

    def state_query(self, job: str) -> list[str]:
        return ["qstat", job]

    def state(self, returncode: int, stdout: str) -> Optional[str]:
        if returncode != 0:
            return None
        lines = stdout.strip().splitlines()
        return lines[-1].split()[4] if lines and len(lines[-1].split()) > 4 else "Q"

    def cancel(self, job: str) -> list[str]:
        return ["qdel", job]


#: Every scheduler a recipe can name (besides "none"), in the order the probe tries them.
SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (Slurm(), Pbs())}


def locate(
    env: Mapping[str, str], nodefile: Optional[str] = None, usable_cpus: Optional[int] = None
) -> Where:
    """Where ``env``'s process runs: inside a job of one of :data:`SCHEDULERS`, else on a login node.
    ``nodefile``: the text of the job's host list ($PBS_NODEFILE, one line per rank slot), where the scheduler
    gives the node count only that way. ``usable_cpus``: the CPUs this process may run on; on a job's node
    (a step, a batch script) no launch from here can have more, whatever the job holds (a cgroup or a CPU
    binding confines the step: an interactive step that asked for none has one)."""
    for adapter in SCHEDULERS.values():
        if env.get(adapter.job_id_var):
            where = adapter.where(env)
            if where.nodes is None and nodefile is not None:
                where = replace(
                    where, nodes=len({h.strip() for h in nodefile.splitlines() if h.strip()}) or None
                )
            if usable_cpus and where.cpus_per_node and adapter.on_node(env):
                where = replace(where, cpus_per_node=min(where.cpus_per_node, usable_cpus))
            return where
    return Where()


def _int(text: Optional[str]) -> Optional[int]:
    match = re.fullmatch(r"\s*(\d+)\s*", text or "")
    return int(match.group(1)) or None if match else None


def get(name: Optional[str]) -> Optional[Scheduler]:
    """The adapter for a recipe's ``scheduler.type``; None for "none" (or no scheduler)."""
    return SCHEDULERS.get(name or "")
