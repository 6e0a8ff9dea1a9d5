"""A container env's plan (pure): the image the recipe names, checked against the target like a wheel
(``resolver.images``), the runtime's commands that fetch it into one file under the prefix, how it runs (binds, GPU,
MPI), and the command create runs inside it to read the torch it holds (the build guard's idea: create never reports
an image whose torch is not the one planned)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from envbuilder.core import containers
from envbuilder.core.errors import RecipeError, UsageError
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.plan.prefix import expand
from envbuilder.plan.target import TargetFact
from envbuilder.recipe.siteschema import SOURCED_FACTS
from envbuilder.resolver import images, mirror
from envbuilder.resolver.matrix import Matrix, load_matrix

if TYPE_CHECKING:
    from envbuilder.recipe.loader import Recipe

#: What create runs inside the image: the torch it holds, and the system its python runs on (the os-release name,
#: the C library), as one JSON line (python's standard library and torch).
TORCH_PROBE = (
    "import json, platform, torch\n"
    "try:\n"
    "    rel = dict(l.rstrip('\\n').split('=', 1) for l in open('/etc/os-release') if '=' in l)\n"
    "except OSError:\n"
    "    rel = {}\n"
    "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda or '', "
    "'python': platform.python_version(), 'os': rel.get('PRETTY_NAME', '').strip().strip('\"'), "
    "'glibc': platform.libc_ver()[1], 'machine': platform.machine()}))"
)


#: What the overlay venv's python prints through it: the probe's facts, and where the torch it imports lives.
OVERLAY_PROBE = TORCH_PROBE.replace("import json,", "import json, os,").replace(
    "platform.machine()}", "platform.machine(), 'file': torch.__file__, 'path': os.environ.get('PATH', '')}"
)
#: What create runs inside the image to make the overlay venv at sys.argv[1] (the build's directory bound there):
#: a venv of the image's own python that sees its packages; where that python is a venv itself, whose packages
#: --system-site-packages would not reach (it reaches the base python's), a .pth adds them after the overlay's own.
OVERLAY_CREATE = (
    "import json, os, site, sys, sysconfig, venv\n"
    "dest = sys.argv[1]\n"
    "venv.EnvBuilder(system_site_packages=True, symlinks=True).create(dest)\n"
    "own = sysconfig.get_path('purelib', 'venv', vars={'base': dest, 'platbase': dest})\n"
    "parent = [p for p in site.getsitepackages() if os.path.isdir(p)] if sys.prefix != sys.base_prefix else []\n"
    "if parent:\n"
    "    with open(os.path.join(own, '_envbuilder_image_env.pth'), 'w') as f:\n"
    "        f.write(''.join(p + '\\n' for p in parent))\n"
    "print(json.dumps({'site': own, 'parent': parent}))\n"
)
#: The overlay venv's directory under the prefix, beside the image file.
OVERLAY_DIR = "venv"
#: Where the overlay's commands name the directory it is built in (create substitutes the partial env's): bound
#: at the overlay's final path inside the container, so that every path the venv and pip write is the final one.
BUILD_DIR = "{build}"
#: pip's options for the overlay (the image's pip, run by the overlay's python, installs into the overlay).
PIP_OPTIONS = ("--no-input", "--disable-pip-version-check", "--no-cache-dir", "--progress-bar", "off")
#: Where ch-run can make a bind's mount point (its /tmp is the host's, or its own with --private-tmp).
HOST_TMP = "/tmp"  # noqa: S108 (a path compared with, not a file made)
#: Where PyPI's simple index is (container.index = "pypi").
PYPI_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class Overlay:
    """Packages on top of the image: a venv of the image's python beside the image file, made and filled inside
    the container (the build directory bound at its final path), then checked: the torch seen through it must
    still be the image's."""

    path: str
    packages: tuple[str, ...]
    #: The index the recipe names, and where pip reads it (its site mirror's URLs and wheel directories, bound in).
    index: str
    sources: tuple[str, ...]
    #: The runtime's argv that makes the venv (OVERLAY_CREATE), installs the packages, and prints the torch seen
    #: through it (OVERLAY_PROBE); the image at ``{dest}``, the build directory at ``{build}``.
    create: tuple[str, ...]
    install: tuple[str, ...]
    probe: tuple[str, ...]

    @property
    def python(self) -> str:
        return f"{self.path}/bin/python"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "python": self.python,
            "packages": list(self.packages),
            "index": self.index,
            "sources": list(self.sources),
            "create": list(self.create),
            "install": list(self.install),
            "probe": list(self.probe),
        }


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
    #: The recipe's packages on top of the image (container.packages), None where it names none.
    overlay: Optional[Overlay] = None

    @property
    def python(self) -> str:
        """The python a command inside the image runs: the overlay venv's (its directory is among the binds), or
        the image's own python3."""
        return self.overlay.python if self.overlay else "python3"

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
            "python": self.python,
            "overlay": self.overlay.to_json() if self.overlay else None,
        }


#: Where the fetch commands and the probe name the image being made (create substitutes the partial file).
DEST = "{dest}"
#: The python a container env's ranks and programs run: the image's, on its PATH (the one create's probe read).
IMAGE_PYTHON = "python3"


def box_python(box: Mapping[str, Any]) -> str:
    """The python a container env's ranks and programs run inside its image: the overlay venv's where
    ``container.packages`` made one (the plan's ``container.python``), else the image's own."""
    return str(box.get("python") or IMAGE_PYTHON)


def image_path(prefix: str, tools: Mapping[str, Any]) -> str:
    """A container env's image file under its prefix (the record's ``image_file``)."""
    return f"{prefix}/{tools.get('image_file') or 'image.sif'}"


#: The image's PATH where its own is not recorded (an env made before create read it): the usual directories.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def entry_argv(box: Mapping[str, Any], prefix: str, tools: Mapping[str, Any]) -> tuple[str, ...]:
    """What a container env's shell function (``activate``, the modulefile) runs before its arguments: the
    runtime's exec of the image and, where container.packages made an overlay venv, ``env`` setting the overlay's
    bin before the image's PATH (the one create read inside) and VIRTUAL_ENV, so that ``python`` and the
    overlay's scripts are the overlay's and its packages import. ``env`` inside the image, not a runtime's
    option: each runtime passes PATH in its own way, and a shell's ``$PATH`` is not carried by csh's alias."""
    argv = exec_prefix(box, image_path(prefix, tools))
    overlay = box.get("overlay") or {}
    if not overlay.get("path"):
        return argv
    venv = str(overlay["path"])
    image = str(tools.get("image_env_path") or DEFAULT_PATH)
    return (*argv, "env", f"PATH={venv}/bin:{image}", f"VIRTUAL_ENV={venv}")


def image_target_facts(facts: images.ImageFacts) -> tuple[TargetFact, ...]:
    """A container env's target facts (os, glibc, python): its image's, since its programs run on them and not on
    the node's, where the image table or the image's labels state them; else unknown until create reads them
    inside the image."""
    out = []
    for name in SOURCED_FACTS:
        value = getattr(facts, name)
        if value:
            out.append(
                TargetFact(name, str(value), "image", f"the image's ({facts.origins.get(name, 'stated')})")
            )
        else:
            out.append(
                TargetFact(
                    name,
                    None,
                    "unknown",
                    "the image's: neither the table nor its labels say; create reads it inside",
                )
            )
    return tuple(out)


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
    layer = _overlay(recipe, runtime, prefix, env) if spec.packages else None
    if layer is not None and not any(_under(layer.path, bind.split(":", 1)[0]) for bind in binds):
        # Seen inside at its own path, where its scripts and pyvenv.cfg say it is.
        binds = (*binds, layer.path)
    if (
        layer is not None
        and isinstance(runtime, containers.Charliecloud)
        and not _under(layer.path, HOST_TMP)
    ):
        warnings.append(
            f"ch-run makes no mount point in a read-only image: the overlay venv {layer.path} is bound at its own "
            "path, which must be a directory in the image (or lie under /tmp); apptainer makes it"
        )
    return ContainerPlan(
        pick=pick,
        runtime=runtime.name,
        file=file,
        fetch=tuple(tuple(c) for c in runtime.fetch(source, DEST)),
        binds=binds,
        overlay=layer,
        gpu=gpu,
        mpi=spec.mpi,
        probe=tuple(runtime.exec(DEST, ["python3", "-c", TORCH_PROBE], gpu=False)),
        mirror=source.name if source != ref else "",
    )


def _overlay(recipe: Recipe, runtime: containers.Runtime, prefix: str, env: Mapping[str, str]) -> Overlay:
    """The overlay venv of ``recipe``'s container.packages, under ``prefix`` beside the image file, installed from
    container.index or the site's mirror of it (ENVBUILDER_INDEX_MIRROR, as for a venv's packages)."""
    path = f"{prefix}/{OVERLAY_DIR}"
    if containers.bind_problem(path) is not None:  # bound by its path: a comma or colon would split it
        raise RecipeError(
            f"container.packages go into an overlay venv at {path}, which a runtime cannot bind: the prefix must "
            "be a plain absolute path (letters, digits, ._/+@%- only)",
            key="env.prefix",
            hint="choose a prefix without spaces, commas or colons, or drop container.packages",
        )
    spec = recipe.container
    index = PYPI_SIMPLE if spec.index == "pypi" else spec.index
    urls, dirs = mirror.sources_for(index, mirror.from_env(env))
    python = f"{path}/bin/python"
    # A wheel directory or file:// index of the mirror is seen inside at its own path.
    seen = [*dirs, *(u[len("file://") :].rstrip("/") for u in urls if u.startswith("file://"))]
    for where in seen:
        if containers.bind_problem(where) is not None:
            raise UsageError(
                f"{mirror.VAR}: the wheel directory {where} cannot be bound into the container for "
                "container.packages (a comma, colon or space would split the bind)",
                hint="name a directory with a plain absolute path",
            )
    binds = [f"{BUILD_DIR}:{path}", *dict.fromkeys(seen)]

    def inside(argv: list[str]) -> tuple[str, ...]:
        # A clean environment without the user's site directory: nothing of the host's satisfies a requirement.
        return tuple(runtime.exec(DEST, argv, binds=binds, env={"PYTHONNOUSERSITE": "1"}, contain=True))

    reads = ["--index-url", urls[0]] if urls else ["--no-index"]
    reads += [arg for url in urls[1:] for arg in ("--extra-index-url", url)]
    reads += [arg for d in dirs for arg in ("--find-links", d)]
    install = [python, "-m", "pip", "install", *PIP_OPTIONS, *reads, "--", *spec.packages]
    return Overlay(
        path=path,
        packages=spec.packages,
        index=index,
        sources=tuple(dict.fromkeys([*urls, *dirs])),
        create=inside(["python3", "-c", OVERLAY_CREATE, path]),
        install=inside(install),
        probe=inside([python, "-c", OVERLAY_PROBE]),
    )


def _reads(layer: Overlay) -> str:
    """Where the overlay's packages come from, for people: the index, or its mirror naming what it stands for."""
    if layer.sources == (layer.index,):
        return layer.index
    return f"{', '.join(layer.sources)} (mirror of {layer.index}, {mirror.VAR})"


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


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
    if plan.overlay is not None:
        steps += _overlay_steps(plan.overlay, plan.file)
    steps.append(f"record the image's sha256 in the env's record at {prefix}")
    return steps


def _overlay_steps(layer: Overlay, image: str) -> list[str]:
    """The overlay's steps, in words and as the commands create runs."""

    def shown(argv: Sequence[str], code: str = "") -> str:
        built = [image if a == DEST else a.replace(BUILD_DIR, "<build>") for a in argv]
        return (
            shlex.join(built[:-2]) + f" '<{code}>' " + shlex.quote(built[-1]) if code else shlex.join(built)
        )

    return [
        f"make an overlay venv of the image's python at {layer.path} (built beside it, bound there inside the "
        "image; it sees the image's packages)",
        shown(layer.create, "overlay"),
        f"install {', '.join(layer.packages)} into it from {_reads(layer)} with the image's pip",
        shown(layer.install),
        "check that the torch seen through the overlay is still the image's (a package that brings another torch "
        "is refused)",
    ]
