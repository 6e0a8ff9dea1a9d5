"""Typed views of a loaded recipe, and the recipe language's defaults, each in one place.

Code reads a recipe as ``recipe.torch.version`` or ``recipe.validation.checks``: each table of the schema has a
frozen dataclass here, filled from the merged recipe by :func:`view`, and a field's default is the language's
default. Defaults made with :func:`seeded` are also the table every recipe starts from (the loader merges the
files over :func:`seed`, so ``show --explain`` names them ``<defaults>``); the others apply where a recipe leaves
the key out. The schema (``schema.SCHEMA``) has checked every value before it gets here; a unit test keeps the
views and the schema in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, fields
from typing import Any, ClassVar, Optional, Protocol, TypeVar

from envbuilder.core.checks import DEFAULTS as DEFAULT_CHECKS
from envbuilder.core.containers import DEFAULT_RUNTIME
from envbuilder.core.kinds import AUTO
from envbuilder.core.structs import dataclass

_SEED = "seed"
#: The view of each value of a table of tables, or of each item of an array of tables.
_OF = "of"

#: The python a conda env gets where the recipe names no version (conda installs it; no site module decides).
CONDA_PYTHON = "3.12"


class _View(Protocol):
    __dataclass_fields__: ClassVar[dict[str, Any]]


V = TypeVar("V", bound=_View)


def seeded(default: Any) -> Any:
    """A default every recipe starts from (listed as ``<defaults>``)."""
    return field(default=default, metadata={_SEED: True})


def _seeded_table() -> Any:
    return field(default_factory=dict, metadata={_SEED: True})


def _table(of: Optional[type] = None) -> Any:
    return field(default_factory=dict, metadata={_OF: of} if of else {})


def _array(of: type) -> Any:
    return field(default=(), metadata={_OF: of})


def view(cls: type[V], table: Mapping[str, Any]) -> V:
    """``cls`` read from one table of a merged recipe: arrays become tuples, tables of tables their views."""
    values = {f.name: _value(table[f.name], f.metadata.get(_OF)) for f in fields(cls) if f.name in table}
    return cls(**values)


def _value(value: Any, of: Optional[type[_View]]) -> Any:
    if of is not None and isinstance(value, Mapping):
        return {key: view(of, item) for key, item in value.items()}
    if isinstance(value, list):
        return tuple(view(of, item) if of else item for item in value)
    return value


# ---------------------------------------------------------------------------------------------------------------
# The tables, in the schema's order


@dataclass(frozen=True)
class About:
    """[recipe]"""

    name: str = ""
    description: str = ""
    version: Optional[str] = None
    experimental: bool = False
    example: bool = False


@dataclass(frozen=True)
class Correction:
    """[[corrections]]: where a recipe departs from its source document."""

    seed: str
    fix: str
    source: Optional[str] = None

    def to_json(self) -> dict[str, str]:
        out = {"seed": self.seed, "fix": self.fix}
        if self.source is not None:
            out["source"] = self.source
        return out


@dataclass(frozen=True)
class Site:
    name: Optional[str] = None
    center: Optional[str] = None
    title: Optional[str] = None
    status: str = "active"
    retired_on: Optional[str] = None
    validatable: bool = True
    document: Optional[str] = None
    document_date: Optional[str] = None
    notes: Optional[str] = None


@dataclass(frozen=True)
class FactSource:
    """[compute.sources.FACT]: where a compute fact was read, the day it was checked, and a note."""

    source: str = ""
    checked: str = ""
    note: Optional[str] = None


@dataclass(frozen=True)
class Compute:
    """Facts of the compute partition the env is built for; unset where the site file does not say. ``os``,
    ``glibc`` and ``python`` may be "unknown": the site says it does not know (``sources`` says why)."""

    arch: Optional[str] = None
    gpus_per_node: Optional[int] = None
    gpu: Optional[str] = None
    compute_capability: Optional[str] = None
    driver_version: Optional[str] = None
    max_cuda: Optional[str] = None
    #: AMD and Intel GPU nodes (issue 41): the vendor, the gfx target or device family, and the driver facts.
    gpu_vendor: Optional[str] = None
    gpu_arch: Optional[str] = None
    amdgpu_version: Optional[str] = None
    level_zero: Optional[str] = None
    os: Optional[str] = None
    glibc: Optional[str] = None
    python: Optional[str] = None
    sources: Mapping[str, FactSource] = _table(FactSource)
    cores_per_node: Optional[int] = None
    memory_gb: Optional[int] = None
    interconnect: Optional[str] = None


@dataclass(frozen=True)
class Partition:
    gpus_per_node: Optional[int] = None
    max_nodes: Optional[int] = None
    max_time: Optional[str] = None
    dev: bool = False
    gpu: Optional[str] = None
    gpu_vendor: Optional[str] = None
    gpu_arch: Optional[str] = None
    cores_per_node: Optional[int] = None
    notes: Optional[str] = None


@dataclass(frozen=True)
class Scheduler:
    type: str = seeded("none")
    interactive: tuple[str, ...] = ()
    batch: Optional[str] = None
    gpu_request: str = "gpus-per-node"
    forbidden_flags: tuple[str, ...] = ()
    allowed_flags: tuple[str, ...] = ()
    required_flags: tuple[str, ...] = ()
    partition: Optional[str] = None
    exclusive_nodes: bool = False
    time: str = "00:30:00"
    account_required: bool = False
    partitions: Mapping[str, Partition] = _table(Partition)


@dataclass(frozen=True)
class Modules:
    system: str = seeded("none")
    use: tuple[str, ...] = seeded(())
    load: tuple[str, ...] = seeded(())
    build_only: tuple[str, ...] = seeded(())


@dataclass(frozen=True)
class Filesystem:
    """A [filesystems] entry."""

    path: str
    purge_days: Optional[int] = None
    touch_allowed: Optional[bool] = None
    quota: Optional[str] = None
    files_quota: Optional[str] = None
    #: How the user's quota there is asked for (core.space.QUOTA_TOOLS: "lfs", "quota"); None: not asked.
    quota_command: Optional[str] = None
    backed_up: Optional[bool] = None
    visible_on_compute: Optional[bool] = None
    notes: Optional[str] = None


@dataclass(frozen=True)
class Profile:
    """An [env_profiles] entry: variables activate sets and unsets, and directories it puts first or last in
    colon-separated list variables."""

    description: Optional[str] = None
    set: Mapping[str, str] = _table()
    unset: tuple[str, ...] = ()
    prepend: Mapping[str, list[str]] = _table()
    append: Mapping[str, list[str]] = _table()


@dataclass(frozen=True)
class Launcher:
    default: str = seeded("torchrun")
    mpi: Optional[str] = None
    cpu_bind: Optional[str] = None
    depth: Optional[int] = None
    gpu_affinity: str = seeded("none")
    port: Optional[int] = None  # None: each job its own (launchers.job_port)


@dataclass(frozen=True)
class Env:
    kind: str = seeded("venv")
    installer: str = seeded("uv")
    prefix: str = seeded("${SCRATCH}/envbuilder/envs/{name}")
    system_site_packages: bool = seeded(False)
    filesystem: Optional[str] = None
    overlay: str = "venv"


@dataclass(frozen=True)
class Container:
    """[container] (env.kind = "container")"""

    image: Optional[str] = None
    runtime: str = DEFAULT_RUNTIME
    #: None: the site's file systems that compute nodes see.
    binds: Optional[tuple[str, ...]] = None
    #: None: on where the target has NVIDIA GPUs.
    gpu: Optional[bool] = None
    mpi: str = "host"
    allow: tuple[str, ...] = ()
    #: Requirements installed into an overlay venv on top of the image's python; the index they come from.
    packages: tuple[str, ...] = ()
    index: str = "pypi"


@dataclass(frozen=True)
class Python:
    command: str = seeded("python3")
    version: Optional[str] = None
    #: ``site`` (``command`` on the modules' PATH) or ``managed`` (a uv-managed CPython of ``version``).
    source: str = "site"

    @property
    def managed(self) -> bool:
        return self.source == "managed"

    @property
    def conda_version(self) -> str:
        """The python a conda env of this recipe gets."""
        return self.version or CONDA_PYTHON


@dataclass(frozen=True)
class Conda:
    channels: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    engine: str = AUTO


@dataclass(frozen=True)
class Torch:
    install: bool = seeded(True)
    version: str = seeded("latest")
    variant: str = seeded("auto")
    channel: str = seeded("stable")
    packages: tuple[str, ...] = seeded(("torch", "torchvision", "torchaudio"))
    torchvision: Optional[str] = None
    torchaudio: Optional[str] = None
    allow: tuple[str, ...] = seeded(())


@dataclass(frozen=True)
class Package:
    """A [[packages]] entry."""

    name: str
    spec: Optional[str] = None
    index: Optional[str] = None
    build_env: Mapping[str, str] = _table()
    build_env_prepend: Mapping[str, list[str]] = _table()
    no_build_isolation: bool = False
    no_binary: bool = False
    build_modules: tuple[str, ...] = ()
    note: Optional[str] = None

    @property
    def requirement(self) -> str:
        """What the installer is handed: the spec, else the name."""
        return self.spec or self.name

    @property
    def own_step(self) -> bool:
        """Needs its own index, build settings or a source build: installed on its own, after the resolver's
        set (and outside any lock)."""
        return bool(
            self.build_env
            or self.build_env_prepend
            or self.no_build_isolation
            or self.no_binary
            or self.index
            or self.build_modules
        )

    @property
    def built_for_env(self) -> bool:
        """Built from source with what this build has (its modules, build settings or the env's own packages): an
        installer's cache may hold a build of it made for another env, which must not be used."""
        return bool(
            self.build_env
            or self.build_env_prepend
            or self.no_build_isolation
            or self.no_binary
            or self.build_modules
        )


@dataclass(frozen=True)
class Activate:
    modules: tuple[str, ...] = seeded(())
    env: Mapping[str, str] = _seeded_table()
    profiles: tuple[str, ...] = seeded(())
    conda_env: Optional[str] = None


@dataclass(frozen=True)
class Validation:
    checks: tuple[str, ...] = seeded(DEFAULT_CHECKS)
    nodes: int = seeded(1)
    nproc_per_node: Optional[int] = None
    partition: Optional[str] = None
    time: Optional[str] = None
    launcher: Optional[str] = None
    timeout: Optional[int] = None
    filesystems: tuple[str, ...] = ()
    #: Handed to the report as written (it shows each one beside the figure it bounds).
    references: tuple[Mapping[str, Any], ...] = ()
    #: A figure this fraction worse than its history's median fails the run (None: drift is only reported).
    drift_threshold: Optional[float] = None


#: The tables with seeded defaults, in the order a recipe's values list them.
SEEDED: tuple[tuple[str, type[_View]], ...] = (
    ("env", Env),
    ("python", Python),
    ("modules", Modules),
    ("scheduler", Scheduler),
    ("torch", Torch),
    ("launcher", Launcher),
    ("activate", Activate),
    ("validation", Validation),
)


def seed() -> dict[str, Any]:
    """The values every recipe starts from, as TOML would hold them (arrays as lists)."""
    out: dict[str, Any] = {}
    for name, cls in SEEDED:
        table = out[name] = {}
        for f in fields(cls):
            if f.metadata.get(_SEED):
                value = f.default_factory() if callable(f.default_factory) else f.default
                table[f.name] = list(value) if isinstance(value, tuple) else value
    return out
