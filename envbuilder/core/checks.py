"""The bundled checks, one :data:`CHECKS` entry each, in the order a run takes them.

The names are the contract with the payload (``payloads/envbuilder_checks.py`` runs ``Suite.check_<name>``; it
runs inside the env and imports nothing from envbuilder, so a unit test keeps the two in step). The recipe
loader, the suite and the recipe defaults read them from here.
"""

from __future__ import annotations

from envbuilder.core.structs import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    #: Run where neither the recipe nor ``--checks`` names the checks (mpi and horovod need what few envs have).
    default: bool = True


CHECKS = (
    Check("import"),
    Check("gpu"),
    Check("arch"),
    Check("cuda"),
    Check("libraries"),
    Check("affinity"),
    Check("mpi", default=False),
    Check("nccl"),
    Check("ddp"),
    Check("filesystem"),
    Check("horovod", default=False),
)
NAMES = tuple(c.name for c in CHECKS)
DEFAULTS = tuple(c.name for c in CHECKS if c.default)
#: Every run takes it, first: nothing else can run where torch does not import.
FIRST = CHECKS[0].name
#: The smoke check's, right after a build or a restore: torch imports, sees the GPUs, was built for their arch.
SMOKE = (FIRST, "gpu", "arch")
