"""Pure scheduler adapters, one :data:`SCHEDULERS` entry each: a job script's directives and set-up lines, and
the argv that submits a job, asks for its state and exit code and cancels it, with parsers for what they print.
Each adapter also owns what a job's environment means to it: which variables say "inside a job" and which the host
probe records (:func:`allocation_vars`), where the allocation's hosts are listed (:meth:`Scheduler.hosts`, the first
of which a multi-node run meets at), the argv that runs a command once on every node and the broadcast that
``stage`` copies an image with.

``runner`` and ``staging`` run these commands through ``proc``; ``batch`` writes the script around the directives.
The recipe schema and the host probe read the names (and how to recognise each scheduler) from the registry. No
other module names a scheduler or its variables (tests/unit/test_scheduler_seam.py checks): a third scheduler is
one subclass of :class:`Scheduler` in :data:`SCHEDULERS`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Optional

from envbuilder.core.launchers import Arg, LaunchSpec, ShellVar, build, plain
from envbuilder.core.structs import dataclass

if TYPE_CHECKING:  # only a type here: batch builds the job shape (and imports this module)
    from envbuilder.plan.batch import JobShape


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


@dataclass(frozen=True)
class HostList:
    """Where a job's hosts are listed, first host first, whitespace apart: what ``argv`` prints, or the file at
    ``path``."""

    argv: tuple[str, ...] = ()
    path: Optional[str] = None


class Scheduler(ABC):
    """One batch system: each subclass fills the attributes and builds its own argv."""

    name: str
    #: The name people know it by, for messages.
    title: str
    #: The variables of a job's environment that the host probe records.
    allocation_vars: tuple[str, ...] = ()
    #: The variable that lists (or names the list of) the allocation's hosts.
    hosts_var: str
    #: Whether it copies one file to every node itself (:meth:`broadcast`); else ``stage`` has each node fetch
    #: the image from the shared file system.
    broadcasts: bool = False
    #: Options of an interactive step that give it CPUs, where a step without one gets a single CPU.
    step_cpu_options: tuple[str, ...] = ()
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
    def hosts(self, env: Mapping[str, str]) -> Optional[HostList]:
        """Where ``env``'s allocation lists its hosts; None outside one."""

    @abstractmethod
    def on_each_node(self, here: Where, command: Sequence[str]) -> list[str]:
        """argv that runs ``command`` (a python and its arguments, each passed as one) once on every node of the
        allocation ``here``."""

    def broadcast(self, source: str, dest: str) -> list[str]:
        """argv that copies ``source`` to ``dest`` on every node of the allocation (where :attr:`broadcasts`)."""
        raise NotImplementedError(f"{self.title} has no broadcast")

    def unstageable(self, here: Where) -> Optional[tuple[str, str]]:
        """Why ``stage`` cannot reach the nodes of ``here``, and the hint; None where it can."""
        return None

    def bound_values(self, env: Mapping[str, str]) -> dict[str, str]:
        """The values of this scheduler's shell variables in a launch (the rendezvous id) for a run here."""
        if isinstance(self.rdzv_id, ShellVar):
            return {self.rdzv_id.var: env.get(self.rdzv_id.var, "envbuilder")}
        return {}

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
    title = "Slurm"
    allocation_vars = (
        "SLURM_JOB_ID",
        "SLURM_JOB_NODELIST",
        "SLURM_JOB_NUM_NODES",
        "SLURM_NNODES",
        "SLURM_JOB_PARTITION",
        "SLURM_GPUS_ON_NODE",
        "SLURM_NTASKS",
    )
    hosts_var = "SLURM_JOB_NODELIST"
    broadcasts = True
    #: A step (``srun --pty``) gets one CPU unless one of these asks for more.
    step_cpu_options = ("--cpus-per-task", "--cpus-per-gpu", "--exclusive", "--mincpus")
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

    def hosts(self, env: Mapping[str, str]) -> Optional[HostList]:
        nodelist = env.get(self.hosts_var)
        return HostList(argv=("scontrol", "show", "hostnames", nodelist)) if nodelist else None

    def on_each_node(self, here: Where, command: Sequence[str]) -> list[str]:
        # One task on every node, a step of the allocation (sharing resources when this already runs in a step).
        nodes = here.nodes or 1
        argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
        return [*argv, "--overlap", *command] if here.in_step else [*argv, *command]

    def broadcast(self, source: str, dest: str) -> list[str]:
        # sbcast: one read of the shared file system, fanned out by Slurm.
        return ["sbcast", "--force", source, dest]

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
    title = "PBS"
    allocation_vars = ("PBS_JOBID", "PBS_NODEFILE", "PBS_QUEUE")
    hosts_var = "PBS_NODEFILE"
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

    def hosts(self, env: Mapping[str, str]) -> Optional[HostList]:
        # One line per rank slot; the node count is the count of distinct lines (locate).
        path = env.get(self.hosts_var)
        return HostList(path=path) if path else None

    def on_each_node(self, here: Where, command: Sequence[str]) -> list[str]:
        # No step of its own: the job's remote start, the site's node launcher (one task per node).
        spec = LaunchSpec(python=command[0], script=tuple(command), nodes=here.nodes or 1, direct=True)
        return plain(build(self.node_launcher, spec))

    def unstageable(self, here: Where) -> Optional[tuple[str, str]]:
        if here.nodes:
            return None
        return (
            "envbuilder stage in a PBS job copies the image to the hosts of $PBS_NODEFILE, which is unset or "
            "unreadable here",
            "run it in the job's own shell or script, where PBS sets PBS_NODEFILE",
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
    ``nodefile``: the text of the job's host list file (:meth:`Scheduler.hosts`, one line per rank slot), where
    the scheduler gives the node count only that way. ``usable_cpus``: the CPUs this process may run on; on a job's node
    (a step, a batch script) no launch from here can have more, whatever the job holds (a cgroup or a CPU
    binding confines the step: an interactive step that asked for none has one)."""
    adapter = detect(env)
    if adapter is None:
        return Where()
    where = adapter.where(env)
    if where.nodes is None and nodefile is not None:
        where = replace(where, nodes=len({h.strip() for h in nodefile.splitlines() if h.strip()}) or None)
    if usable_cpus and where.cpus_per_node and adapter.on_node(env):
        where = replace(where, cpus_per_node=min(where.cpus_per_node, usable_cpus))
    return where


def detect(env: Mapping[str, str]) -> Optional[Scheduler]:
    """The scheduler whose job ``env``'s process runs in; None outside any."""
    return next((a for a in SCHEDULERS.values() if env.get(a.job_id_var)), None)


def allocation_vars() -> tuple[str, ...]:
    """Every scheduler's variables that the host probe records."""
    return tuple(var for adapter in SCHEDULERS.values() for var in adapter.allocation_vars)


def host_list(env: Mapping[str, str]) -> Optional[HostList]:
    """Where ``env``'s allocation lists its hosts (the first scheduler's that tells); None outside any."""
    return next((h for h in (a.hosts(env) for a in SCHEDULERS.values()) if h is not None), None)


def hosts_vars() -> str:
    """The variables that list an allocation's hosts, for a message: ``A or B``."""
    return " or ".join(adapter.hosts_var for adapter in SCHEDULERS.values())


def bound_values(env: Mapping[str, str]) -> dict[str, str]:
    """The values a launch's shell variables take for a run here (:func:`launchers.bind`)."""
    values: dict[str, str] = {}
    for adapter in SCHEDULERS.values():
        values.update(adapter.bound_values(env))
    return values


def _int(text: Optional[str]) -> Optional[int]:
    match = re.fullmatch(r"\s*(\d+)\s*", text or "")
    return int(match.group(1)) or None if match else None


def get(name: Optional[str]) -> Optional[Scheduler]:
    """The adapter for a recipe's ``scheduler.type``; None for "none" (or no scheduler)."""
    return SCHEDULERS.get(name or "")
