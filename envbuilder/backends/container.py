"""A container env (env.kind = "container"): one image file under the prefix that a container runtime fetched
(pulled from a registry, or converted or copied from a local image), and the torch inside it read back through the
runtime before the env is put in place: an image whose torch, CUDA, Python or machine is not what the plan checked
is refused, as the torch build guard refuses a wheel (``torchbuild``). The file's sha256 goes into the record.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from envbuilder import __version__
from envbuilder.backends.base import Backend, Build
from envbuilder.backends.buildlog import run_logged
from envbuilder.backends.torchbuild import metadata_name_version
from envbuilder.core import containers
from envbuilder.core.errors import BackendError, CommandFailed, NetworkError
from envbuilder.plan import ContainerPlan
from envbuilder.plan.container import BUILD_DIR, DEST, OVERLAY_DIR, Overlay
from envbuilder.plan.steps import InstallStep
from envbuilder.resolver import images
from envbuilder.system import removal, transaction

#: How long the probe inside the image may take (its first start unpacks nothing, but a cold file system is slow).
PROBE_TIMEOUT_S = 600.0


class ContainerBackend(Backend):
    """Fetches the plan's image into the env and checks the torch inside."""

    def __init__(
        self,
        system_site_packages: bool = False,
        arch: str = "",
        locked: Optional[Mapping[str, str]] = None,
        box: Optional[ContainerPlan] = None,
    ) -> None:
        super().__init__(system_site_packages, arch, locked)
        self.box = box
        #: What the probe read inside the image, once it has.
        self.found: dict[str, str] = {}
        self.sha256 = ""
        #: The overlay's packages, once installed: (name, version).
        self.overlaid: list[tuple[str, str]] = []
        #: The image's own PATH, as the overlay's probe read it inside (what entering the env puts after the
        #: overlay's bin).
        self.image_path = ""

    @property
    def plan(self) -> ContainerPlan:
        if self.box is None:
            raise BackendError(
                "a container env is built from its plan's [container] part, and this plan has none"
            )
        return self.box

    def python(self, command: str, env: Mapping[str, str], final: Path) -> str:
        """The runtime's program on the PATH the modules give (the image brings its own python)."""
        program = containers.runtime(self.plan.runtime).program
        found = shutil.which(program, path=env.get("PATH", ""))
        if not found:
            raise BackendError(
                f"{program} ({self.plan.runtime}) was not found on the PATH the recipe's modules give",
                hint="load the site's module for it in modules.load (TACC: tacc-apptainer), or set container.runtime",
            )
        return found

    def own_env(self, partial: Path, env: Mapping[str, str]) -> dict[str, str]:
        """The runtime's cache and temporary directories beside the env, where the user's environment names none
        (site rules: build nothing from $HOME; a compute node's /tmp is small)."""
        work = work_dir(partial.parent, self.plan.runtime)
        wanted = containers.runtime(self.plan.runtime).work_env(str(work / "cache"), str(work / "tmp"))
        return {key: value for key, value in wanted.items() if not env.get(key)}

    def create(self, build: Build, step: Optional[InstallStep], env: Mapping[str, str]) -> None:
        """Fetch the image into the partial env, then read and check the torch inside."""
        box = self.plan
        build.partial.mkdir(mode=0o755)
        for key, value in self.own_env(build.partial, {}).items():
            if build.env.get(key) == value:  # ours, not the user's: made here
                Path(value).mkdir(mode=0o700, parents=True, exist_ok=True)
        dest = build.partial / containers.runtime(box.runtime).image_file
        build.say(f"fetching {box.pick.ref.text} with {box.runtime}")
        if not box.fetch:
            _copy(Path(box.pick.ref.path), dest)
        for argv in box.fetch:
            _fetch(_at(argv, dest, build.python), box, env, build)
        if not dest.is_file():
            raise BackendError(
                f"{box.runtime} left no image at {dest}", hint=f"the build log {build.log.path} says why"
            )
        self.sha256 = _sha256(dest)
        build.log.write(f"image: {dest.name} sha256:{self.sha256}")
        if box.pick.ref.local:  # nothing asked a registry: what the image says of itself, from the file
            box = _labelled(box, dest, env, build)
        build.say("reading the torch inside the image")
        res = run_logged(_at(box.probe, dest, build.python), env, build.log, timeout=PROBE_TIMEOUT_S)
        self.found = _probe_result(res.stdout)
        guard(box, self.found)
        if box.overlay is not None:
            self._overlay(build, box.overlay, dest, env)

    def _overlay(self, build: Build, layer: Overlay, dest: Path, env: Mapping[str, str]) -> None:
        """The overlay venv made and filled inside the image, in the partial env's directory bound at its final
        path; then the torch seen through it checked against the image's."""
        where = build.partial / OVERLAY_DIR
        where.mkdir(mode=0o755)
        build.say(f"making the overlay venv at {layer.path} with the image's python")
        run_logged(_at(layer.create, dest, build.python, where), env, build.log, timeout=PROBE_TIMEOUT_S)
        build.say(f"installing {', '.join(layer.packages)} into the overlay")
        run_logged(_at(layer.install, dest, build.python, where), env, build.log)
        build.say("reading the torch seen through the overlay")
        res = run_logged(_at(layer.probe, dest, build.python, where), env, build.log, timeout=PROBE_TIMEOUT_S)
        seen = _probe_result(res.stdout)
        overlay_guard(self.plan, layer, self.found, seen)
        self.image_path = seen.get("path", "")
        self.overlaid = _dists(where)

    def install(self, build: Build, step: InstallStep, env: Mapping[str, str]) -> None:
        raise BackendError(f"a container env installs nothing into its image (step {step.display()!r})")

    def activate(self, build: Build, act: Any) -> None:
        """Nothing is written into a container env: how to enter its image is for ``activate`` to print."""

    def inventory(self, build: Build) -> list[dict[str, Any]]:
        torch = self.found.get("torch")
        image = [{"name": "torch", "version": torch, "installer": "image"}] if torch else []
        return image + [
            {"name": n, "version": v, "installer": "pip (overlay)", "in_env": True} for n, v in self.overlaid
        ]

    def tools(self, build: Build) -> dict[str, str]:
        box = self.plan
        return {
            "envbuilder": __version__,
            "runtime": box.runtime,
            "runtime_path": build.python,
            "image": box.pick.ref.text,
            "image_file": containers.runtime(box.runtime).image_file,
            "image_sha256": self.sha256,
            # The manifest the reference named: what pulls the same image again (name@digest).
            "image_digest": box.registry_digest or box.pick.ref.digest,
            "python": self.found.get("python", ""),
            "cuda": self.found.get("cuda", ""),
            # The system the image's python runs on, as create read it inside (its /etc/os-release, its C library).
            "image_os": self.found.get("os", ""),
            "image_glibc": self.found.get("glibc", ""),
            "overlay_python": box.overlay.python if box.overlay else "",
            "image_env_path": self.image_path,
        }


def work_dir(parent: Path, runtime: str) -> Path:
    """The runtime's cache and temporary directory create makes in ``parent``, the prefix's directory: one per
    runtime there, shared by every container env beside it."""
    return parent / f".envbuilder-{runtime}"


def drop_work_dir(prefix: Path, runtime: str) -> Optional[str]:
    """Remove the runtime's directory that create made beside the removed env at ``prefix`` (its layer cache and
    temporary files), unless another env beside it uses it: a container env of the same runtime, or a create or
    restore under way (a partial directory). None once removed (or absent); else why it was kept, in words. Never
    through a symlink, nor a symlink itself (removal.remove_below)."""
    work = work_dir(prefix.parent, runtime)
    if not work.exists() and not work.is_symlink():
        return None
    owner = work.lstat().st_uid
    if owner != os.geteuid():  # create makes it as this user: another user's is theirs to keep
        return f"{work} belongs to another user (uid {owner}), not to this one; left it"
    try:
        users = sorted(
            s.name for s in prefix.parent.iterdir() if s not in (prefix, work) and _uses(s, runtime)
        )
    except OSError as exc:
        return (
            f"{prefix.parent} cannot be listed ({exc.strerror}), so whether another env uses it is not known"
        )
    if users:
        return f"{', '.join(users)} beside it use{'s' if len(users) == 1 else ''} it"
    return removal.remove_below(prefix.parent, work, dirs=True)


def _uses(entry: Path, runtime: str) -> bool:
    """Whether ``entry`` (beside a removed env) is a container env of ``runtime``, or an env being built."""
    if transaction.PARTIAL in entry.name:
        return True
    marker = entry.joinpath(*removal.MARKER)
    if entry.is_symlink() or not marker.is_file():
        return False
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True  # a record it cannot read: kept, as for an env that might use it
    if not isinstance(data, dict):
        return True
    plan, tools = _part(data, "plan"), _part(data, "tools")
    box = _part(plan, "container")
    kind = data.get("kind") or plan.get("kind")
    return kind == "container" and (tools.get("runtime") or box.get("runtime")) == runtime


def _part(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``data[key]`` where it is a table, else an empty one (a record written by hand)."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _fetch(argv: Sequence[str], box: ContainerPlan, env: Mapping[str, str], build: Build) -> None:
    """One fetch command; a registry it cannot reach named as the registry, with the ways round it."""
    try:
        run_logged(argv, env, build.log)
    except NetworkError as exc:
        ref = box.pick.ref
        raise NetworkError(
            exc.argv,
            exc.returncode,
            exc.stderr_tail,
            url=f"the registry {ref.host}",
            cause=exc.cause,
            hint=f"fetch the image where {ref.host} answers ({box.runtime}'s pull or build, or envbuilder create "
            "there), copy the file here and name its path in container.image; or set the runtime's registry "
            "mirror",
        ) from None


def _labelled(box: ContainerPlan, dest: Path, env: Mapping[str, str], build: Build) -> ContainerPlan:
    """``box`` with the facts the image file's labels state in place of the plan's (the runtime's inspect)."""
    runtime = containers.runtime(box.runtime)
    try:
        res = run_logged(_at(runtime.inspect(DEST), dest, build.python), env, build.log)
    except CommandFailed as exc:  # an image without labels, or a runtime that cannot say: the probe decides
        build.log.write(f"no labels read ({exc.message})")
        return box
    said = images.label_facts(runtime.config(res.stdout))
    if not said.origins:
        return box
    build.log.write(f"the image's labels: {', '.join(f'{k} {getattr(said, k)}' for k in said.origins)}")
    return replace(box, pick=replace(box.pick, facts=images.merged(box.pick.facts, said)))


def _copy(source: Path, dest: Path) -> None:
    """A local image in the runtime's own format, copied in as it is."""
    if not source.is_file():
        raise BackendError(
            f"container.image {source} is not a file here",
            hint="name the image file as compute nodes see it (an absolute path), or a registry reference",
        )
    shutil.copyfile(source, dest)


def _at(argv: Sequence[str], dest: Path, program: str, build: Optional[Path] = None) -> list[str]:
    """``argv`` with the image at ``dest`` (the first argument that names it: ``{dest}``, or Podman's
    ``oci-archive:{dest}``), the runtime's program found on PATH, and ``build`` for the build directory the
    runtime's options bind (before the image only: what follows it is the command's, the recipe's values among it)."""
    image = next((i for i, arg in enumerate(argv) if DEST in arg), len(argv))
    out = [arg.replace(BUILD_DIR, str(build)) if build is not None else arg for arg in argv[:image]]
    out += [arg.replace(DEST, str(dest)) for arg in argv[image : image + 1]]
    out += argv[image + 1 :]
    return [program, *out[1:]] if Path(out[0]).name == Path(program).name else out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _probe_result(stdout: str) -> dict[str, str]:
    """The probe's JSON line (the last line that is one: a runtime may print its own lines first)."""
    for line in reversed(stdout.splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return {str(k): str(v) for k, v in data.items()}
    raise BackendError(
        "the torch probe inside the image printed no result",
        hint="the build log shows what the runtime printed; does the image have python3 and torch?",
    )


def guard(box: ContainerPlan, found: Mapping[str, str]) -> None:
    """Refuse an image whose torch, CUDA, Python or machine is not what the plan checked."""
    facts = box.pick.facts
    wrong = []
    if facts.torch and _public(found.get("torch", "")) != _public(facts.torch):
        wrong.append(f"torch {found.get('torch') or 'none'}, not {facts.torch}")
    if facts.cuda is not None and _minor(found.get("cuda", "")) != _minor(facts.cuda):
        wrong.append(f"CUDA {found.get('cuda') or 'none'}, not {facts.cuda or 'none (CPU only)'}")
    if facts.python and _minor(found.get("python", "")) != _minor(facts.python):
        wrong.append(f"Python {found.get('python')}, not {facts.python}")
    if facts.archs is not None and found.get("machine") not in facts.archs:
        wrong.append(f"a {found.get('machine')} machine, not {', '.join(facts.archs)}")
    if wrong:
        raise BackendError(
            f"the image {box.pick.ref.text} holds {'; '.join(wrong)} (as its "
            f"{'labels' if any(o.startswith('image') for o in facts.origins.values()) else 'table row'} said): "
            "the env was not put in place",
            hint="pin the image by digest, or correct what the table or the image's labels say",
        )


def overlay_guard(
    box: ContainerPlan, layer: Overlay, image: Mapping[str, str], seen: Mapping[str, str]
) -> None:
    """Refuse an overlay through which another torch is seen than the image's own (a package that required
    another torch, and pip installed it into the overlay, where it wins over the image's)."""
    mine = seen.get("file", "")
    inside = mine == layer.path or mine.startswith(layer.path.rstrip("/") + "/")
    if seen.get("torch") == image.get("torch") and not inside:
        return
    where = f"installed into the overlay ({mine})" if inside else f"from {mine or 'nowhere'}"
    raise BackendError(
        f"container.packages brought in another torch: torch {seen.get('torch') or 'none'} {where} is seen through "
        f"the overlay, not the image's torch {image.get('torch')} (planned: {box.pick.facts.torch or 'any'}); the "
        "env was not put in place",
        hint="pin each package of container.packages to a release that accepts the image's torch (the build log "
        "shows what pip installed and why), or choose the image whose torch they need",
    )


def _dists(venv: Path) -> list[tuple[str, str]]:
    """(name, version) of each package in the overlay venv, sorted by name."""
    found = [metadata_name_version(info) for info in venv.glob("lib/python*/site-packages/*.dist-info")]
    return sorted((nv for nv in found if nv is not None), key=lambda nv: nv[0].lower())


def _public(version: str) -> str:
    """A version without its local label (2.5.1+cu124 -> 2.5.1)."""
    return version.split("+", 1)[0]


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])
