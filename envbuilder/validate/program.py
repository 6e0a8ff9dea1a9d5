"""The user's own program under the launch rules a validation proved: ``envbuilder run`` starts it here (inside a
job, inside one of its steps, or on a node of its own), ``envbuilder sbatch`` submits it as a job of the site's
scheduler (a PBS job on PBS sites).

The launch is the validation's (:func:`suite.launch_program`): one torchrun agent per node or the site's MPI
launcher, the rendezvous on the allocation's first host, the recipe's GPU-to-rank wrapper, OMP threads = the
node's CPUs divided among its ranks, the recipe's modules and variables. Batch scripts name only paths inside
the env (its own copy of the wrapper), which compute nodes see.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Optional

from envbuilder import payloads
from envbuilder.core import kinds, schedulers, values
from envbuilder.core.errors import UsageError
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.plan import suite
from envbuilder.plan.activation import Activation, activation_for
from envbuilder.plan.container import box_python
from envbuilder.plan.target import target_facts
from envbuilder.recipe.loader import Recipe
from envbuilder.system import proc, state
from envbuilder.system.modules import ModuleSystem
from envbuilder.validate import runner


@dataclass(frozen=True)
class Request:
    """The program and the launch the command line asks for (None leaves it to the recipe)."""

    program: tuple[str, ...]
    nodes: Optional[int] = None
    #: Ranks per node: one per GPU (``--gpus-per-node``); the node's GPUs, or one on a CPU env, by default.
    ranks_per_node: Optional[int] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    launcher: Optional[str] = None


@dataclass(frozen=True)
class Prepared:
    launch: suite.Launch
    here: schedulers.Where
    warnings: tuple[str, ...]


def prepare(
    record: state.EnvRecord,
    recipe: Recipe,
    host: HostFacts,
    env: Mapping[str, str],
    request: Request,
    *,
    batch: bool,
    stage: Sequence[str] = (),
    module_init: Optional[str] = None,
) -> Prepared:
    """The launch of ``request.program`` for a run here, or (``batch``) for a job script, which runs ``stage``
    (the command that stages the env's image on the job's nodes) first where one is given and sources
    ``module_init``'s bash init where the job's shell has no ``module``."""
    if not request.program:
        raise UsageError("no program to run", hint="envbuilder run ENV -- PROGRAM [ARGS...]")
    if request.program[0].startswith("-"):
        # A launcher would read it as one of its own options.
        raise UsageError(
            f"the program cannot start with '-': {request.program[0]!r}",
            hint="name a script or an executable: envbuilder run ENV -- train.py --epochs 3",
        )
    warnings: list[str] = []
    here = runner.locate(env)
    if batch and here.in_job:
        raise UsageError(
            f"this runs inside {here.scheduler} job {here.job}: a job from here would queue a second allocation",
            hint=f"start the program in this job instead: envbuilder run {record.name} -- ...",
        )
    partition = request.partition or _recorded_partition(record)
    target = target_facts(recipe, host, warnings, [], partition=partition)
    device = suite.device_for(target, cpu=False)
    ranks = request.ranks_per_node or (None if device == "cuda" else 1)
    wanted = suite.LaunchRequest(
        request.launcher, request.nodes, ranks, request.account, partition, here=None if batch else here
    )
    if not batch:
        _refuse_elsewhere(record, device, host, in_job=bool(here and here.in_job))
    prefix = Path(record.prefix)
    own_python = kinds.kind_info(record.kind).own_python
    python = (
        str(prefix / "bin" / "python") if own_python else str(record.tools.get("python_path") or "python3")
    )
    wrap: tuple[str, ...] = ()
    if kinds.kind_info(record.kind).container:  # the program runs inside the image
        python = box_python((record.plan or {}).get("container") or {})
        wrap = runner.in_image(record, device == "cuda")
    elif not batch:
        runner.python_here(record, python, host)  # before what the job lacks: the env cannot start here
    shape = suite.shape_for(recipe, target, wanted, device, warnings)
    wrapper_dir = prefix / "envbuilder" / "payloads"
    affinity: tuple[str, ...] = ()
    if recipe.launcher.gpu_affinity != "none" and not shape.launcher.agent and shape.gpus:
        affinity = (str(wrapper_dir / "gpu_affinity.sh"), recipe.launcher.gpu_affinity)
    program = suite.Program(request.program, python=request.program[0].endswith(".py"))
    the_launch = suite.launch_program(
        recipe,
        shape,
        suite.LaunchedEnv(
            str(prefix),
            python,
            replace(Activation.of_record(record.plan) or activation_for(recipe), module_init=module_init),
            own_python,
            wrap,
            runner.container_mpi(record),
        ),
        program,
        warnings=warnings,
        affinity=affinity,
        workdir=str(Path.cwd()),
        stage=stage,
    )
    return Prepared(the_launch, here, tuple(warnings))


def _recorded_partition(record: state.EnvRecord) -> Optional[str]:
    value = record.plan.get("partition")
    return value if isinstance(value, str) else None


def _refuse_elsewhere(record: state.EnvRecord, device: str, host: HostFacts, *, in_job: bool) -> None:
    """A GPU env's program cannot run on a host without GPUs outside any job (a login node)."""
    if device == "cuda" and not host.gpus and not in_job:
        raise UsageError(
            f"this host ({host.hostname or 'here'}) has no GPU and is in no job; {record.name} is for GPUs",
            hint=f"submit it (envbuilder sbatch {record.name} -- ...) or run it inside an allocation",
        )


def install_wrappers(record: state.EnvRecord) -> None:
    """The env's own copy of the launch wrappers (the GPU-affinity script), refreshed before every launch; an
    image's read-only mount keeps the copy it was packed with."""
    prefix = Path(record.prefix)
    if os.access(prefix, os.W_OK):
        payloads.into_env(prefix)


def command_here(prepared: Prepared) -> list[str]:
    """The exact argv a run here starts (``--dry-run`` prints it)."""
    return runner.bind_here(prepared.launch, {**os.environ})[0]


def run_here(
    record: state.EnvRecord,
    recipe: Recipe,
    prepared: Prepared,
    env: Mapping[str, str],
    modules: ModuleSystem,
) -> int:
    """Start the program here with the activated env's variables; its exit status."""
    install_wrappers(record)
    activate = Activation.of_record(record.plan) or activation_for(recipe)
    run_env = runner.environment(record, recipe, activate, env, modules)
    run_env.setdefault("OMP_NUM_THREADS", str(runner.threads_here(prepared.launch, prepared.here)))
    argv, run_env = runner.bind_here(prepared.launch, run_env)
    try:
        return proc.passthrough(argv, env=run_env)
    except FileNotFoundError:
        raise UsageError(
            f"the launcher {argv[0]!r} is not on PATH here",
            hint="load the site's MPI module, or pick another --launcher",
        ) from None


@dataclass(frozen=True)
class Submitted:
    job: str
    script: str
    output: str


def job_script(record: state.EnvRecord, prepared: Prepared) -> tuple[schedulers.Scheduler, str]:
    """The scheduler a job goes to and its script: every check ``sbatch`` makes before it writes or submits
    anything (``sbatch --dry-run`` makes the same ones, so a dry run fails where the real one would)."""
    the_launch = prepared.launch
    adapter = schedulers.get(the_launch.scheduler)
    if adapter is None or not the_launch.script:
        raise UsageError(
            f"{record.recipe} names no scheduler, so there is nothing to submit to",
            hint=f"run it on a node: envbuilder run {record.name} -- ...",
        )
    return adapter, the_launch.script


def job_output(adapter: schedulers.Scheduler, name: str, given: Optional[str], cwd: Path, stamp: str) -> str:
    """The output path the submit command gets for env ``name``'s job: ``given`` (``--output``: a file, or a
    directory for the default name in it; the scheduler's patterns, Slurm's ``%j``, apply), else the default
    name in ``cwd``, where sbatch runs (Slurm's and qsub's convention): ``envbuilder-NAME-JOBID.out`` where the
    scheduler puts the job id in (Slurm), else ``envbuilder-NAME-STAMP.out``, ``stamp`` the job directory's."""
    default = f"envbuilder-{name}-{adapter.output_job_id or stamp}.out"
    here = adapter.output_literal(str(cwd))
    if given is None:
        what = f"the job's output goes to the directory sbatch runs from, {cwd}, which"
        _writable(cwd, what, "run it from a directory you can write, or pass --output PATH")
        output = f"{here}/{default}"
    else:
        _check_output(given)
        real = cwd / given
        directory = real if given.endswith("/") or real.is_dir() else real.parent
        _writable(directory, f"--output {given!r}: the directory {directory}", "make it, or name another")
        if directory == real:
            output = f"{adapter.output_literal(str(real))}/{default}"
        else:
            output = given if given.startswith("/") else f"{here}/{given}"
    problem = adapter.output_problem(output)
    if problem:
        raise UsageError(
            f"the job's output path {output!r} cannot be given to {adapter.submit_tool}: {problem}",
            hint="pass --output PATH with another path",
        )
    return output


def _check_output(given: str) -> None:
    """A path, as a word of its own: no option, nothing a command line or a directive line cannot carry."""
    if not given:
        raise UsageError("--output is empty", hint="name the job's output file, or a directory for it")
    bad = values.control_problem(given)
    if bad is not None:
        raise UsageError(f"--output {given!r}: {bad[0]} is not allowed in a path", hint=bad[1])
    if given.startswith("-"):
        raise UsageError(
            f"--output {given!r} looks like an option, not a path",
            hint=f"for a file of that name write ./{given}",
        )


def _writable(directory: Path, what: str, hint: str) -> None:
    """The scheduler writes the output file on the job's node and makes no directory: a missing or read-only
    one would lose the job's output, found only after the job ran."""
    if not directory.is_dir():
        raise UsageError(f"{what} does not exist as a directory", hint=f"{hint}: the scheduler makes none")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"{what} is not writable by you", hint=hint)


def submit(
    record: state.EnvRecord, prepared: Prepared, env: Mapping[str, str], output: Optional[str] = None
) -> Submitted:
    """Write the job script into the env's job directory (the scheduler keeps its own copy at submission: this
    one is the record of what ran) and submit it, its output to ``job_output``; the scheduler's job id."""
    adapter, text = job_script(record, prepared)
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    out_path = job_output(adapter, record.name, output, Path.cwd(), stamp)
    install_wrappers(record)
    job_dir = Path(record.prefix) / "envbuilder" / "jobs" / f"job-{stamp}"
    job_dir.mkdir(mode=0o755, parents=True)
    script = job_dir / "job.sh"
    script.write_text(text, encoding="utf-8")
    script.chmod(0o755)
    argv = adapter.submit(str(script), out_path)
    try:
        res = proc.run(argv, env=proc.scrubbed_env(env), cwd=str(Path.cwd()))
    except FileNotFoundError:
        raise UsageError(f"{argv[0]} is not on PATH: is this a login node of the site?") from None
    job = adapter.job_id(res.stdout)
    return Submitted(job, str(script), adapter.output_of(out_path, job))
