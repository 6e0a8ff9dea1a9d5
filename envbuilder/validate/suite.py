"""Pure: what a validation run is. Which checks, on which device, through which launcher argv, in which batch
script, and whether this host can run it at all.

Nothing here starts a process or reads the file system; ``validate.py`` does the running, ``report.py`` the
merging. ``plan`` uses :func:`launch` to show the same command a real run uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Optional

from envbuilder.errors import RecipeError, UsageError, did_you_mean
from envbuilder.facts import HostFacts
from envbuilder.validate import batch, launchers

if TYPE_CHECKING:  # only a type here: the recipe arrives loaded
    from envbuilder.recipe.loader import Recipe

CHECKS = ("import", "gpu", "arch", "cuda", "libraries", "mpi", "nccl", "ddp", "filesystem", "horovod")
GPU_ONLY = ("gpu", "arch", "cuda")
DEFAULT_CHECKS = ("import", "gpu", "arch", "cuda", "libraries", "nccl", "ddp", "filesystem")
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
    chosen = list(requested or recipe.get("validation.checks", []) or DEFAULT_CHECKS)
    unknown = [c for c in chosen if c not in CHECKS]
    if unknown:
        raise UsageError(f"unknown check(s): {', '.join(unknown)}", hint=f"checks: {', '.join(CHECKS)}")
    return tuple(dict.fromkeys(["import", *chosen]))


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


def launch(
    recipe: Recipe,
    target: HostFacts,
    prefix: str,
    env_python: str,
    activate: Mapping[str, Any],
    payload: Payload,
    package_dir: str,
    warnings: list[str],
    *,
    launcher: Optional[str] = None,
    nodes: Optional[int] = None,
    nproc_per_node: Optional[int] = None,
    account: Optional[str] = None,
    workdir: Optional[str] = None,
) -> Launch:
    """The launcher argv for ``payload``, and the site's batch script and interactive command around it."""
    name = launcher or recipe.get("validation.launcher") or recipe.get("launcher.default")
    nodes = nodes or int(recipe.get("validation.nodes", 1))
    gpus = len(target.gpus) if target.gpus and payload.device == "cuda" else 0
    nproc = int(nproc_per_node or recipe.get("validation.nproc_per_node") or (gpus if gpus else 2))
    if name == "local":
        nproc = 1
    if name == "torchrun" and nodes > 1:
        name = "srun" if recipe.get("scheduler.type") == "slurm" else "mpiexec"
        warnings.append(f"torchrun alone reaches one node; launching {nodes} nodes through {name}")
    script = (f"{package_dir}/payloads/validate.py", *payload.args())
    affinity: tuple[str, ...] = ()
    if recipe.get("launcher.gpu_affinity") != "none" and not launchers.is_agent(name) and gpus:
        affinity = (f"{package_dir}/payloads/gpu_affinity.sh", str(recipe.get("launcher.gpu_affinity")))
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
        port=int(recipe.get("launcher.port", 29500)),
        rdzv_id=launchers.ShellVar("SLURM_JOB_ID")
        if recipe.get("scheduler.type") == "slurm"
        else "envbuilder",
        mpi=recipe.get("launcher.mpi"),
        cpu_bind=recipe.get("launcher.cpu_bind"),
        depth=recipe.get("launcher.depth"),
        affinity_wrapper=affinity,
    )
    argv = tuple(launchers.build(name, spec))
    scheduler = recipe.get("scheduler.type")
    partition = recipe.get("validation.partition") or recipe.get("scheduler.partition")
    if scheduler not in ("slurm", "pbs"):
        return Launch(name, argv, nodes, nproc, None, None, None, None)
    part = (recipe.get("scheduler.partitions", {}) or {}).get(partition or "", {})
    gpus_per_node = part.get("gpus_per_node", gpus) if payload.device == "cuda" else 0
    cores = part.get("cores_per_node") or recipe.get("compute.cores_per_node")
    agent = launchers.is_agent(name)
    job = batch.JobShape(
        nodes=nodes,
        tasks_per_node=1 if agent else nproc,
        gpus_per_node=int(gpus_per_node or 0),
        cpus_per_task=int(cores)
        if (agent and cores and not recipe.get("scheduler.exclusive_nodes"))
        else None,
        partition=partition,
        time=recipe.get("validation.time") or recipe.get("scheduler.time") or "00:30:00",
        account=account,
        name=f"envbuilder-{recipe.name}"[:64],
    )
    if part.get("max_nodes") and nodes > part["max_nodes"]:
        warnings.append(f"partition {partition} allows {part['max_nodes']} node(s); {nodes} asked for")
    if recipe.get("scheduler.account_required") and not account:
        warnings.append("this site needs an allocation account for every job: pass --account")
    if scheduler == "slurm":
        directives = batch.slurm_directives(
            job, recipe.get("scheduler.gpu_request", "gpus-per-node"), batch.required_flags(recipe.data)
        )
    else:
        directives = batch.pbs_directives(job, batch.required_flags(recipe.data))
    batch.check_dialect(
        directives,
        recipe.get("scheduler.forbidden_flags", []),
        recipe.get("scheduler.allowed_flags", []),
        recipe.chain[0],
    )
    template = recipe.get("scheduler.interactive")
    interactive = tuple(batch.interactive_argv(template, job)) if template else None
    text = batch.script(
        scheduler=scheduler,
        directives=directives,
        module_use=activate["module_use"],
        modules=job_modules(recipe, activate),
        env=activate["env"],
        unset=activate["unset"],
        multinode=nodes > 1,
        launch=argv,
        workdir=workdir or f"{prefix}/envbuilder/validation",
    )
    return Launch(name, argv, nodes, nproc, scheduler, partition, interactive, text)


def job_modules(recipe: Recipe, activate: Mapping[str, Any]) -> list[str]:
    """The modules a validation job loads: the recipe's build modules, then those activate adds."""
    load = list(recipe.get("modules.load", []))
    return load + [m for m in activate.get("modules") or [] if m not in load]


def filesystems(
    recipe: Recipe,
    env: Mapping[str, str],
    expand: Callable[[str, Mapping[str, str], str], tuple[str, list[str]]],
) -> tuple[str, ...]:
    """Directories for the file system check: the recipe's named filesystems, else $SCRATCH."""
    names = recipe.get("validation.filesystems", []) or []
    table = recipe.get("filesystems", {}) or {}
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
        text, missing = expand(table[name]["path"], env, recipe.name)
        if not missing:
            dirs.append(text)
    if not names and env.get("SCRATCH"):
        dirs.append(env["SCRATCH"])
    return tuple(dirs)
