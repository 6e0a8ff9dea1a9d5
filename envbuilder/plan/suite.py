"""Pure: what a validation run is. Which checks, on which device, through which launcher argv, in which batch
script, and whether this host can run it at all.

Nothing here starts a process or reads the file system; ``validate.runner`` does the running,
``validate.report`` the merging. It lives in ``plan`` because a plan shows the same launch a real run uses
(``planning`` calls :func:`launch`), and ``validate`` sits above ``plan``; the job script around the launch is
``batch``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from packaging.utils import canonicalize_name

from envbuilder.core import checks, launchers, schedulers
from envbuilder.core.errors import RecipeError, UsageError, did_you_mean
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.plan import allocation, batch
from envbuilder.recipe import sections

if TYPE_CHECKING:  # only types: the recipe arrives loaded, the activation planned (planning imports suite)
    from envbuilder.plan.activation import Activation
    from envbuilder.recipe.loader import Recipe

#: Largest all_reduce message of the bandwidth sweep: 1 GiB on GPUs (the figure nccl-tests users compare),
#: 16 MiB on CPU where gloo would spend minutes on more.
SWEEP_MAX = {"cuda": 1 << 30, "cpu": 16 << 20}
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Payload:
    """The payload's arguments for one run."""

    checks: tuple[str, ...]
    device: str  # cuda | cpu
    expect_gpus: Optional[int] = None
    out: Optional[str] = None
    fs: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT_S
    sweep_max: Optional[int] = None
    #: The tensor operations the recipe builds Horovod with (its HOROVOD_GPU_OPERATIONS), for the horovod check.
    horovod_gpu_ops: Optional[str] = None

    def args(self) -> list[str]:
        argv = ["--checks", ",".join(self.checks), "--device", self.device]
        if self.expect_gpus is not None:
            argv += ["--expect-gpus", str(self.expect_gpus)]
        if self.horovod_gpu_ops and "horovod" in self.checks:
            argv += ["--horovod-gpu-ops", self.horovod_gpu_ops]
        if self.out:
            argv += ["--out", self.out, "--timeout", f"{self.timeout:g}"]
            argv += ["--sweep-max", str(self.sweep_max or SWEEP_MAX[self.device])]
        for directory in self.fs:
            argv.append(f"--fs={directory}")  # one word: a directory starting with - stays a value
        return argv


@dataclass(frozen=True)
class Launch:
    launcher: str
    argv: tuple[launchers.Arg, ...]
    nodes: int
    nproc_per_node: int
    scheduler: Optional[str]
    partition: Optional[str]
    interactive: Optional[tuple[str, ...]]
    script: Optional[str]
    #: The recipe's rendezvous port; None: the job's own (``$MASTER_PORT``).
    port: Optional[int] = None

    @property
    def world(self) -> int:
        return self.nodes * self.nproc_per_node


def checks_for(recipe: Recipe, requested: Optional[Sequence[str]]) -> tuple[str, ...]:
    """The recipe's checks (or the defaults), or those asked for; unknown names are a usage error."""
    chosen = list(requested or recipe.validation.checks or checks.DEFAULTS)
    unknown = [c for c in chosen if c not in checks.NAMES]
    if unknown:
        raise UsageError(f"unknown check(s): {', '.join(unknown)}", hint=f"checks: {', '.join(checks.NAMES)}")
    return tuple(dict.fromkeys([checks.FIRST, *chosen]))


def horovod_gpu_ops(recipe: Recipe) -> Optional[str]:
    """The GPU operations the recipe's horovod package is built with (``HOROVOD_GPU_OPERATIONS`` in its
    ``build_env``), which the horovod check then expects of the build; None where it does not say."""
    for package in recipe.packages:
        if canonicalize_name(package.name) == "horovod":
            return package.build_env.get("HOROVOD_GPU_OPERATIONS")
    return None


def device_for(target: HostFacts, cpu: bool) -> str:
    """cuda when the env is for GPUs, unless --cpu; a CPU-only target is always a CPU run."""
    return "cpu" if cpu or not target.gpus else "cuda"


def where(device: str, host: HostFacts, target: HostFacts, submit: bool) -> Optional[str]:
    """None when the run can go ahead on this host; otherwise why it cannot (the caller submits or explains)."""
    if submit:
        return "submitting to the scheduler (--submit)"
    if device == "cpu":
        return None
    if not host.gpus:
        want = f"{len(target.gpus or ())}× {target.gpus[0].name}" if target.gpus else "GPUs"
        return f"this host ({host.hostname or 'here'}) has no GPU; the env is for {want}"
    return None


@dataclass(frozen=True)
class LaunchedEnv:
    """The env a validation runs in: its prefix, the python the ranks run, what activating it loads and sets."""

    prefix: str
    python: str
    activate: Activation
    #: Whether the env has a python of its own (a venv, a conda env), not the site's (runner.environment).
    own_python: bool = True
    #: A container env's: the runtime's argv that runs the rest inside its image (plan.container.exec_prefix);
    #: ``python`` is then the image's.
    wrap: tuple[str, ...] = ()
    #: A container env's ``container.mpi``: "image" where the ranks use the image's MPI, which then needs the
    #: launcher's PMI (srun --mpi=IMAGE_PMI unless the site's launcher.mpi names its plugin).
    mpi: str = ""


#: The PMI srun gives an image's MPI where the site names no plugin (Apptainer's hybrid model; Open MPI and
#: MPICH images take PMIx).
IMAGE_PMI = "pmix"


@dataclass(frozen=True)
class LaunchRequest:
    """What the command line asks of the launch (--launcher, --nodes, --nproc-per-node, --account, --partition);
    None leaves it to the recipe. ``here`` is where a run here starts (inside a job, inside one of its steps,
    on a login node); None plans the batch script's launch."""

    launcher: Optional[str] = None
    nodes: Optional[int] = None
    nproc_per_node: Optional[int] = None
    account: Optional[str] = None
    partition: Optional[str] = None
    here: Optional[schedulers.Where] = None


def launch(
    recipe: Recipe,
    target: HostFacts,
    env: LaunchedEnv,
    payload: Payload,
    *,
    package_dir: str,
    warnings: list[str],
    request: Optional[LaunchRequest] = None,
    workdir: Optional[str] = None,
) -> Launch:
    """The launcher argv for ``payload``, and the site's batch script and interactive command around it."""
    if payload.horovod_gpu_ops is None:
        payload = replace(payload, horovod_gpu_ops=horovod_gpu_ops(recipe))
    script = (f"{package_dir}/payloads/validate.py", *payload.args())
    shape = shape_for(recipe, target, request or LaunchRequest(), payload.device, warnings)
    affinity: tuple[str, ...] = ()
    if recipe.launcher.gpu_affinity != "none" and not shape.launcher.agent and shape.gpus:
        affinity = (f"{package_dir}/payloads/gpu_affinity.sh", recipe.launcher.gpu_affinity)
    if payload.device == "cuda" and payload.expect_gpus is None and shape.gpus:
        # A wrapper that binds one GPU per rank leaves each rank one device; torchrun's workers see the node's.
        payload = replace(payload, expect_gpus=1 if affinity else shape.gpus)
        script = (f"{package_dir}/payloads/validate.py", *payload.args())
    # torchrun's agent through the payload's wrapper, which leaves without tearing torch down (0.3-0.5 s a run).
    program = Program(script, torchrun=(f"{package_dir}/payloads/envbuilder_torchrun.py",))
    return launch_program(recipe, shape, env, program, warnings=warnings, affinity=affinity, workdir=workdir)


@dataclass(frozen=True)
class Program:
    """What every rank runs: a python script with its arguments (run by the env's python, or by torchrun), or
    an executable (``python=False``: torchrun gets ``--no-python``)."""

    argv: tuple[str, ...]
    python: bool = True
    #: How the env's python runs torchrun's agent, where torchrun launches it.
    torchrun: tuple[str, ...] = ("-m", "torch.distributed.run")


@dataclass(frozen=True)
class Shape:
    """The launch's shape: which launcher, how many nodes and ranks per node, on which partition, how many
    GPUs each node gives, with which CPUs per node, and where it starts (None: in a batch script)."""

    launcher: launchers.Launcher
    nodes: int
    nproc: int
    gpus: int
    partition: Optional[str]
    partition_facts: sections.Partition
    cores: Optional[int]
    account: Optional[str]
    here: Optional[schedulers.Where]


def omp_threads(cores: int, ranks_per_node: int) -> int:
    return max(1, cores // max(1, ranks_per_node))


def shape_for(
    recipe: Recipe, target: HostFacts, request: LaunchRequest, device: str, warnings: list[str]
) -> Shape:
    """Launcher, nodes, ranks per node and partition from the command line, the recipe and where it starts."""
    validation, sched = recipe.validation, recipe.scheduler
    here = request.here
    partition = (
        request.partition or (here.partition if here else None) or validation.partition or sched.partition
    )
    part = sched.partitions.get(partition or "", sections.Partition())
    gpus = len(target.gpus) if target.gpus and device == "cuda" else 0
    if gpus and part.gpus_per_node is not None and here is None:
        gpus = (
            part.gpus_per_node
        )  # a job script asks for the partition's GPUs; a run here has the visible ones
    nodes = request.nodes or validation.nodes
    nproc = request.nproc_per_node or validation.nproc_per_node or (gpus if gpus else 2)
    adapter = schedulers.get(sched.type)
    chosen = launchers.get(request.launcher or validation.launcher or recipe.launcher.default)
    if chosen.one_process:
        nproc = 1
    if chosen.one_node and nodes > 1:
        name = adapter.node_launcher if adapter else "mpiexec"
        warnings.append(f"{chosen.name} alone reaches one node; launching {nodes} nodes through {name}")
        chosen = launchers.get(name)
    if here and here.in_job and here.nodes and nodes > here.nodes:
        raise UsageError(
            f"{nodes} nodes asked for inside job {here.job}, which holds {here.nodes}",
            hint="ask for fewer nodes, or leave the job and pass --submit",
        )
    cores = (here.cpus_per_node if here and here.in_job else None) or part.cores_per_node
    shape = Shape(
        launcher=chosen,
        nodes=nodes,
        nproc=nproc,
        gpus=gpus,
        partition=partition,
        partition_facts=part,
        cores=cores or recipe.compute.cores_per_node,
        account=request.account,
        here=here,
    )
    if here and here.in_job:
        # What the job holds against what the launch needs, before a rank starts (alloc prints the same).
        allocation.hold(recipe, shape, here, warnings)
    return shape


def launch_program(
    recipe: Recipe,
    shape: Shape,
    env: LaunchedEnv,
    program: Program,
    *,
    warnings: list[str],
    affinity: tuple[str, ...] = (),
    workdir: Optional[str] = None,
    stage: Sequence[str] = (),
) -> Launch:
    """The launch of ``program`` in ``shape`` by the recipe's rules, with the batch script around it (``stage``:
    the script's command that stages the env's image first)."""
    sched, site_launcher = recipe.scheduler, recipe.launcher
    adapter = schedulers.get(sched.type)
    spec = launchers.LaunchSpec(
        python=env.python,
        script=program.argv,
        nodes=shape.nodes,
        nproc_per_node=shape.nproc,
        torchrun=(*env.wrap, env.python, *program.torchrun, *(() if program.python else ("--no-python",))),
        port=site_launcher.port,
        rdzv_id=adapter.rdzv_id if adapter else "envbuilder",
        mpi=site_launcher.mpi or (IMAGE_PMI if env.mpi == "image" else None),
        cpu_bind=site_launcher.cpu_bind,
        depth=site_launcher.depth,
        affinity_wrapper=affinity,
        cpus_per_task=_cpus_per_task(shape, adapter),
        overlap=bool(shape.here and shape.here.in_step),
        direct=not program.python,
        wrap=env.wrap,
    )
    argv = tuple(shape.launcher.argv(spec))
    if adapter is None:
        return Launch(
            shape.launcher.name, argv, shape.nodes, shape.nproc, None, None, None, None, site_launcher.port
        )
    job = _job_shape(recipe, shape)
    if shape.partition_facts.max_nodes and shape.nodes > shape.partition_facts.max_nodes:
        warnings.append(
            f"partition {shape.partition} allows {shape.partition_facts.max_nodes} node(s); "
            f"{shape.nodes} asked for"
        )
    if sched.account_required and not shape.account:
        warnings.append("this site needs an allocation account for every job: pass --account")
    directives = adapter.directives(job, sched.gpu_request, sched.required_flags)
    interactive = tuple(batch.interactive_argv(sched.interactive, job)) if sched.interactive else None
    if interactive and adapter.step_cpu_options and (job.cpus_per_task or 0) > 1:
        _cpu_request(interactive, job.cpus_per_task or 0, adapter, warnings)
    step = launchers.own_options(argv, spec)
    _check_dialect(recipe, adapter, directives, interactive=interactive, step=step, launcher=shape.launcher)
    text = batch.script(
        scheduler=adapter.name,
        directives=directives,
        activate=replace(env.activate, modules=tuple(job_modules(recipe, env.activate))),
        launch=argv,
        rendezvous=batch.Rendezvous(site_launcher.port) if shape.nodes > 1 else None,
        workdir=workdir or f"{env.prefix}/envbuilder/validation",
        stage=stage,
        env=batch.JobEnv(
            env.prefix,
            env.own_python,
            batch.Threads(shape.nproc, site_launcher.depth, shape.cores),
            enter=not env.wrap,
        ),
    )
    return Launch(
        shape.launcher.name,
        argv,
        shape.nodes,
        shape.nproc,
        adapter.name,
        shape.partition,
        interactive,
        text,
        site_launcher.port,
    )


def _check_dialect(
    recipe: Recipe,
    adapter: schedulers.Scheduler,
    directives: Sequence[str],
    *,
    interactive: Optional[Sequence[str]],
    step: Sequence[str],
    launcher: launchers.Launcher,
) -> None:
    """The site's forbidden (and allowed) flags, held against every text envbuilder hands the scheduler: the
    script's directives, the interactive allocation, the step that starts the ranks (srun under Slurm, the
    node launcher) and the submit command."""
    sched, where, aliases = recipe.scheduler, recipe.chain[0], adapter.short_options
    batch.check_dialect(directives, sched.forbidden_flags, sched.allowed_flags, where, aliases)
    if interactive:
        what = "interactive command (scheduler.interactive)"
        batch.check_command(interactive[1:], sched.forbidden_flags, what, where, aliases)
    if launcher.scheduler == adapter.name or launcher.name == adapter.node_launcher:
        batch.check_command(step, sched.forbidden_flags, f"{launcher.name} step", where, aliases)
    submit = adapter.submit("job.sh", "job.out")
    batch.check_command(submit[1:-1], sched.forbidden_flags, f"{submit[0]} command", where, aliases)


def _cpu_request(
    interactive: Sequence[str], cpus: int, adapter: schedulers.Scheduler, warnings: list[str]
) -> None:
    """A step (Slurm's ``srun --pty``) gets one CPU unless one of its scheduler's ``step_cpu_options`` asks for
    more: the launch inside it would run every rank on that one core. Warn where the site's template asks for
    none."""
    asked = {name for _, name in batch.options(interactive[1:], adapter.short_options)}
    if asked & set(adapter.step_cpu_options):
        return
    warnings.append(
        f"the interactive command ({interactive[0]} ...) asks for no CPUs, so its step gets one and every "
        f"rank would share it; add {adapter.step_cpu_options[0]}={{cpus}} to scheduler.interactive "
        f"({cpus} per task here)"
    )


def _cpus_per_task(shape: Shape, adapter: Optional[schedulers.Scheduler]) -> Optional[launchers.Arg]:
    """srun's CPUs per torchrun agent: all the job holds on the node. A batch script reads them from the
    scheduler's variable; a run here uses what the job says, and a run outside any job leaves it to srun."""
    if not (shape.launcher.agent and shape.launcher.scheduler and adapter):
        return None
    if shape.here is None:
        return launchers.ShellVar(adapter.cpus_var)
    if shape.here.in_job and shape.here.cpus_per_node:
        return str(shape.here.cpus_per_node)
    return None


def _job_shape(recipe: Recipe, shape: Shape) -> schedulers.JobShape:
    sched = recipe.scheduler
    site_gpus = (
        shape.gpus if shape.partition_facts.gpus_per_node is None else shape.partition_facts.gpus_per_node
    )
    cores = shape.partition_facts.cores_per_node or recipe.compute.cores_per_node
    agent = shape.launcher.agent
    return schedulers.JobShape(
        nodes=shape.nodes,
        tasks_per_node=1 if agent else shape.nproc,
        gpus_per_node=site_gpus if shape.gpus else 0,
        cpus_per_task=cores if (agent and cores and not sched.exclusive_nodes) else None,
        partition=shape.partition,
        time=recipe.validation.time or sched.time,
        account=shape.account,
        name=f"envbuilder-{recipe.name}"[:64],
    )


def job_modules(recipe: Recipe, activate: Activation) -> list[str]:
    """The modules a validation job loads: the recipe's build modules but the build-only ones, then those
    activate adds (what activation loads; also for an env recorded before activation loaded the build's)."""
    load = [m for m in recipe.modules.load if m not in recipe.modules.build_only]
    return load + [m for m in activate.modules if m not in load]


def filesystems(
    recipe: Recipe,
    env: Mapping[str, str],
    expand: Callable[[str, Mapping[str, str], str], tuple[str, list[str]]],
) -> tuple[str, ...]:
    """Directories for the file system check: the recipe's named filesystems, else $SCRATCH."""
    names = recipe.validation.filesystems
    table = recipe.filesystems
    dirs = []
    for name in names:
        if name not in table:
            hint = did_you_mean(name, table) or f"[filesystems] has: {', '.join(table) or 'nothing'}"
            raise RecipeError(
                f"validation.filesystems names {name!r}, which is not a [filesystems] entry",
                file=recipe.chain[0],
                key="validation.filesystems",
                hint=hint,
            )
        text, missing = expand(table[name].path, env, recipe.name)
        if not missing:
            dirs.append(text)
    if not names and env.get("SCRATCH"):
        dirs.append(env["SCRATCH"])
    return tuple(dirs)
