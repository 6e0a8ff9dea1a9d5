"""Pure: what a validation run is. Which checks, on which device, through which launcher argv, in which batch
script, and whether this host can run it at all.

Nothing here starts a process or reads the file system; ``validate.py`` does the running, ``report.py`` the
merging. ``plan`` uses :func:`launch` to show the same command a real run uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional

from envbuilder.errors import RecipeError, UsageError, did_you_mean
from envbuilder.facts import HostFacts
from envbuilder.recipe import sections
from envbuilder.validate import batch, checks, launchers, schedulers

if TYPE_CHECKING:  # only types here: the recipe arrives loaded, the activation planned (plan imports suite)
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

    def args(self) -> list[str]:
        argv = ["--checks", ",".join(self.checks), "--device", self.device]
        if self.expect_gpus is not None:
            argv += ["--expect-gpus", str(self.expect_gpus)]
        if self.out:
            argv += ["--out", self.out, "--timeout", f"{self.timeout:g}"]
            argv += ["--sweep-max", str(self.sweep_max or SWEEP_MAX[self.device])]
        for directory in self.fs:
            argv += ["--fs", directory]
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


@dataclass(frozen=True)
class LaunchRequest:
    """What the command line asks of the launch (--launcher, --nodes, --nproc-per-node, --account); None leaves
    it to the recipe."""

    launcher: Optional[str] = None
    nodes: Optional[int] = None
    nproc_per_node: Optional[int] = None
    account: Optional[str] = None


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
    prefix, env_python, activate = env.prefix, env.python, env.activate
    request = request or LaunchRequest()
    nproc_per_node, account = request.nproc_per_node, request.account
    validation, sched, site_launcher = recipe.validation, recipe.scheduler, recipe.launcher
    name = request.launcher or validation.launcher or site_launcher.default
    nodes = request.nodes or validation.nodes
    gpus = len(target.gpus) if target.gpus and payload.device == "cuda" else 0
    nproc = nproc_per_node or validation.nproc_per_node or (gpus if gpus else 2)
    adapter = schedulers.get(sched.type)
    chosen = launchers.get(name)
    if chosen.one_process:
        nproc = 1
    if chosen.one_node and nodes > 1:
        name = adapter.node_launcher if adapter else "mpiexec"
        warnings.append(f"{chosen.name} alone reaches one node; launching {nodes} nodes through {name}")
        chosen = launchers.get(name)
    script = (f"{package_dir}/payloads/validate.py", *payload.args())
    affinity: tuple[str, ...] = ()
    if site_launcher.gpu_affinity != "none" and not chosen.agent and gpus:
        affinity = (f"{package_dir}/payloads/gpu_affinity.sh", site_launcher.gpu_affinity)
    if payload.device == "cuda" and payload.expect_gpus is None and gpus:
        # A wrapper that binds one GPU per rank leaves each rank one device; torchrun's workers see the node's.
        payload = replace(payload, expect_gpus=1 if affinity else gpus)
        script = (f"{package_dir}/payloads/validate.py", *payload.args())
    spec = launchers.LaunchSpec(
        python=env_python,
        script=script,
        nodes=nodes,
        nproc_per_node=nproc,
        torchrun=(env_python, "-m", "torch.distributed.run"),
        port=site_launcher.port,
        rdzv_id=adapter.rdzv_id if adapter else "envbuilder",
        mpi=site_launcher.mpi,
        cpu_bind=site_launcher.cpu_bind,
        depth=site_launcher.depth,
        affinity_wrapper=affinity,
    )
    argv = tuple(chosen.argv(spec))
    partition = validation.partition or sched.partition
    if adapter is None:
        return Launch(name, argv, nodes, nproc, None, None, None, None)
    part = sched.partitions.get(partition or "", sections.Partition())
    site_gpus = gpus if part.gpus_per_node is None else part.gpus_per_node
    cores = part.cores_per_node or recipe.compute.cores_per_node
    agent = chosen.agent
    job = batch.JobShape(
        nodes=nodes,
        tasks_per_node=1 if agent else nproc,
        gpus_per_node=site_gpus if payload.device == "cuda" else 0,
        cpus_per_task=cores if (agent and cores and not sched.exclusive_nodes) else None,
        partition=partition,
        time=validation.time or sched.time,
        account=account,
        name=f"envbuilder-{recipe.name}"[:64],
    )
    if part.max_nodes and nodes > part.max_nodes:
        warnings.append(f"partition {partition} allows {part.max_nodes} node(s); {nodes} asked for")
    if sched.account_required and not account:
        warnings.append("this site needs an allocation account for every job: pass --account")
    directives = adapter.directives(job, sched.gpu_request, sched.required_flags)
    batch.check_dialect(directives, sched.forbidden_flags, sched.allowed_flags, recipe.chain[0])
    interactive = tuple(batch.interactive_argv(sched.interactive, job)) if sched.interactive else None
    text = batch.script(
        scheduler=adapter.name,
        directives=directives,
        activate=replace(activate, modules=tuple(job_modules(recipe, activate))),
        multinode=nodes > 1,
        launch=argv,
        workdir=workdir or f"{prefix}/envbuilder/validation",
    )
    return Launch(name, argv, nodes, nproc, adapter.name, partition, interactive, text)


def job_modules(recipe: Recipe, activate: Activation) -> list[str]:
    """The modules a validation job loads: the recipe's build modules, then those activate adds."""
    load = list(recipe.modules.load)
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
