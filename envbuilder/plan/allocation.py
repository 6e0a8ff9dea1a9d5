"""Pure: the allocation a launch needs, and what a job lacks of it.

:func:`advise` turns a launch's shape (:func:`suite.shape_for`: launcher, nodes, ranks per node, GPUs, partition)
into what it needs on each node (:class:`Need`) and the lines that ask a site's scheduler for it: the site's own
interactive command (``scheduler.interactive``: ``idev``, ``srun --pty``, ``qsub -I``), the scheduler adapter's
interactive allocation, its shell on a node and its batch submission, each an argv whose values JobShape checked.
:func:`compare` holds what a job holds on this node (:class:`schedulers.Where`, as the scheduler's variables, the
process's CPU affinity and CUDA_VISIBLE_DEVICES tell) against a :class:`Need` and says what is missing; ``alloc``
prints it, and ``validate`` and ``run`` refuse (or warn) with it before they start ranks.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from envbuilder.core import schedulers, values
from envbuilder.core.errors import RecipeError, UsageError
from envbuilder.core.structs import dataclass
from envbuilder.plan import batch

if TYPE_CHECKING:  # only types: the recipe arrives loaded, the shape planned
    from envbuilder.plan.suite import Shape
    from envbuilder.recipe.loader import Recipe

#: The batch line's script where none is named.
SCRIPT = "job.sh"


class AllocationShort(UsageError):
    """The job this runs in lacks what the launch needs to start (the hint: the line that asks for it)."""


@dataclass(frozen=True)
class Need:
    """What a launch needs: nodes, and on each node its ranks, the cores each rank would use and the GPUs."""

    nodes: int
    ranks_per_node: int
    cores_per_rank: int
    gpus_per_node: int
    #: Whether the scheduler starts one task per rank (srun's step), which it cannot place on fewer CPUs.
    task_per_rank: bool = False

    @property
    def cpus(self) -> int:
        return self.ranks_per_node * self.cores_per_rank

    def to_json(self) -> dict[str, int]:
        return {
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "cores_per_rank": self.cores_per_rank,
            "cpus_per_node": self.cpus,
            "gpus_per_node": self.gpus_per_node,
        }


@dataclass(frozen=True)
class Missing:
    """One thing the job lacks: ``what`` (nodes, cpus, gpus), what it holds and what the launch needs, in words,
    with the options that ask for it; ``refuse`` where the launch cannot start without it (else a warning)."""

    what: str
    held: int
    needed: int
    text: str
    ask: tuple[str, ...]
    refuse: bool

    def to_json(self) -> dict[str, object]:
        return {
            "what": self.what,
            "held": self.held,
            "needed": self.needed,
            "text": self.text,
            "ask": list(self.ask),
            "refuse": self.refuse,
        }


@dataclass(frozen=True)
class Advice:
    """The allocation lines of a launch on its site's scheduler (None: the site or scheduler has no such line)."""

    scheduler: str
    job: schedulers.JobShape
    need: Need
    gpu_request: str
    site: Optional[tuple[str, ...]]
    interactive: Optional[tuple[str, ...]]
    shell: Optional[tuple[str, ...]]
    batch: Optional[tuple[str, ...]]
    #: What the lines' reader should know: a site command that asks for too little, a line left out.
    notes: tuple[str, ...] = ()

    def lines(self) -> list[tuple[str, tuple[str, ...]]]:
        """(label, argv) of each line there is, the site's own first."""
        named = (
            ("site", self.site),
            ("interactive", self.interactive),
            ("shell", self.shell),
            ("batch", self.batch),
        )
        return [(label, argv) for label, argv in named if argv]

    @property
    def fix(self) -> Optional[tuple[str, ...]]:
        """The line to point a user at: the site's own, else the scheduler's interactive allocation."""
        return self.site or self.interactive or self.batch


def need_of(recipe: Recipe, shape: Shape) -> Need:
    """What ``shape``'s launch needs on each node: its ranks, the cores each would use (the launcher's depth, else
    the node's cores, as the partition or the site file give them, shared among the ranks; one where neither
    says) and the GPUs it uses."""
    ranks = max(1, shape.nproc)
    cores = shape.partition_facts.cores_per_node or recipe.compute.cores_per_node
    per_rank = recipe.launcher.depth or (cores // ranks if cores else 1) or 1
    step = bool(shape.launcher.scheduler and not shape.launcher.agent)
    return Need(shape.nodes, ranks, per_rank, shape.gpus, task_per_rank=step)


def job_of(recipe: Recipe, shape: Shape, need: Need, time: Optional[str] = None) -> schedulers.JobShape:
    """The job that holds ``need``: one task per rank (one per node for torchrun's agent, which starts the ranks
    itself), each with its share of the CPUs, unless the site hands out whole nodes; the partition's GPUs."""
    sched = recipe.scheduler
    tasks = 1 if shape.launcher.agent else need.ranks_per_node
    cpus = need.cpus // tasks
    site_gpus = shape.partition_facts.gpus_per_node
    gpus = (site_gpus if site_gpus is not None else shape.gpus) if shape.gpus else 0
    return schedulers.JobShape(
        nodes=need.nodes,
        tasks_per_node=tasks,
        gpus_per_node=gpus,
        cpus_per_task=None if sched.exclusive_nodes or cpus < 2 else cpus,
        partition=shape.partition,
        time=time or recipe.validation.time or sched.time,
        account=shape.account,
        name=f"envbuilder-{recipe.name}"[:64],
    )


def advise(
    recipe: Recipe, shape: Shape, script: str = SCRIPT, time: Optional[str] = None
) -> Optional[Advice]:
    """The allocation lines of ``shape``'s launch (``time``: its walltime, else the recipe's); None where the
    recipe names no scheduler."""
    adapter = schedulers.get(recipe.scheduler.type)
    if adapter is None:
        return None
    need = need_of(recipe, shape)
    job = job_of(recipe, shape, need, time)
    sched = recipe.scheduler
    site = tuple(batch.interactive_argv(sched.interactive, job)) if sched.interactive else None
    required, request = sched.required_flags, sched.gpu_request
    lines = (
        adapter.allocate(job, request, required),
        adapter.shell(job, request, required),
        adapter.batch(job, request, required, script),
    )
    interactive, shell, batch_line = (_allowed(line, recipe, adapter) for line in lines)
    notes = [_site_cpus(site, job, adapter) if site else None]
    notes += [
        f"no {line[0]} line: it would pass an option this site forbids (scheduler.forbidden_flags)"
        for line, kept in zip(lines, (interactive, shell, batch_line))
        if line and not kept
    ]
    return Advice(
        adapter.name,
        job,
        need,
        request,
        site,
        interactive,
        shell,
        batch_line,
        tuple(n for n in notes if n),
    )


def _site_cpus(site: Sequence[str], job: schedulers.JobShape, adapter: schedulers.Scheduler) -> Optional[str]:
    """Where the site's interactive command is a step that asks for no CPUs (a step without gets one), why the
    scheduler's own lines are the ones to use."""
    if not adapter.step_cpu_options or (job.cpus_per_task or 0) < 2:
        return None
    asked = {name for _, name in batch.options(site[1:], adapter.short_options)}
    if asked & set(adapter.step_cpu_options):
        return None
    return (
        f"the site's interactive command ({site[0]} ...) asks for no CPUs, so its step gets one for "
        f"{job.tasks_per_node} task(s) that use {job.cpus_per_task} each: use the lines below, or add "
        f"{adapter.step_cpu_options[0]}={job.cpus_per_task} to it"
    )


def _allowed(
    line: Optional[list[str]], recipe: Recipe, adapter: schedulers.Scheduler
) -> Optional[tuple[str, ...]]:
    """``line``, unless it would pass an option the site rejects (then it is left out)."""
    if not line:
        return None
    try:
        batch.check_command(
            line[1:],
            recipe.scheduler.forbidden_flags,
            f"{line[0]} line",
            recipe.chain[0],
            adapter.short_options,
        )
    except RecipeError:
        return None
    return tuple(line)


def hold(recipe: Recipe, shape: Shape, here: schedulers.Where, warnings: list[str]) -> None:
    """Refuse a launch the job ``here`` cannot start (:class:`AllocationShort`, naming what is missing and the
    line that asks for it); add to ``warnings`` what it lacks but can start without."""
    advice = advise(recipe, shape)
    if advice is None:
        return
    missing = compare(advice, here)
    error = refusal(advice, missing, here)
    if error is not None:
        raise error
    warnings.extend(notes(missing))


def compare(advice: Advice, here: schedulers.Where, seconds_left: Optional[int] = None) -> list[Missing]:
    """What the job ``here`` lacks of ``advice``'s need on this node: nodes, CPUs, GPUs, and the time the job
    would ask for (``seconds_left``: what the scheduler says it has left). Unknown holdings are not missing."""
    adapter = schedulers.get(advice.scheduler)
    need, job = advice.need, advice.job
    found: list[Missing] = []
    if here.nodes and here.nodes < need.nodes:
        nodes = tuple(adapter.node_options(job, advice.gpu_request)) if adapter else ()
        text = f"the job holds {_n(here.nodes, 'node')}; the launch needs {need.nodes}"
        found.append(Missing("nodes", here.nodes, need.nodes, text, nodes, refuse=True))
    cpus = here.cpus_per_node
    if cpus and cpus < need.cpus:
        found.append(_cpus(need, cpus, _ask_cpus(adapter, job, advice.gpu_request)))
    gpus = _held_gpus(here, advice.gpu_request)
    if need.gpus_per_node and gpus is not None and gpus < need.gpus_per_node:
        ask = tuple(
            (adapter.gpu_options(job, advice.gpu_request) or adapter.node_options(job, advice.gpu_request))
            if adapter
            else ()
        )
        # NCCL refuses two ranks on one GPU; a rank with none has nothing to run on.
        refuse = gpus == 0 or gpus < need.ranks_per_node
        text = (
            f"the job holds {_n(gpus, 'GPU')} on this node; the launch needs {need.gpus_per_node} "
            f"for {_n(need.ranks_per_node, 'rank')}"
        )
        found.append(Missing("gpus", gpus, need.gpus_per_node, text, ask, refuse=refuse))
    wanted = values.time_seconds(job.walltime) or 0
    if seconds_left is not None and seconds_left < wanted:
        ask = tuple(w for w in adapter.place_options(job) if "time" in w) if adapter else ()
        text = f"the job has {_clock(seconds_left)} left; the launch's job asks for {job.walltime}"
        found.append(Missing("time", seconds_left, wanted, text, ask or (job.walltime,), refuse=False))
    return found


def _clock(seconds: int) -> str:
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _cpus(need: Need, cpus: int, ask: tuple[str, ...]) -> Missing:
    text = (
        f"the job holds {_n(cpus, 'CPU')} on this node; {_n(need.ranks_per_node, 'rank')} x "
        f"{_n(need.cores_per_rank, 'core')} need {need.cpus}"
    )
    # The scheduler places no more tasks than CPUs; other launchers start the ranks on fewer, sharing them.
    refuse = need.task_per_rank and cpus < need.ranks_per_node
    if not refuse:
        share = max(1, cpus // need.ranks_per_node)
        text += f" (each rank gets {_n(share, 'thread')}" + (
            ", sharing a CPU)" if cpus < need.ranks_per_node else ")"
        )
    return Missing("cpus", cpus, need.cpus, text, ask, refuse=refuse)


def _ask_cpus(
    adapter: Optional[schedulers.Scheduler], job: schedulers.JobShape, request: str
) -> tuple[str, ...]:
    """The options that ask for the CPUs: the CPUs per task with the tasks per node, where they are apart."""
    if adapter is None:
        return ()
    asked = adapter.cpu_options(job)
    if not asked:
        return tuple(adapter.node_options(job, request))
    return tuple(w for w in adapter.node_options(job, request) if "tasks" in w) + tuple(asked)


def _held_gpus(here: schedulers.Where, gpu_request: str) -> Optional[int]:
    """The GPUs the job holds here: CUDA_VISIBLE_DEVICES's where set, and the scheduler's count where the site
    asks its scheduler for GPUs (a site of whole nodes, ``gpu_request = "none"``, hands out every GPU of the
    node without a word)."""
    told = here.gpus if gpu_request != "none" else None
    known = [n for n in (told, here.visible_gpus) if n is not None]
    return min(known) if known else None


def refusal(advice: Advice, missing: Sequence[Missing], here: schedulers.Where) -> Optional[AllocationShort]:
    """The error for what ``missing`` says the launch cannot start without; None where it can start."""
    hard = [m for m in missing if m.refuse]
    if not hard:
        return None
    what = "; ".join(m.text for m in hard)
    asks = " ".join(dict.fromkeys(w for m in hard for w in m.ask))
    fix = advice.fix
    line = f": {shlex.join(fix)}" if fix else ""
    return AllocationShort(
        f"job {here.job} lacks what the launch needs: {what}",
        hint=f"ask with {asks}" + (f"; a new allocation that holds it{line}" if fix else ""),
    )


def notes(missing: Sequence[Missing]) -> list[str]:
    """What the launch can start without but would run worse for."""
    return [f"{m.text}: ask with {' '.join(m.ask)}" if m.ask else m.text for m in missing if not m.refuse]


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")
