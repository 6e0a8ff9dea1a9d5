"""Pure argv builders for the validation launch: local, torchrun, srun, ibrun, mpiexec (PALS), mpirun, one
:data:`LAUNCHERS` entry each (the recipe schema and the CLI read their names from it).

Two shapes of program exist:
* ``agent``: the program is torchrun, which spawns one worker per GPU itself. Wrapped by srun it must run
  exactly once per node (``--ntasks-per-node=1``): the Zurada seed's ``--ntasks-per-node=2`` around torchrun
  launches two independent jobs on the same GPUs, and this module makes that impossible.
* ``ranks``: the launcher starts every rank (MPI style); the program reads its rank from the launcher's env.

Values that only a batch script can know (the first host of the allocation) are :class:`ShellVar` elements:
they show as ``$NAME`` in a plan and render as ``"$NAME"`` in a script, while every other element is quoted.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from typing import Optional, Union

from envbuilder.core import values
from envbuilder.core.errors import UsageError
from envbuilder.core.structs import dataclass


class ShellVar(str):
    """An argv element that a batch script expands (``$NAME``); never a recipe value."""

    __slots__ = ()

    def __new__(cls, name: str) -> ShellVar:
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a variable name: {name!r}")
        return super().__new__(cls, "$" + name)

    @property
    def var(self) -> str:
        return self[1:]


Arg = Union[str, ShellVar]


@dataclass(frozen=True)
class LaunchSpec:
    python: str  # the env's interpreter
    script: tuple[str, ...]  # payload path and its arguments
    nodes: int = 1
    nproc_per_node: int = 1
    #: How to call torchrun with the env's python (``python -m torch.distributed.run``).
    torchrun: tuple[str, ...] = ()
    #: The rendezvous port of a multi-node run; None: ``$MASTER_PORT``, which the job script (or the runner inside an
    #: allocation) derives from the job's number, so two jobs whose first node is the same meet at different ports.
    port: Optional[int] = None
    rdzv_id: Arg = "envbuilder"
    mpi: Optional[str] = None  # srun --mpi plugin
    cpu_bind: Optional[str] = None
    depth: Optional[int] = None
    #: argv prefix that maps local rank -> CUDA_VISIBLE_DEVICES before the program starts (Polaris)
    affinity_wrapper: tuple[str, ...] = ()
    #: CPUs for each srun task: a step gets one CPU per task unless told (and since Slurm 22.05 it no longer
    #: inherits the job's --cpus-per-task), so a torchrun agent would pin every worker to one core.
    cpus_per_task: Optional[Arg] = None
    #: Started inside a step (an ``srun --pty`` shell): share its resources instead of waiting for them forever.
    overlap: bool = False
    #: ``script`` is an executable, not a python script: MPI launchers start it without the env's python.
    direct: bool = False
    #: The container runtime's argv that runs what follows inside the env's image (a container env), between
    #: the launcher (and the GPU-affinity wrapper) and the program; () for an env on the host.
    wrap: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """The recipe's launcher settings, each one option's value, checked again (the loader refused them)."""
        if self.mpi is not None:
            values.require(values.MPI_PLUGIN, self.mpi, "launcher.mpi")
        if self.cpu_bind is not None:
            values.require(values.CPU_BIND, self.cpu_bind, "launcher.cpu_bind")

    @property
    def world(self) -> int:
        """Ranks in all."""
        return self.nodes * self.nproc_per_node

    @property
    def program(self) -> tuple[str, ...]:
        """argv of one rank started directly (MPI launchers, local)."""
        return (*self.wrap, *(self.script if self.direct else (self.python, *self.script)))


MASTER_ADDR = ShellVar("MASTER_ADDR")
MASTER_PORT = ShellVar("MASTER_PORT")
#: A job's own rendezvous port: PORT_BASE + (its number modulo PORT_SPAN), below Linux's ephemeral range.
PORT_BASE = 15000
PORT_SPAN = 15000


def job_port(number: int) -> int:
    """The rendezvous port of job ``number`` (jobs a node runs at once have different numbers, hence ports)."""
    return PORT_BASE + number % PORT_SPAN


#: The address a one-node torchrun gives its workers for its store (torch >= 2.0 has --local-addr).
LOOPBACK = "--local-addr=127.0.0.1"


def torchrun_argv(spec: LaunchSpec, master: Arg = MASTER_ADDR) -> list[Arg]:
    """torchrun for one node agent: standalone on one node, c10d rendezvous at the first host otherwise."""
    if not spec.torchrun:
        raise UsageError("the torchrun launcher needs the env's python")
    argv: list[Arg] = list(spec.torchrun)
    if spec.nodes == 1:
        # The store's address is loopback, not the host name torchrun would publish: on a node whose own name
        # does not resolve (no DNS, not in /etc/hosts) the workers retried that name until killed.
        argv += ["--standalone", LOOPBACK, "--nnodes=1", f"--nproc-per-node={spec.nproc_per_node}"]
    else:
        # One shared endpoint for every node: the allocation's first host, the job's port. Never localhost.
        argv += [
            f"--nnodes={spec.nodes}",
            f"--nproc-per-node={spec.nproc_per_node}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint",
            _join_host_port(master, spec.port),
            "--rdzv-id",
            spec.rdzv_id,
        ]
    # torchrun runs the script with its own interpreter (the env's python), so it gets the script, not python.
    return argv + list(spec.script)


def _join_host_port(host: Arg, port: Optional[int]) -> Arg:
    tail: Arg = MASTER_PORT if port is None else str(port)
    if isinstance(host, ShellVar) or isinstance(tail, ShellVar):
        return _Joined(host, ":", tail)
    return f"{host}:{tail}"


class _Joined(str):
    """Shell variables and literal text as one argument (``$MASTER_ADDR:$MASTER_PORT``)."""

    parts: tuple[Arg, ...]

    def __new__(cls, *parts: Arg) -> _Joined:
        obj = super().__new__(cls, "".join(parts))
        obj.parts = parts
        return obj


def _local(spec: LaunchSpec) -> list[Arg]:
    if spec.world != 1:
        raise UsageError(f"the local launcher runs one process; {spec.world} were asked for")
    return list(spec.program)


def _torchrun(spec: LaunchSpec) -> list[Arg]:
    if spec.nodes != 1:
        raise UsageError(
            "torchrun alone reaches one node; use srun (Slurm) or mpiexec to start one agent per node"
        )
    return torchrun_argv(spec)


def _srun(spec: LaunchSpec) -> list[Arg]:
    # Agent mode: exactly one torchrun per node.
    argv: list[Arg] = ["srun", f"--nodes={spec.nodes}", "--ntasks-per-node=1", f"--ntasks={spec.nodes}"]
    if spec.cpus_per_task is not None:
        argv += ["--cpus-per-task", spec.cpus_per_task]
    if spec.overlap:
        argv.append("--overlap")
    if spec.mpi:
        argv.append(f"--mpi={spec.mpi}")
    return argv + torchrun_argv(spec)


def _ibrun(spec: LaunchSpec) -> list[Arg]:
    # TACC's MPI launcher: one rank per GPU; the payload reads its rank from the MPI environment.
    return ["ibrun", "-n", str(spec.world), *spec.affinity_wrapper, *spec.program]


def _mpiexec(spec: LaunchSpec) -> list[Arg]:
    argv: list[Arg] = [
        "mpiexec",
        "-n",
        str(spec.world),
        "--ppn",
        str(spec.nproc_per_node),
    ]
    if spec.depth:
        argv += ["--depth", str(spec.depth)]
    if spec.cpu_bind:
        argv += ["--cpu-bind", spec.cpu_bind]
    return [*argv, *spec.affinity_wrapper, *spec.program]


def _mpirun(spec: LaunchSpec) -> list[Arg]:
    # Open MPI binds each rank to one core when there are two ranks or fewer: a rank then ran its node's share
    # of OMP threads on one core (the affinity check warned on the GPU node). Unbound, the kernel places them.
    return [
        "mpirun",
        "-n",
        str(spec.world),
        "--map-by",
        f"ppr:{spec.nproc_per_node}:node",
        "--bind-to",
        "none",
        *spec.affinity_wrapper,
        *spec.program,
    ]


@dataclass(frozen=True)
class Launcher:
    """One way to start the validation: its argv builder and what the rest of a run must know about it."""

    name: str
    argv: Callable[[LaunchSpec], list[Arg]]
    #: Runs torchrun agents (the program reads torchrun's env), not MPI-started ranks.
    agent: bool = False
    #: The scheduler it exists under only (srun and ibrun are Slurm's).
    scheduler: Optional[str] = None
    #: Reaches one node only: a multi-node run goes through the scheduler's node launcher instead.
    one_node: bool = False
    #: Starts one process, whatever the node's GPUs.
    one_process: bool = False


#: Every launcher, in the order the CLI and the recipe schema list them.
LAUNCHERS = {
    entry.name: entry
    for entry in (
        Launcher("local", _local, one_process=True),
        Launcher("torchrun", _torchrun, agent=True, one_node=True),
        Launcher("srun", _srun, agent=True, scheduler="slurm"),
        Launcher("ibrun", _ibrun, scheduler="slurm"),
        Launcher("mpiexec", _mpiexec),
        Launcher("mpirun", _mpirun),
    )
}


def get(name: str) -> Launcher:
    """The launcher called ``name``; UsageError naming the known ones otherwise."""
    if name not in LAUNCHERS:
        raise UsageError(f"unknown launcher {name!r}; known: {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name]


def build(name: str, spec: LaunchSpec) -> list[Arg]:
    """The validation launch argv for launcher ``name``."""
    return get(name).argv(spec)


def own_options(argv: Sequence[Arg], spec: LaunchSpec) -> list[str]:
    """The launcher's own arguments in ``argv`` (srun's, mpiexec's): those before the program, torchrun or the
    GPU-affinity wrapper starts; none where ``argv`` starts with one of them (local, torchrun)."""
    starts = {spec.python, *spec.torchrun[:1], *spec.affinity_wrapper[:1], *spec.program[:1]}
    own: list[str] = []
    for arg in argv:
        if arg in starts:
            break
        own.append(str(arg))
    return own[1:]


def render(argv: Sequence[Arg]) -> str:
    """Shell text for a batch script: every element quoted, shell variables expanded inside double quotes."""
    parts = []
    for arg in argv:
        pieces = arg.parts if isinstance(arg, _Joined) else (arg,)
        parts.append(
            "".join(f'"${{{p.var}}}"' if isinstance(p, ShellVar) else shlex.quote(p) for p in pieces)
        )
    return " ".join(parts)


def display(argv: Sequence[str]) -> str:
    """A plan's argv as text a user can paste: quoted, with the $NAMEs of an argument that starts with one kept
    expandable (``$MASTER_ADDR:$MASTER_PORT``)."""
    return " ".join(_display_one(arg) for arg in argv)


def _display_one(arg: str) -> str:
    if not re.match(r"\$[A-Za-z_]", arg):
        return shlex.quote(arg)
    pieces = re.split(r"\$([A-Za-z_][A-Za-z0-9_]*)", arg)  # text, name, text, name, ..., text
    return "".join(
        (f'"${{{piece}}}"' if i % 2 else shlex.quote(piece))
        for i, piece in enumerate(pieces)
        if i % 2 or piece
    )


def bind(argv: Sequence[Arg], values: dict[str, str]) -> list[str]:
    """argv for running now: each shell variable replaced by its value (the allocation's, known here)."""
    out = []
    for arg in argv:
        if isinstance(arg, _Joined):
            out.append("".join(_value(p.var, values) if isinstance(p, ShellVar) else p for p in arg.parts))
        elif isinstance(arg, ShellVar):
            out.append(_value(arg.var, values))
        else:
            out.append(str(arg))
    return out


def _value(name: str, values: dict[str, str]) -> str:
    if name not in values:
        raise UsageError(f"the launch needs ${name}, which only a batch job sets", hint="pass --submit")
    return values[name]


def plain(argv: Sequence[Arg]) -> list[str]:
    """argv as plain strings (for JSON): shell variables show as $NAME."""
    return [str(a) for a in argv]
