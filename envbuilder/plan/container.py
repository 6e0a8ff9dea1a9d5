"""A container env's plan (pure): the image the recipe names, checked against the target like a wheel
(``resolver.images``), the runtime's commands that fetch it into one file under the prefix, how it runs (binds, GPU,
MPI), and the command create runs inside it to read the torch it holds (the build guard's idea: create never reports
an image whose torch is not the one planned)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from envbuilder.core import containers
from envbuilder.core.errors import RecipeError
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.plan.prefix import expand
from envbuilder.resolver import images
from envbuilder.resolver.matrix import Matrix, load_matrix

if TYPE_CHECKING:
    from envbuilder.recipe.loader import Recipe

#: What create runs inside the image: the torch it holds, as one JSON line (python's standard library and torch).
TORCH_PROBE = (
    "import json, platform, torch; print(json.dumps({'torch': torch.__version__, "
    "'cuda': torch.version.cuda or '', 'python': platform.python_version(), 'machine': platform.machine()}))"
)


@dataclass(frozen=True)
class ContainerPlan:
    """How a container env is made and run."""

    pick: images.ImagePick
    runtime: str
    #: The one image file under the prefix, and the commands that make it (``{dest}`` where the file goes: create
    #: fetches beside the prefix and renames it in). No commands: the local image is copied as it is.
    file: str
    fetch: tuple[tuple[str, ...], ...]
    binds: tuple[str, ...]
    gpu: bool
    mpi: str
    #: The runtime's argv that prints the torch inside (TORCH_PROBE), on the image at ``{dest}``.
    probe: tuple[str, ...]
    #: The manifest digest the registry gave for the reference when the plan was made ("" where it was not read).
    registry_digest: str = ""
    #: Where it is fetched from when a site mirror (ENVBUILDER_REGISTRY_MIRROR) stands in for its registry.
    mirror: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            **self.pick.to_json(),
            "runtime": self.runtime,
            "file": self.file,
            "fetch": [list(c) for c in self.fetch],
            "binds": list(self.binds),
            "gpu": self.gpu,
            "mpi": self.mpi,
            "probe": list(self.probe),
            "registry_digest": self.registry_digest or None,
            "mirror": self.mirror or None,
        }


#: Where the fetch commands and the probe name the image being made (create substitutes the partial file).
DEST = "{dest}"
#: The python a container env's ranks and programs run: the image's, on its PATH (the one create's probe read).
IMAGE_PYTHON = "python3"


def image_path(prefix: str, tools: Mapping[str, Any]) -> str:
    """A container env's image file under its prefix (the record's ``image_file``)."""
    return f"{prefix}/{tools.get('image_file') or 'image.sif'}"


def exec_prefix(
    box: Mapping[str, Any],
    image: str,
    *,
    binds: Sequence[str] = (),
    read_only: Sequence[str] = (),
    gpu: bool = True,
) -> tuple[str, ...]:
    """The runtime's argv that runs what follows it inside ``image`` (a container env's, as its record's
    ``container`` entry ``box`` says: runtime, binds, GPU): the recipe's binds, then ``binds`` and ``read_only``
    (what the launch needs from the host: the payload's directory read-only, where its ranks write), the GPU flag where the env is for GPUs and ``gpu``.
    The host's environment passes in (Apptainer's default): a launcher's rank variables (srun's, MPI's PMI)
    and the activation's reach the ranks."""
    runtime = containers.runtime(str(box.get("runtime") or containers.DEFAULT_RUNTIME))
    recorded = [str(b) for b in box.get("binds") or ()]
    argv = runtime.exec(
        image,
        [],
        binds=list(dict.fromkeys([*recorded, *binds, *(runtime.read_only(p) for p in read_only)])),
        gpu=bool(box.get("gpu")) and gpu and runtime.gpu_flag,
        cleanenv=False,
    )
    return tuple(argv)


def container_plan(
    recipe: Recipe,
    target: HostFacts,
    env: Mapping[str, str],
    prefix: str,
    warnings: list[str],
    *,
    image: Optional[images.ImageFacts] = None,
    matrix: Optional[Matrix] = None,
) -> ContainerPlan:
    """The plan's container part; ``image`` is what the registry said of the image (its labels and platforms),
    None where it was not asked. Raises RecipeError without an image, ResolverErrors on a failed gate."""
    spec = recipe.container
    if not spec.image:  # the loader refuses such a recipe; a Recipe made some other way meets this
        raise RecipeError(
            'env.kind = "container" needs the image it is: container.image is not set',
            key="container.image",
            hint=containers.IMAGE_EXAMPLE,
        )
    ref = containers.parse_image(spec.image)
    facts = images.table_facts(ref, images.load_table())
    if image is not None:
        facts = images.merged(facts, image)
    pick = images.pick(ref, facts, target, matrix or load_matrix(), frozenset(spec.allow))
    warnings.extend(pick.warnings)
    runtime = containers.runtime(spec.runtime)
    source = containers.mirrored(ref, containers.registry_mirrors(env))
    binds = _binds(recipe, env, warnings)
    gpu = spec.gpu if spec.gpu is not None else bool(target.gpus)
    if gpu and not runtime.gpu_flag:
        warnings.append(
            f"{runtime.name} has no GPU flag: the image must carry the host's driver libraries (ch-fromhost --nvidia)"
        )
    file = f"{prefix}/{runtime.image_file}"
    return ContainerPlan(
        pick=pick,
        runtime=runtime.name,
        file=file,
        fetch=tuple(tuple(c) for c in runtime.fetch(source, DEST)),
        binds=binds,
        gpu=gpu,
        mpi=spec.mpi,
        probe=tuple(runtime.exec(DEST, ["python3", "-c", TORCH_PROBE], gpu=False)),
        mirror=source.name if source != ref else "",
    )


def _binds(recipe: Recipe, env: Mapping[str, str], warnings: list[str]) -> tuple[str, ...]:
    """The recipe's binds, else its file systems that compute nodes see, with their variables expanded."""
    spec = recipe.container.binds
    if spec is None:
        spec = tuple(fs.path for fs in recipe.filesystems.values() if fs.visible_on_compute is not False)
    out = []
    for bind in spec:
        text, missing = expand(bind, env, recipe.name)
        if missing or containers.bind_problem(text) is not None:
            why = f"${missing[0]} is not set" if missing else "its value is not a plain absolute path"
            warnings.append(f"bind {bind} left out: {why}")
            continue
        out.append(text)
    return tuple(dict.fromkeys(out))


def steps_in_words(plan: ContainerPlan, prefix: str) -> list[str]:
    """A container env's steps, as ``envbuilder plan`` lists them."""
    mirror = f" from the site mirror {plan.mirror}" if plan.mirror else ""
    steps = [
        f"fetch {plan.pick.ref.text}{mirror} with {plan.runtime} into a temporary sibling of {plan.file}; move it "
        "into place once complete"
    ]
    shown = [[plan.file if arg == DEST else arg for arg in c] for c in (*plan.fetch, plan.probe[:-1])]
    steps += [shlex.join(c) for c in shown[:-1]] or [f"copy {plan.pick.ref.path} as it is"]
    steps.append(f"read the torch inside: {shlex.join(shown[-1])} '<probe>'")
    steps.append(f"record the image's sha256 in the env's record at {prefix}")
    return steps
