"""Schedulers: one adapter module per batch system (:mod:`.slurm`, :mod:`.pbs`), what they share (:mod:`.base`:
the ``Scheduler`` they subclass, ``Where``, ``HostList``, ``JobShape``), and the registry every other module asks
(:mod:`.registry`). This face re-exports what callers use. See ``docs/architecture.md``."""

from __future__ import annotations

from envbuilder.core.schedulers.base import HostList, JobShape, Scheduler, Where
from envbuilder.core.schedulers.registry import (
    SCHEDULERS,
    allocation_vars,
    bound_values,
    detect,
    get,
    host_list,
    hosts_vars,
    job_port,
    locate,
)

__all__ = [
    "SCHEDULERS",
    "HostList",
    "JobShape",
    "Scheduler",
    "Where",
    "allocation_vars",
    "bound_values",
    "detect",
    "get",
    "host_list",
    "hosts_vars",
    "job_port",
    "locate",
]
