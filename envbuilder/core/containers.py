"""Container images and runtimes, by name, in one place (pure): the strict grammar of an image reference a recipe
names (``container.image``) and of a bind (``container.binds``), and the registry of container runtimes, each a
pure argv builder like the launchers (:data:`RUNTIMES`): how it fetches an image into one file, runs a command in
it (binds, GPU, environment), opens a shell in it and reads its labels.

An image reference never reaches a command line as an option: it matches :func:`image_problem`'s grammar (no
whitespace, no leading ``-``, no shell metacharacter) and every argv puts ``--`` before the operands where the
tool's parser takes it (Apptainer and SingularityCE are Go programs whose flag parser ends options at ``--``;
``ch-image`` is an argparse program and ``ch-run`` takes ``IMAGE -- CMD``; Podman's ``run`` and ``pull`` too), and
where it does not (``ch-convert``) every operand is one that cannot start with '-'.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Optional

from envbuilder.core.errors import UsageError
from envbuilder.core.structs import dataclass
from envbuilder.core.values import Problem, Rule, control_problem, found

__all__ = [
    "BIND",
    "IMAGE",
    "IMAGE_GATES",
    "MPI_MODES",
    "RUNTIMES",
    "ImageRef",
    "Runtime",
    "bind_problem",
    "image_problem",
    "mirrored",
    "parse_image",
    "registry_mirrors",
    "runtime",
]

#: How a container's ranks reach MPI: the host's MPI bound in, or the one inside the image (with PMI from the
#: launcher).
MPI_MODES = ("host", "image")
#: The image gates a recipe may list in ``container.allow`` to turn the gate's error into a warning.
IMAGE_GATES = ("image-tag", "platform", "driver", "gpu-arch")
#: The registry a reference without a host names (Docker Hub), and where its one-word names live.
DOCKER_HUB = "docker.io"
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")

# The distribution reference grammar (github.com/distribution/reference), narrowed: a host (a name with a dot or
# a port, or localhost), path components in lower case, a tag, a sha256 digest.
_HOST = r"(?:localhost|\[::1\]|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::\d{1,5})?|[A-Za-z0-9-]+:\d{1,5}"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_REGISTRY_RE = re.compile(
    rf"(?:docker://)?(?:(?P<host>{_HOST})/)?(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
#: A local image: an absolute path to a SIF, a squashfs or an OCI archive, or an OCI layout directory (``oci:``).
_PATH = r"(?:/[A-Za-z0-9._+@%,-]+)+"
_LOCAL_RE = re.compile(rf"(?P<transport>oci:|oci-archive:)?(?P<path>{_PATH})")
_LOCAL_SUFFIXES = (".sif", ".sqfs", ".squashfs", ".tar")
IMAGE_PATTERN = rf"(?:docker://)?[A-Za-z0-9\[][A-Za-z0-9._/:@\[\]-]*|(?:oci:|oci-archive:)?{_PATH}"
#: How a recipe names its image, in words (the hint where it names none).
IMAGE_EXAMPLE = (
    'set container.image = "nvcr.io/nvidia/pytorch:24.05-py3" (a registry reference) or a local .sif path'
)
_IMAGE_HINT = (
    "a registry reference (docker://pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime, nvcr.io/nvidia/pytorch:24.05-py3, "
    "optionally @sha256:DIGEST) or an absolute path to a .sif, .sqfs or OCI archive (.tar; oci: for a layout "
    "directory)"
)


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference: a registry's (``host``, ``repository``, ``tag``, ``digest``) or a local file."""

    text: str
    host: str = ""
    repository: str = ""
    #: The tag named, or "latest" where the reference names neither a tag nor a digest (``tag_given`` False).
    tag: str = ""
    digest: str = ""
    tag_given: bool = False
    #: A local image: its absolute path, and ``oci`` / ``oci-archive`` where it is one (else a SIF or squashfs).
    path: str = ""
    transport: str = ""

    @property
    def local(self) -> bool:
        return bool(self.path)

    @property
    def loopback(self) -> bool:
        """A registry on this machine (served over plain HTTP, as the tests' is)."""
        return self.host.rsplit(":", 1)[0] in _LOOPBACK or self.host.startswith("[::1]")

    @property
    def name(self) -> str:
        """``host/repository:tag[@digest]``, the form every runtime but Apptainer's ``docker://`` takes."""
        tail = f"@{self.digest}" if self.digest else ""
        tag = f":{self.tag}" if self.tag_given or not self.digest else ""
        return f"{self.host}/{self.repository}{tag}{tail}"

    @property
    def uri(self) -> str:
        """Apptainer's form: ``docker://...`` for a registry, ``oci-archive:PATH`` / ``oci:PATH`` / the path."""
        if self.local:
            return f"{self.transport}:{self.path}" if self.transport else self.path
        return f"docker://{self.name}"


def image_problem(text: str) -> Optional[Problem]:
    """What is wrong with an image reference, or None."""
    bad = control_problem(text)
    if bad is not None:
        return f"{bad[0]} is not allowed in an image reference, found {found(text)}", bad[1]
    if text.startswith("-"):
        return (
            f"an image reference cannot start with '-' (a command would read it as an option), found {found(text)}",
            _IMAGE_HINT,
        )
    if re.search(r"[\s;&|`$<>()'\"\\*?!{}]", text):
        return f"an image reference holds no whitespace or shell character, found {found(text)}", _IMAGE_HINT
    if text.startswith(("/", "oci:", "oci-archive:")):
        return _local_problem(text)
    return _registry_problem(text)


def _registry_problem(text: str) -> Optional[Problem]:
    match = _REGISTRY_RE.fullmatch(text)
    if match is None:
        return f"not an image reference: {found(text)}", _IMAGE_HINT
    if not match.group("tag") and not match.group("digest") and text.endswith(_LOCAL_SUFFIXES):
        return f"a local image is named by its absolute path, found {found(text)}", "write the path out: /..."
    return None


def _local_problem(text: str) -> Optional[Problem]:
    match = _LOCAL_RE.fullmatch(text)
    if match is None or "/../" in text + "/" or "/./" in text + "/":
        return f"not a plain absolute image path: {found(text)}", _IMAGE_HINT
    if not match.group("transport") and not match.group("path").endswith(_LOCAL_SUFFIXES):
        return (
            f"a local image must be a .sif, .sqfs or OCI archive (.tar), found {found(text)}",
            "name an OCI layout directory as oci:/PATH",
        )
    return None


def parse_image(text: str) -> ImageRef:
    """The reference ``text`` (one :func:`image_problem` passed), parsed."""
    local = _LOCAL_RE.fullmatch(text)
    if local is not None:
        transport = (local.group("transport") or "").rstrip(":")
        return ImageRef(text, path=local.group("path"), transport=transport)
    match = _REGISTRY_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not an image reference: {text!r}")
    host, repo = match.group("host"), match.group("repo")
    if host is None:
        host = DOCKER_HUB
        repo = repo if "/" in repo else f"library/{repo}"
    tag, digest = match.group("tag"), match.group("digest") or ""
    return ImageRef(
        text, host=host, repository=repo, tag=tag or "latest", digest=digest, tag_given=tag is not None
    )


#: Site registry mirrors: ``HOST=MIRROR`` pairs separated by whitespace or ``;``; MIRROR is a registry host
#: (``host[:port]``), optionally with a path its copies live under (``mirror.site:5000/dockerhub``).
MIRROR_VAR = "ENVBUILDER_REGISTRY_MIRROR"
_MIRROR_RE = re.compile(rf"(?P<host>{_HOST})=(?P<mirror>{_HOST})(?P<path>(?:/{_COMPONENT})*)")


def registry_mirrors(env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """The site's registry mirrors (:data:`MIRROR_VAR`): upstream host -> (mirror host, path prefix)."""
    out: dict[str, tuple[str, str]] = {}
    for pair in re.split(r"[\s;]+", env.get(MIRROR_VAR, "").strip()):
        if not pair:
            continue
        match = _MIRROR_RE.fullmatch(pair)
        if match is None:
            raise UsageError(
                f"{MIRROR_VAR}: not a HOST=MIRROR pair: {pair!r}",
                hint=f"e.g. {MIRROR_VAR}='docker.io=mirror.site:5000/dockerhub nvcr.io=mirror.site:5000/ngc'",
            )
        out[match.group("host")] = (match.group("mirror"), match.group("path").lstrip("/"))
    return out


def mirrored(ref: ImageRef, mirrors: Mapping[str, tuple[str, str]]) -> ImageRef:
    """Where ``ref`` is fetched from: its registry's mirror, where the site names one."""
    if ref.local or ref.host not in mirrors:
        return ref
    host, path = mirrors[ref.host]
    repository = f"{path}/{ref.repository}" if path else ref.repository
    return replace(ref, host=host, repository=repository)


_BIND_HINT = (
    "an absolute path, or $VAR / ${VAR} of one, optionally :/PATH inside; no comma, colon or whitespace"
)
_BIND_SIDE = r"(?:/|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?)[A-Za-z0-9._/+@%-]*"
BIND_PATTERN = rf"{_BIND_SIDE}(?::/[A-Za-z0-9._/+@%-]*)?"


def bind_problem(text: str) -> Optional[Problem]:
    """What is wrong with one ``container.binds`` entry (``SRC`` or ``SRC:DEST``), or None."""
    bad = control_problem(text)
    if bad is not None:
        return f"{bad[0]} is not allowed in a bind, found {found(text)}", bad[1]
    if not re.fullmatch(BIND_PATTERN, text):
        return f"not a bind: {found(text)}", _BIND_HINT
    return None


IMAGE = Rule(image_problem, IMAGE_PATTERN, _IMAGE_HINT)
BIND = Rule(bind_problem, BIND_PATTERN, _BIND_HINT)


# ---------------------------------------------------------------------------------------------------------------
# Runtimes


@dataclass(frozen=True)
class Runtime:
    """One container runtime's command lines. This base class is Apptainer's (SingularityCE shares its CLI)."""

    name: str
    #: Its program, found on PATH once the recipe's modules are loaded.
    program: str
    #: The one file an env's image is kept in, under the prefix.
    image_file: str = "image.sif"
    #: A local image in this format is kept as it is (copied in); any other is converted.
    native: tuple[str, ...] = (".sif",)
    #: Whether exec has a flag that brings the host's NVIDIA driver in (else the image must carry it).
    gpu_flag: bool = True

    def work_env(self, cache: str, tmp: str) -> dict[str, str]:
        """Where its fetch keeps layers and unpacks (by default under $HOME and /tmp, which a site's quota and a
        node's small /tmp cannot hold): ``cache`` and ``tmp``, beside the env."""
        upper = self.program.upper()
        return {f"{upper}_CACHEDIR": cache, f"{upper}_TMPDIR": tmp}

    def fetch(self, ref: ImageRef, dest: str) -> list[list[str]]:
        """The commands that make ``dest`` from ``ref``, in order; [] where the file is copied as it is."""
        if ref.local and ref.path.endswith(self.native) and not ref.transport:
            return []
        verb = "build" if ref.local else "pull"
        insecure = ["--no-https"] if ref.loopback else []
        return [[self.program, verb, *insecure, "--", dest, ref.uri]]

    def exec(
        self,
        image: str,
        argv: Sequence[str],
        *,
        binds: Sequence[str] = (),
        gpu: bool = False,
        env: Optional[Mapping[str, str]] = None,
        cleanenv: bool = True,
        contain: bool = False,
    ) -> list[str]:
        """Run ``argv`` inside ``image``; ``contain``: with a /tmp (and home) of its own, not the host's (a build
        inside the image sees none of the host's files but its binds, and its binds may land anywhere there)."""
        options = [*self._options(binds, gpu, env, cleanenv), *(["--contain"] if contain else [])]
        return [self.program, "exec", *options, "--", image, *argv]

    def read_only(self, path: str) -> str:
        """A bind of the host's ``path`` at the same path, read-only where the runtime can say so."""
        return f"{path}:{path}:ro"

    def shell(self, image: str, *, binds: Sequence[str] = (), gpu: bool = False) -> list[str]:
        """An interactive shell inside ``image``."""
        return [self.program, "shell", *self._options(binds, gpu, None, False), "--", image]

    def inspect(self, image: str) -> list[str]:
        """Print the image's labels as JSON."""
        return [self.program, "inspect", "--json", "--labels", "--", image]

    def config(self, printed: str) -> dict[str, Any]:
        """What :meth:`inspect` printed, as an OCI image config's ``Labels`` (and ``Env``); {} where it is not
        what the runtime prints (``{"data": {"attributes": {"labels": {...}}}}`` for Apptainer)."""
        data = _json_object(printed)
        labels = ((data.get("data") or {}).get("attributes") or {}).get("labels")
        return {"Labels": labels} if isinstance(labels, dict) else {}

    def _options(
        self, binds: Sequence[str], gpu: bool, env: Optional[Mapping[str, str]], cleanenv: bool
    ) -> list[str]:
        out = ["--cleanenv"] if cleanenv else []
        out += ["--nv"] if gpu else []
        out += ["--bind", ",".join(binds)] if binds else []
        for key, value in (env or {}).items():
            out += ["--env", f"{key}={value}"]
        return out


@dataclass(frozen=True)
class Charliecloud(Runtime):
    """Charliecloud: ``ch-image pull`` into its store, ``ch-convert`` to one squashfs, ``ch-run`` on it. It has
    no GPU flag: the host's driver libraries go into an image with ``ch-fromhost --nvidia``. ``ch-convert`` (a
    shell script) reads ``--`` as a third operand, so its operands go bare: a reference the grammar checked and an
    absolute path, neither of which can start with '-'. ``ch-image`` (0.31) reads registries over HTTPS only."""

    def work_env(self, cache: str, tmp: str) -> dict[str, str]:
        return {"CH_IMAGE_STORAGE": cache}

    def fetch(self, ref: ImageRef, dest: str) -> list[list[str]]:
        if ref.local:
            if ref.path.endswith(self.native) and not ref.transport:
                return []
            return [["ch-convert", ref.path, dest]]
        insecure = ["--tls-no-verify"] if ref.loopback else []
        return [
            ["ch-image", "pull", *insecure, "--", ref.name],
            ["ch-convert", "-i", "ch-image", "-o", "squash", ref.name, dest],
        ]

    def exec(
        self,
        image: str,
        argv: Sequence[str],
        *,
        binds: Sequence[str] = (),
        gpu: bool = False,
        env: Optional[Mapping[str, str]] = None,
        cleanenv: bool = True,
        contain: bool = False,
    ) -> list[str]:
        out = [
            self.program,
            *(["--unset-env=*"] if cleanenv else []),
            *(["--private-tmp"] if contain else []),
        ]
        out += [f"--bind={bind}" for bind in binds]
        out += [f"--set-env={key}={value}" for key, value in (env or {}).items()]
        return [*out, image, "--", *argv]

    def read_only(self, path: str) -> str:
        return path  # ch-run's binds take no options

    def shell(self, image: str, *, binds: Sequence[str] = (), gpu: bool = False) -> list[str]:
        return self.exec(image, ["/bin/sh", "-l"], binds=binds, cleanenv=False)

    def inspect(self, image: str) -> list[str]:
        # ch-image keeps the image's config (its labels among it) in the image, at /ch/metadata.json.
        return [self.program, image, "--", "cat", "/ch/metadata.json"]

    def config(self, printed: str) -> dict[str, Any]:
        data = _json_object(printed)
        labels, env = data.get("labels"), data.get("env")
        out: dict[str, Any] = {"Labels": labels} if isinstance(labels, dict) else {}
        if isinstance(env, dict):
            out["Env"] = [f"{key}={value}" for key, value in env.items()]
        return out


@dataclass(frozen=True)
class Podman(Runtime):
    """Podman: pulled into its store, saved as one OCI archive, run from it (``oci-archive:``); GPUs through CDI."""

    def work_env(self, cache: str, tmp: str) -> dict[str, str]:
        return {"TMPDIR": tmp}  # its store is the user's containers storage, which storage.conf places

    def fetch(self, ref: ImageRef, dest: str) -> list[list[str]]:
        if ref.local:
            if ref.path.endswith(self.native) and not ref.transport:
                return []
            return [
                ["podman", "pull", "--", ref.uri],
                ["podman", "save", "--format", "oci-archive", "-o", dest, "--", ref.uri],
            ]
        insecure = ["--tls-verify=false"] if ref.loopback else []
        return [
            ["podman", "pull", *insecure, "--", ref.name],
            ["podman", "save", "--format", "oci-archive", "-o", dest, "--", ref.name],
        ]

    def exec(
        self,
        image: str,
        argv: Sequence[str],
        *,
        binds: Sequence[str] = (),
        gpu: bool = False,
        env: Optional[Mapping[str, str]] = None,
        cleanenv: bool = True,
        contain: bool = False,
    ) -> list[str]:
        out = [self.program, "run", "--rm", "--network=host"]
        out += ["--device", "nvidia.com/gpu=all"] if gpu else []
        out += [f"--volume={_podman_bind(bind)}" for bind in binds]
        out += [f"--env={key}={value}" for key, value in (env or {}).items()]
        return [*out, "--", f"oci-archive:{image}", *argv]

    def shell(self, image: str, *, binds: Sequence[str] = (), gpu: bool = False) -> list[str]:
        run = self.exec(image, ["/bin/sh", "-l"], binds=binds, gpu=gpu, cleanenv=False)
        return [*run[:3], "-it", *run[3:]]

    def inspect(self, image: str) -> list[str]:
        return [self.program, "image", "inspect", "--", f"oci-archive:{image}"]

    def config(self, printed: str) -> dict[str, Any]:
        try:
            data = json.loads(printed)
        except ValueError:
            return {}
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        config = first.get("Config")
        return config if isinstance(config, dict) else {}


def _json_object(text: str) -> dict[str, Any]:
    """The JSON object ``text`` holds, or {}."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _podman_bind(bind: str) -> str:
    """Podman names both sides of a volume."""
    return bind if ":" in bind else f"{bind}:{bind}"


#: Each runtime, by the name recipes give it (``container.runtime``).
RUNTIMES: dict[str, Runtime] = {
    "apptainer": Runtime("apptainer", "apptainer"),
    "singularity": Runtime("singularity", "singularity"),
    "charliecloud": Charliecloud(
        "charliecloud", "ch-run", image_file="image.sqfs", native=(".sqfs", ".squashfs"), gpu_flag=False
    ),
    "podman": Podman("podman", "podman", image_file="image.tar", native=(".tar",)),
}
#: The runtime a recipe that names none gets (the one HPC sites install).
DEFAULT_RUNTIME = "apptainer"


def runtime(name: str) -> Runtime:
    """The runtime ``name`` (the schema has checked it)."""
    return RUNTIMES[name]
