"""The site half of the recipe schema (:mod:`envbuilder.recipe.schema` holds the rest and merges these tables in
their place): ``site``, ``compute`` (the facts a site states, with sources), ``scheduler`` and its partitions,
``modules``, ``filesystems``, ``env_profiles`` and ``launcher``, with the names and patterns only they use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from envbuilder.core import launchers, schedulers
from envbuilder.core.facts import GPU_VENDORS
from envbuilder.core.space import QUOTA_TOOLS
from envbuilder.core.values import (
    CPU_BIND,
    DIRECTIVE,
    FLAG,
    MAX_CORES_PER_NODE,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MODULE_NAME,
    MPI_PLUGIN,
    NAME_RE,
    NOT_AN_OPTION,
    PARTITION,
    PATH_ENTRY,
    SCHED_NAME_RE,
    TIME,
    VAR_NAME,
    VAR_RE,
)
from envbuilder.recipe.spec import Field, MapOf, Spec, Table

#: A recipe may name no scheduler.
SCHEDULERS = (*schedulers.SCHEDULERS, "none")
MODULE_SYSTEMS = ("lmod", "environment-modules", "none")
GPU_REQUEST_STYLES = ("gpus-per-node", "gres", "gpus", "none", "pbs-ngpus")
GPU_AFFINITY = ("none", "local-rank", "reverse-local-rank")
STATUSES = ("active", "retired")
#: The compute facts a site states with their source; "unknown" is a value too, with a note saying why.
SOURCED_FACTS = ("os", "glibc", "python")
#: A GPU's code target where it is not a compute capability: gfx90a, gfx942 (AMD), pvc, bmg (Intel).
GPU_ARCH = r"gfx[0-9a-f]{3,4}|[a-z]{2,5}"
UNKNOWN = "unknown"
DATE = r"\d{4}-\d{2}-\d{2}"


def _unknown_problem(compute: Mapping[str, Any]) -> Optional[tuple[str, str, Optional[str]]]:
    """(key, message, hint) where [compute] calls a fact unknown without a note saying why."""
    sources = compute.get("sources") or {}
    for fact in SOURCED_FACTS:
        if compute.get(fact) == UNKNOWN and not (sources.get(fact) or {}).get("note"):
            return (
                fact,
                f'{fact} = "unknown" needs a note saying why',
                f"add [compute.sources.{fact}] with source, checked and note (what was looked at, how to check)",
            )
    return None


#: The site's tables, in the order the recipe schema lists them.
SITE_TABLES: dict[str, Spec] = {
    "site": Table(
        {
            "name": Field(str, pattern=NAME_RE, example="vista-venv-cu124"),
            "center": Field(str),
            "title": Field(str, prose=True),
            "status": Field(str, choices=STATUSES),
            "retired_on": Field(str, pattern=r"\d{4}-\d{2}-\d{2}", example="2025-12-08"),
            "validatable": Field(bool, "false where the machine no longer exists"),
            "document": Field(str, "source document (URL or seed file)"),
            "document_date": Field(str, pattern=r"\d{4}-\d{2}(-\d{2})?", example="2024-09-18"),
            "notes": Field(str, prose=True),
        }
    ),
    "compute": Table(
        {
            "arch": Field(str, choices=("x86_64", "aarch64")),
            "gpus_per_node": Field(int, minimum=0, maximum=MAX_GPUS_PER_NODE),
            "gpu": Field(str, "GPU model as the driver names it"),
            "compute_capability": Field(str, pattern=r"\d+\.\d+", example="9.0"),
            "driver_version": Field(str, pattern=r"\d+\.\d+(\.\d+)?", example="550.54.15"),
            "max_cuda": Field(str, "highest CUDA the driver supports", pattern=r"\d+\.\d+", example="12.9"),
            "gpu_vendor": Field(str, "whose GPUs the nodes have (nvidia when unset)", choices=GPU_VENDORS),
            "gpu_arch": Field(
                str,
                "an AMD GPU's gfx target or an Intel GPU's family",
                pattern=GPU_ARCH,
                example="gfx90a",
            ),
            "amdgpu_version": Field(
                str,
                "the amdgpu kernel driver's version (amd-smi, /sys/module/amdgpu/version)",
                pattern=r"\d+\.\d+(\.\d+)*",
                example="6.10.5",
            ),
            "level_zero": Field(str, "the Level Zero loader's version on the nodes", pattern=r"\d+(\.\d+)*"),
            "os": Field(str, 'the compute nodes\' operating system, or "unknown" (say why in sources.os)'),
            "glibc": Field(str, 'or "unknown"', pattern=r"\d+\.\d+|unknown", example="2.28"),
            "python": Field(
                str,
                "the Python 3 the compute nodes give an env (the site's documented python module's, else the system python3), or \"unknown\"",
                pattern=r"3\.\d+(\.\d+)?|unknown",
                example="3.11.8",
            ),
            "sources": MapOf(
                Table(
                    {
                        "source": Field(str, "where the fact was read", required=True, prose=True),
                        "checked": Field(
                            str,
                            "the day it was checked",
                            required=True,
                            pattern=DATE,
                            example="2026-11-27",
                        ),
                        "note": Field(str, "why it is unknown, or how to check it on a node", prose=True),
                    }
                ),
                "where each compute fact (os, glibc, python) comes from",
                key_pattern="|".join(SOURCED_FACTS),
            ),
            "cores_per_node": Field(int, minimum=1, maximum=MAX_CORES_PER_NODE),
            "memory_gb": Field(int, minimum=1, maximum=1024 * 1024),
            "interconnect": Field(str),
        },
        "facts of the compute partition the env is built for (not of the login node)",
        check=_unknown_problem,
    ),
    "scheduler": Table(
        {
            "type": Field(str, choices=SCHEDULERS),
            "interactive": Field(list, "argv template of the interactive allocation", items=str, whole=True),
            "batch": Field(str, "batch submit command (sbatch, qsub)"),
            "gpu_request": Field(str, "how a job asks for GPUs", choices=GPU_REQUEST_STYLES),
            "forbidden_flags": Field(list, "flags the site rejects, in any job text", items=str, rule=FLAG),
            "allowed_flags": Field(list, "if set, the only flags directives may carry", items=str, rule=FLAG),
            "required_flags": Field(list, "flags every job must carry", items=str, rule=DIRECTIVE),
            "partition": Field(str, "default partition/queue for validation jobs", rule=PARTITION.rule),
            "exclusive_nodes": Field(bool, "jobs get whole nodes (no --cpus-per-task needed)"),
            "time": Field(str, "default walltime", rule=TIME.rule),
            "account_required": Field(bool),
            "partitions": MapOf(
                Table(
                    {
                        "gpus_per_node": Field(int, minimum=0, maximum=MAX_GPUS_PER_NODE),
                        "max_nodes": Field(int, minimum=1, maximum=MAX_NODES),
                        "max_time": Field(str, rule=TIME.rule),
                        "dev": Field(bool, "a short-turnaround debug queue"),
                        "gpu": Field(str),
                        "gpu_vendor": Field(str, choices=GPU_VENDORS),
                        "gpu_arch": Field(str, pattern=GPU_ARCH, example="pvc"),
                        "cores_per_node": Field(int, minimum=1, maximum=MAX_CORES_PER_NODE),
                        "notes": Field(str, prose=True),
                    }
                ),
                key_pattern=SCHED_NAME_RE,
            ),
        }
    ),
    "modules": Table(
        {
            "system": Field(str, choices=MODULE_SYSTEMS),
            "use": Field(list, "paths for `module use`, in order", items=str, rule=NOT_AN_OPTION),
            "load": Field(
                list,
                "modules loaded for the build, in order; activation loads them too",
                items=str,
                rule=MODULE_NAME,
            ),
            "build_only": Field(
                list,
                "modules for the build only: loaded after `load` (cmake), or naming modules of `load` "
                "that activation leaves out",
                items=str,
                rule=MODULE_NAME,
            ),
        }
    ),
    "filesystems": MapOf(
        Table(
            {
                "path": Field(str, "path, may use ${VAR}", required=True),
                "purge_days": Field(
                    int, "files unread this many days may be purged", minimum=1, maximum=36500
                ),
                "touch_allowed": Field(
                    bool,
                    "the site permits refreshing access times to hold off the purge (envbuilder touch)",
                ),
                "quota": Field(str),
                "files_quota": Field(str),
                "quota_command": Field(
                    str,
                    "how pre-flight asks for your quota here: lfs (lfs quota -u USER PATH) or quota "
                    "(quota -w -f PATH)",
                    choices=QUOTA_TOOLS,
                ),
                "backed_up": Field(bool),
                "visible_on_compute": Field(bool),
                "notes": Field(str, prose=True),
            }
        ),
        "named file systems (scratch, work, home)",
        key_pattern=NAME_RE,
    ),
    "env_profiles": MapOf(
        Table(
            {
                "description": Field(str, prose=True),
                "set": MapOf(Field(str), key_pattern=VAR_RE),
                "unset": Field(list, items=str, rule=VAR_NAME),
                "prepend": MapOf(
                    Field(
                        list,
                        "directories put first, in order; deactivate takes exactly them out",
                        items=str,
                        rule=PATH_ENTRY,
                    ),
                    "colon-separated list variables (PATH, LD_LIBRARY_PATH) to prepend directories to",
                    key_pattern=VAR_RE,
                ),
                "append": MapOf(
                    Field(
                        list,
                        "directories put last, in order; deactivate takes exactly them out",
                        items=str,
                        rule=PATH_ENTRY,
                    ),
                    "colon-separated list variables to append directories to",
                    key_pattern=VAR_RE,
                ),
            }
        ),
        "named groups of environment variables (OMP, NCCL, HOROVOD); activate.profiles picks them",
        key_pattern=NAME_RE,
    ),
    "launcher": Table(
        {
            "default": Field(str, choices=tuple(launchers.LAUNCHERS)),
            "mpi": Field(str, "srun --mpi plugin (pmi2, pmix)", rule=MPI_PLUGIN.rule),
            "cpu_bind": Field(str, "mpiexec --cpu-bind value", rule=CPU_BIND.rule),
            "depth": Field(int, "mpiexec --depth (cores per rank)", minimum=1, maximum=MAX_CORES_PER_NODE),
            "gpu_affinity": Field(str, choices=GPU_AFFINITY),
            "port": Field(
                int,
                "rendezvous port shared by all nodes (default: one per job, from its number)",
                minimum=1,
                maximum=65535,
            ),
        }
    ),
}
