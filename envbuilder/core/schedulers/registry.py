"""The one registry of schedulers (pure): every scheduler a recipe can name, by name, read by the recipe schema,
the host probe, the runner, staging and batch scripts. A scheduler is added by one adapter module beside this one
(a :class:`~envbuilder.core.schedulers.base.Scheduler` subclass and its ``SCHEDULER``) and its module in
:data:`_ADAPTERS`; no other module names a scheduler or its variables (tests/unit/test_scheduler_seam.py checks).
``runner`` and ``staging`` run the adapters' commands through ``proc``; ``batch`` writes the script around the
directives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Optional

from envbuilder.core.schedulers import pbs, slurm
from envbuilder.core.schedulers.base import HostList, Scheduler, Where

#: The adapter modules, in the order the probe tries them; each has ``SCHEDULER``, its adapter.
#: torch's own MASTER_PORT default, for a multi-node run no scheduler numbered.
DEFAULT_PORT = 29500
_ADAPTERS = (slurm, pbs)

#: Every scheduler a recipe can name (besides "none"), in the order the probe tries them.
SCHEDULERS: dict[str, Scheduler] = {a.SCHEDULER.name: a.SCHEDULER for a in _ADAPTERS}


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
    return replace(where, visible_gpus=visible_gpus(env))


def visible_gpus(env: Mapping[str, str]) -> Optional[int]:
    """The GPUs CUDA_VISIBLE_DEVICES leaves this process (None where it is unset; Slurm's "NoDevFiles" and an
    empty value leave none)."""
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    return len([d for d in text.split(",") if d.strip() and d.strip() != "NoDevFiles"])


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


def job_port(env: Mapping[str, str]) -> int:
    """The rendezvous port of the job this process runs in; torch's own default outside any job."""
    for adapter in SCHEDULERS.values():
        port = adapter.job_port(env)
        if port is not None:
            return port
    return DEFAULT_PORT


def get(name: Optional[str]) -> Optional[Scheduler]:
    """The adapter for a recipe's ``scheduler.type``; None for "none" (or no scheduler)."""
    return SCHEDULERS.get(name or "")
