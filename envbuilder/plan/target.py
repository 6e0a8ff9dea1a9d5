"""The machine an env is for (pure): the site's compute partition, refined by this host where it is such a node.
``plan`` resolves wheels for it; ``validate`` sizes its launch by it."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Optional

from envbuilder.core.facts import Gpu, HostFacts
from envbuilder.core.kinds import kind_info
from envbuilder.core.structs import dataclass
from envbuilder.recipe import sections
from envbuilder.recipe.siteschema import SOURCED_FACTS, UNKNOWN
from envbuilder.resolver.matrix import gpu_capability

if (
    TYPE_CHECKING
):  # only named: the loader reaches the registry (ssh-keygen), which a pure module must not import
    from envbuilder.recipe.loader import Recipe


def target_facts(
    recipe: Recipe,
    host: HostFacts,
    warnings: list[str],
    notes: list[str],
    *,
    arch_override: Optional[str] = None,
    partition: Optional[str] = None,
    node: bool = False,
) -> HostFacts:
    """The machine the env is for: the site's compute partition, refined by the host when it is such a node.
    ``arch_override`` plans for nodes of another architecture (a lock for them), whatever this host is;
    ``partition`` for the nodes of that partition; ``node``: ``host`` is a compute node's own facts (a node
    after a planned change, for ``impact``), so its glibc is the target's whatever the site file says."""
    compute = partition_compute(recipe, partition, warnings)
    python = env_python(recipe, host, compute)[0]
    if arch_override:
        host = replace(host, arch=arch_override, glibc=None if host.arch != arch_override else host.glibc)
        if compute.arch and compute.arch != arch_override:
            notes.append(f"planned for {arch_override} nodes; the site's compute nodes are {compute.arch}")
            compute = replace(compute, arch=None, glibc=None)
    if compute == sections.Compute():
        return replace(host, python=python, source=f"{host.source} (no site: this host is the target)")
    arch = compute.arch or host.arch
    if host.arch and arch and host.arch != arch:
        warnings.append(
            f"this host is {host.arch} but {recipe.site.name or 'the site'}'s compute nodes are {arch}: "
            f"create must run on an {arch} node"
        )
    gpu_name = "GPU" if compute.gpu is None else compute.gpu
    site_gpus: Optional[tuple[Gpu, ...]] = None
    if compute.gpus_per_node is not None:
        site_gpus = tuple(_site_gpu(compute, gpu_name) for _ in range(compute.gpus_per_node))
    site_vendor = compute.gpu_vendor or "nvidia"
    if host.gpus and site_gpus and host.gpu_vendor != site_vendor:
        # Not one of the site's GPU nodes (an NVIDIA host planning for Intel or AMD nodes, or the reverse).
        warnings.append(
            f"this host's GPUs are {host.gpu_vendor}'s ({host.gpus[0].name}) but the site's compute nodes have "
            f"{site_vendor}'s ({gpu_name}): resolving for the site's; create must run on such a node"
        )
        host = replace(host, gpus=None)
    if host.gpus:
        gpus: Optional[tuple[Gpu, ...]] = host.gpus
        driver, max_cuda = host.driver_version, host.max_cuda
        if site_gpus and compute.compute_capability:
            host_cc = gpu_capability(host.gpus[0])
            if host_cc and host_cc != compute.compute_capability:
                warnings.append(
                    f"this host's GPU ({host.gpus[0].name}, {host_cc}) differs from the site's compute GPU "
                    f"({compute.gpu}, {compute.compute_capability}); resolving for this host"
                )
        notes.append(f"target: this host's {len(host.gpus)} GPU(s) and driver")
    else:
        gpus = site_gpus
        driver, max_cuda = compute.driver_version, compute.max_cuda
        if site_gpus:
            why = "has no GPU" if host.gpus is not None else "has no visible GPU"
            notes.append(
                f"target: the compute partition ({len(site_gpus)}× {gpu_name}), not this host, which {why}"
            )
    same_os = not host.arch or host.arch == arch
    return HostFacts(
        arch=arch,
        glibc=_glibc(recipe, host, same_os, warnings, node),
        python=python,
        driver_version=driver,
        max_cuda=max_cuda,
        gpus=gpus,
        amdgpu_version=host.amdgpu_version if host.gpus else compute.amdgpu_version,
        level_zero=host.level_zero if host.gpus else compute.level_zero,
        hostname=host.hostname,
        module_system=host.module_system,
        scheduler=host.scheduler,
        allocation=host.allocation,
        filesystems=host.filesystems,
        source=f"site compute facts + {host.source}",
    )


def _site_gpu(compute: sections.Compute, name: str) -> Gpu:
    """One GPU of the site's compute nodes: NVIDIA's by its compute capability, AMD's or Intel's by its gfx target
    or device family (the site's compute_capability, set for another partition, does not apply to them)."""
    if compute.gpu_vendor in ("amd", "intel"):
        return Gpu(name, vendor=compute.gpu_vendor, arch=compute.gpu_arch)
    return Gpu(name, compute.compute_capability)


def _glibc(recipe: Recipe, host: HostFacts, same_os: bool, warnings: list[str], node: bool) -> Optional[str]:
    """The target's glibc: on a compute node (this host, probed inside a job) the node's own, whatever the site
    file says (a file that disagrees is out of date, and is named); elsewhere the site's, else this host's."""
    said = stated(recipe.compute.glibc)
    if not same_os:
        return said
    if host.glibc and node:
        return host.glibc
    if host.glibc and on_a_node(host):
        if said and said != host.glibc:
            warnings.append(
                f"{recipe.site.name or 'the site'}'s compute.glibc {said} is not this node's: this node "
                f"({host.hostname or 'here'}) has glibc {host.glibc}, which the plan uses; correct the site file"
            )
        return host.glibc
    return said or host.glibc


def on_a_node(host: HostFacts) -> bool:
    """Whether ``host`` is this machine probed inside a job: a compute node, whose own facts are the target's."""
    return host.source == "probe" and bool(host.allocation)


def env_python(
    recipe: Recipe, host: HostFacts, compute: Optional[sections.Compute] = None
) -> tuple[Optional[str], str]:
    """The Python the env runs, decided once for the resolver (torch's wheels), the build (a conda env's
    ``python=X.Y``) and the lock, and where it came from: the recipe's ``[python] version``; else, for a conda
    env, the one its engine is asked for (the env brings its own python: the planning host's is not it); else
    the compute nodes' python the site states; else the python this host runs."""
    if recipe.python.version:
        return recipe.python.version, "the recipe's [python] version"
    if kind_info(recipe.env.kind).conda:
        return (
            recipe.python.conda_version,
            "envbuilder's default for a conda env (the recipe sets no [python] version)",
        )
    said = stated((compute or recipe.compute).python)
    if said:
        return said, "the site's compute.python (the recipe sets no [python] version)"
    return host.python, f"this host's {recipe.python.command} (the recipe sets no [python] version)"


def partition_compute(recipe: Recipe, partition: Optional[str], warnings: list[str]) -> sections.Compute:
    """The compute facts of ``partition``'s nodes: the site's, with the GPUs and cores the partition's entry
    gives (gpu1h100 has one GPU where the site's default partition has two)."""
    compute = recipe.compute
    if not partition:
        return compute
    part = recipe.scheduler.partitions.get(partition)
    if part is None:
        if recipe.scheduler.partitions:
            known = ", ".join(recipe.scheduler.partitions)
            warnings.append(
                f"partition {partition} is not one the recipe describes ({known}): site facts used"
            )
        return compute
    return replace(
        compute,
        gpus_per_node=compute.gpus_per_node if part.gpus_per_node is None else part.gpus_per_node,
        gpu=part.gpu or compute.gpu,
        gpu_vendor=part.gpu_vendor or compute.gpu_vendor,
        gpu_arch=part.gpu_arch or compute.gpu_arch,
        cores_per_node=part.cores_per_node or compute.cores_per_node,
    )


def stated(value: Optional[str]) -> Optional[str]:
    """A compute fact the site states: None where it is unset or "unknown"."""
    return None if value == UNKNOWN else value


# ---------------------------------------------------------------------------------------------------------------
# Where each of the target's OS facts came from: the site, the recipe, or the host that plans


@dataclass(frozen=True)
class TargetFact:
    """One of the target's facts (os, glibc, python), its value and where it came from: ``origin`` is "site",
    "recipe", "host" (the machine that plans, which may not be a compute node), "node" (this host, inside a job:
    a compute node), "facts" (a ``--facts`` file) or "unknown"; ``detail`` says it in words."""

    name: str
    value: Optional[str]
    origin: str
    detail: str

    @property
    def from_host(self) -> bool:
        return self.origin == "host"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "origin": self.origin, "detail": self.detail}


def fact_origins(recipe: Recipe, host: HostFacts, target: HostFacts) -> tuple[TargetFact, ...]:
    """Where the target's os, glibc and python came from; nothing where the recipe names no site (this host is
    the target then, and says so)."""
    compute = recipe.compute
    if compute == sections.Compute():
        return ()
    values = {"os": None, "glibc": target.glibc, "python": target.python}
    return tuple(_origin(fact, values[fact], recipe, host) for fact in SOURCED_FACTS)


def _origin(fact: str, value: Optional[str], recipe: Recipe, host: HostFacts) -> TargetFact:
    compute = recipe.compute
    said: Optional[str] = getattr(compute, fact)
    src = compute.sources.get(fact)
    chosen = _recipe_python(value, recipe) if fact == "python" else None
    if chosen:
        return chosen
    if stated(said) and (fact == "os" or value == said):
        cited = f"{src.source}, checked {src.checked}" if src else "no source given"
        return TargetFact(fact, said, "site", f"the site's ({cited})")
    why = (
        f"the site does not know it: {src.note}" if said == UNKNOWN and src else "the site does not state it"
    )
    if stated(said):  # and this node has another
        why = f"the site states {said}, which is not this node's"
    if value is None:
        return TargetFact(fact, None, "unknown", why)
    if host.source != "probe":
        return TargetFact(fact, value, "facts", f"from the facts file {host.source}; {why}")
    if on_a_node(host):
        return TargetFact(fact, value, "node", f"this node's, inside a job; {why}")
    return TargetFact(fact, value, "host", f"from this host, which may not be a compute node; {why}")


def _recipe_python(value: Optional[str], recipe: Recipe) -> Optional[TargetFact]:
    """The python fact where the recipe decides it: its [python] version, or a conda env's own default."""
    if recipe.python.version:
        return TargetFact(
            "python", value, "recipe", f"python.version in {recipe.source_of('python.version')}"
        )
    if kind_info(recipe.env.kind).conda:
        return TargetFact(
            "python", value, "recipe", "envbuilder's default for a conda env (no [python] version)"
        )
    return None


#: What a gate decides with each fact, for its warning.
_GATES = {
    "glibc": (
        "the glibc gate (manylinux wheels)",
        "run `ldd --version` on a compute node and set compute.glibc in the site file",
    ),
    "python": (
        "the Python gate (which torch releases have wheels for it)",
        "set python.version in the recipe, or compute.python in the site file",
    ),
}


def host_fact_warnings(origins: tuple[TargetFact, ...], resolved: bool) -> list[str]:
    """A warning for each gate of the torch resolution (``resolved``) decided on a fact of the planning host."""
    if not resolved:
        return []
    return [
        f"{_GATES[o.name][0]} was decided on this host's {o.name} {o.value}: the site does not state its compute "
        f"nodes' {o.name}, and this host may not be one; {_GATES[o.name][1]}"
        for o in origins
        if o.from_host and o.name in _GATES
    ]
