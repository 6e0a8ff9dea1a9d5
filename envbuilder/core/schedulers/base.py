"""What every scheduler adapter shares (pure): the :class:`Scheduler` each adapter module subclasses, and the types
they read and answer with: :class:`Where` a command runs, the :class:`HostList` of an allocation, the
:class:`JobShape` a job script asks for.

Each adapter owns a job script's directives and set-up lines, and the argv that submits a job, asks for its state
and exit code and cancels it, with parsers for what they print. It also owns what a job's environment means to it:
which variables say "inside a job" and which the host probe records, where the allocation's hosts are listed
(:meth:`Scheduler.hosts`, the first of which a multi-node run meets at), the argv that runs a command once on every
node and the broadcast that ``stage`` copies an image with. The adapters are one module each beside this one;
:mod:`.registry` holds them all.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import Optional

from envbuilder.core import values
from envbuilder.core.errors import UsageError
from envbuilder.core.launchers import PORT_BASE, PORT_SPAN, Arg, ShellVar, job_port
from envbuilder.core.structs import dataclass


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
    #: GPUs the scheduler gave the job on this node (0: a job on its node that was given none); None where it
    #: does not say (an allocation's shell on a login node, a site that hands out whole nodes).
    gpus: Optional[int] = None
    #: GPUs this process may use: CUDA_VISIBLE_DEVICES's count, where it is set.
    visible_gpus: Optional[int] = None
    #: The tasks the job was given, where the scheduler says.
    tasks: Optional[int] = None

    @property
    def in_job(self) -> bool:
        return self.job is not None


@dataclass(frozen=True)
class HostList:
    """Where a job's hosts are listed, first host first, whitespace apart: what ``argv`` prints, or the file at
    ``path``."""

    argv: tuple[str, ...] = ()
    path: Optional[str] = None


@dataclass(frozen=True)
class JobShape:
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: Optional[int]
    partition: Optional[str]
    time: str
    account: Optional[str]
    name: str

    def __post_init__(self) -> None:
        """Refuse what no directive or argument may carry: the account comes from --account (a usage error);
        the partition, walltime and job name were checked where they came from and are checked again here (the
        partition may come from the env's record or the job's environment, which no loader read)."""
        bad = values.ACCOUNT.problem(self.account) if self.account else None
        if bad is not None:
            raise UsageError(f"--account: {bad[0]}", hint=bad[1])
        if self.partition:
            values.require(values.PARTITION, self.partition, "partition")
        values.require(values.TIME, self.time, "scheduler.time")
        values.require(values.JOB_NAME, self.name, "job name")

    @property
    def walltime(self) -> str:
        """The walltime as HH:MM:SS, the form every scheduler and wrapper reads alike."""
        return values.walltime(self.time, "scheduler.time")


@dataclass(frozen=True)
class JobRecord:
    """What a scheduler's record of a finished (or running) job tells: where its output went, how it ended, where
    it ran, its script and the variables it was submitted with, where the record says them."""

    job: str
    #: The command that told it, in words ("sacct", "scontrol show job").
    source: str
    state: Optional[str] = None
    #: As the scheduler writes it (Slurm: ``0:9``, status and signal; PBS: ``137``).
    exit_code: Optional[str] = None
    nodes: Optional[str] = None
    #: The job's output files, stdout first (one where both went to one file).
    outputs: tuple[str, ...] = ()
    script: Optional[str] = None
    workdir: Optional[str] = None
    variables: Mapping[str, str] = field(default_factory=dict)


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

    def port_lines(self, port: Optional[int]) -> list[str]:
        """Script lines that export MASTER_PORT: the recipe's ``port``, else the job's own (from the digits its
        id starts with: PBS's is ``1234.server``), as :meth:`job_port` finds it for a run inside the job."""
        if port is not None:
            return [f"export MASTER_PORT={int(port)}"]
        return [
            f'job_number="${{{self.job_id_var}%%[!0-9]*}}"',
            f"export MASTER_PORT=$(( {PORT_BASE} + 10#${{job_number:-0}} % {PORT_SPAN} ))",
        ]

    def job_port(self, env: Mapping[str, str]) -> Optional[int]:
        """The rendezvous port of the job ``env`` runs in (None outside one of this scheduler's jobs)."""
        number = re.match(r"[0-9]+", env.get(self.job_id_var, ""))
        return job_port(int(number.group())) if number else None

    def bound_values(self, env: Mapping[str, str]) -> dict[str, str]:
        """The values of this scheduler's shell variables in a launch (the rendezvous id) for a run here."""
        if isinstance(self.rdzv_id, ShellVar):
            return {self.rdzv_id.var: env.get(self.rdzv_id.var, "envbuilder")}
        return {}

    # -- the allocation a launch needs, as the lines a user types (``envbuilder alloc``) -------------------------
    # Each is an argv: every value in it is one word, checked by JobShape (no value starts with '-' or holds
    # whitespace), so none becomes an option. ``required`` (scheduler.required_flags, one directive each) is split
    # at whitespace as the scheduler splits a directive line.

    def node_options(self, job: JobShape, gpu_request: str = "none") -> list[str]:
        """The options that ask for ``job``'s nodes and tasks on them (and, where the scheduler asks for a node's
        resources in one option, its CPUs and GPUs, in the site's ``gpu_request`` style)."""
        return []

    def cpu_options(self, job: JobShape) -> list[str]:
        """The options that ask for ``job``'s CPUs (none where it asks for whole nodes)."""
        return []

    def gpu_options(self, job: JobShape, gpu_request: str) -> list[str]:
        """The options that ask for ``job``'s GPUs in the site's ``gpu_request`` style (none for "none")."""
        return []

    def place_options(self, job: JobShape) -> list[str]:
        """The options that name ``job``'s partition, account and walltime."""
        return []

    def resources(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> list[str]:
        """Every option an allocating command needs for ``job``, then the site's required directives."""
        words = [w for directive in required for w in directive.split()]
        return [
            *self.node_options(job, gpu_request),
            *self.cpu_options(job),
            *self.gpu_options(job, gpu_request),
            *self.place_options(job),
            *words,
        ]

    def allocate(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> Optional[list[str]]:
        """argv of an interactive allocation of ``job``'s resources (a shell inside it); None where the
        scheduler has none envbuilder knows."""
        return None

    def shell(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> Optional[list[str]]:
        """argv of an interactive shell on the allocation's first node, where it differs from :meth:`allocate`'s
        (Slurm's ``srun --pty``); None otherwise."""
        return None

    def batch(
        self, job: JobShape, gpu_request: str, required: Sequence[str], script: str
    ) -> Optional[list[str]]:
        """argv that submits ``script`` with ``job``'s resources on the command line; None where it has none."""
        return None

    def time_left_query(self, job: str) -> Optional[list[str]]:
        """argv that asks how long the job has left (:meth:`time_left` reads it); None where there is no cheap
        way to ask."""
        return None

    def time_left(self, stdout: str) -> Optional[int]:
        """The seconds :meth:`time_left_query` said the job has left; None for no limit or no answer."""
        return None

    @abstractmethod
    def directives(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> list[str]:
        """The directives for ``job`` (without the prefix), asking for GPUs in the site's ``gpu_request`` style,
        then the site's ``required`` flags."""

    @abstractmethod
    def submit(self, script: str, output: str) -> list[str]:
        """argv that submits ``script`` with its output going to ``output``."""

    #: The pattern the submit command's output option expands to the job id (Slurm's ``%j``); "" where it has
    #: none (the output's name is then made before the job has an id).
    output_job_id: str = ""

    def output_literal(self, path: str) -> str:
        """``path`` as the output option reads it literally, its characters kept from the pattern expansion."""
        return path

    def output_problem(self, path: str) -> Optional[str]:
        """Why the output option cannot carry ``path`` (None where it can)."""
        return None

    def output_of(self, output: str, job: str) -> str:
        """The file the job's output went to: ``output`` as the submit command got it, expanded for ``job``."""
        return output

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

    def never_starts(self, stdout: str) -> Optional[str]:
        """Why a queued job will not start until someone changes it or the site (the state query's answer, read
        again), in words; None where it may still start or the scheduler does not say."""
        return None

    def exit_code(self, stdout: str) -> Optional[int]:
        """The exit code in what :meth:`exit_query` printed."""
        return None

    @abstractmethod
    def cancel(self, job: str) -> list[str]:
        """argv that cancels the job."""

    def record_queries(self, job: str) -> list[list[str]]:
        """argv that tell a job's record (:class:`JobRecord`), the first that answers wins; [] where none."""
        return []

    def job_record(self, job: str, argv: Sequence[str], stdout: str) -> Optional[JobRecord]:
        """The record in what ``argv`` (one of :meth:`record_queries`) printed; None where it holds none."""
        return None

    def ending(self, record: JobRecord) -> Optional[str]:
        """How the job ended, in words, where its state or exit code says more than "it failed" (a signal, a
        memory or time limit); None otherwise."""
        return None


#: What a signal that ends a job usually means.
SIGNALS = {
    9: "SIGKILL: the out-of-memory killer, a limit the scheduler enforces, or a kill by hand",
    15: "SIGTERM: the scheduler ending the job (time limit, cancel, preemption) or a kill by hand",
    6: "SIGABRT: the program aborted itself (an uncaught C++ exception, an assertion, NCCL's abort)",
    11: "SIGSEGV: a segmentation fault (a library built for another CPU, CUDA or ABI; a real bug)",
}


def signal_words(number: int) -> str:
    return f"signal {number} ({SIGNALS[number]})" if number in SIGNALS else f"signal {number}"


def count(text: Optional[str]) -> Optional[int]:
    """The positive whole number a scheduler variable holds (``" 4 "``); None for none, zero or anything else."""
    match = re.fullmatch(r"\s*(\d+)\s*", text or "")
    return int(match.group(1)) or None if match else None
