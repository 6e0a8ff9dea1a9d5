"""The right image, like the right wheel (pure): what a container image holds (torch, CUDA, Python, the driver its
CUDA needs, the CPU architectures it is published for), from the shipped table (``data/container_images.toml``)
corrected by what the registry says of the image itself (its labels and its manifest's platform list, which
``resolver.imagefetch`` reads), and the gates it must pass on the target: CPU architecture, driver, a moving tag.

The labels read, first found wins: envbuilder's own (``org.envbuilder.torch``, ``.cuda``, ``.python``,
``.driver``), then NVIDIA's (``com.nvidia.pytorch.version``, ``com.nvidia.cuda.version``), then the image's
environment (``PYTORCH_VERSION``, ``CUDA_VERSION``). A label says ``cuda`` "" (or ``none``) for a CPU-only image.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import field, replace
from functools import lru_cache
from importlib.resources import files
from typing import Any, Optional

from packaging.specifiers import SpecifierSet

from envbuilder.core._toml import loads
from envbuilder.core.containers import ImageRef
from envbuilder.core.errors import ResolverError, ResolverErrors
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.resolver.gates import Finding, driver_max_cuda, ver
from envbuilder.resolver.matrix import ArchList, Matrix, covers, gpu_capability, minor_tuple

#: What each fact is read from in an image's labels (then its environment), first found wins.
LABELS: dict[str, tuple[str, ...]] = {
    "torch": ("org.envbuilder.torch", "com.nvidia.pytorch.version", "PYTORCH_VERSION"),
    "cuda": ("org.envbuilder.cuda", "com.nvidia.cuda.version", "CUDA_VERSION"),
    "python": ("org.envbuilder.python", "PYTHON_VERSION"),
    "driver": ("org.envbuilder.driver",),
    "cuda_archs": ("org.envbuilder.cuda_archs", "TORCH_CUDA_ARCH_LIST"),
}
#: OCI platform architectures, as host facts name them.
OCI_ARCHS = {
    "amd64": "x86_64",
    "arm64": "aarch64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}
_FACTS = ("torch", "cuda", "python", "driver", "archs", "cuda_archs", "os", "glibc")
#: The facts that are lists.
_LISTS = ("archs", "cuda_archs")


@dataclass(frozen=True)
class ImageFacts:
    """What an image holds; None where nothing says. ``origins`` names where each fact came from."""

    torch: Optional[str] = None
    #: The CUDA toolkit (12.4.1); "" for a CPU-only image.
    cuda: Optional[str] = None
    python: Optional[str] = None
    #: The lowest NVIDIA driver its CUDA needs, where its publisher states one.
    driver: Optional[str] = None
    archs: Optional[tuple[str, ...]] = None
    #: The GPU code its torch carries, as TORCH_CUDA_ARCH_LIST spells it (8.0, 9.0+PTX).
    cuda_archs: Optional[tuple[str, ...]] = None
    #: The image's operating system and C library (what its python and wheels run on), where the table says.
    os: Optional[str] = None
    glibc: Optional[str] = None
    origins: Mapping[str, str] = field(default_factory=dict)
    confidence: str = "P"
    #: The table row's source, where the table said anything.
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {name: getattr(self, name) for name in _FACTS}
        for name in _LISTS:
            data[name] = list(data[name]) if data[name] is not None else None
        return {**data, "origins": dict(self.origins), "confidence": self.confidence, "source": self.source}


@dataclass(frozen=True)
class ImageTable:
    as_of: str
    ngc: Mapping[str, Mapping[str, Any]]
    dockerhub: Mapping[str, Any]


@lru_cache(maxsize=1)
def load_table() -> ImageTable:
    """The shipped table (package data)."""
    return parse_table(files("envbuilder").joinpath("data/container_images.toml").read_text(encoding="utf-8"))


def parse_table(text: str) -> ImageTable:
    data = loads(text)
    return ImageTable(str(data.get("as_of", "")), data.get("ngc", {}), data.get("dockerhub", {}))


def table_facts(ref: ImageRef, table: ImageTable) -> ImageFacts:
    """What the table says of ``ref``; every fact None for an image it does not know."""
    if ref.host == "nvcr.io" and ref.repository == "nvidia/pytorch":
        release = re.fullmatch(r"(\d{2}\.\d{2})-py3", ref.tag)
        row = table.ngc.get(release.group(1)) if release else None
        if row is not None:
            return _row_facts(row, f"image table: NGC PyTorch {release.group(1) if release else ''}")
    if ref.host == "docker.io" and ref.repository == "pytorch/pytorch" and table.dockerhub:
        spelled = re.fullmatch(table.dockerhub["pattern"], ref.tag)
        if spelled is not None:
            row = {**table.dockerhub, "torch": spelled.group("torch"), "cuda": spelled.group("cuda")}
            return _row_facts(row, "image table: the pytorch/pytorch tag")
    return ImageFacts()


def _row_facts(row: Mapping[str, Any], origin: str) -> ImageFacts:
    where = f"{origin}, checked {row.get('checked', '?')}"
    values = {name: row.get(name) for name in _FACTS}
    for name in _LISTS:
        values[name] = tuple(row[name]) if name in row else None
    origins = {name: where for name, value in values.items() if value is not None}
    confidence = str(row.get("confidence", "U"))
    return ImageFacts(**values, origins=origins, confidence=confidence, source=str(row.get("source", "")))


def label_facts(config: Mapping[str, Any], platforms: Sequence[str] = ()) -> ImageFacts:
    """What an image's config (``Labels``, ``Env``) and its manifest's platform list (``linux/arm64``) say."""
    labels = dict(config.get("Labels") or {})
    for item in config.get("Env") or ():
        name, _, text = str(item).partition("=")
        labels.setdefault(name, text)
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for fact, keys in LABELS.items():
        key = next((k for k in keys if k in labels), None)
        if key is not None:
            value = str(labels[key]).strip()
            values[fact] = "" if fact == "cuda" and value.lower() in ("", "none", "cpu") else value
            if fact == "cuda_archs":
                values[fact] = tuple(a for a in re.split(r"[\s;,]+", value) if a)
            origins[fact] = f"image: {key}"
    archs = tuple(OCI_ARCHS.get(p.split("/")[1], p.split("/")[1]) for p in platforms if p.count("/") >= 1)
    if archs:
        values["archs"] = tuple(dict.fromkeys(archs))
        origins["archs"] = "registry: the manifest's platforms"
    return ImageFacts(**values, origins=origins)


def merged(table: ImageFacts, image: ImageFacts) -> ImageFacts:
    """The table's facts with the image's own in their place where it states them."""
    over = {name: getattr(image, name) for name in _FACTS if getattr(image, name) is not None}
    origins = {**table.origins, **{name: image.origins[name] for name in over}}
    confidence = "P" if set(over) >= {"torch", "cuda"} else table.confidence
    return replace(table, **over, origins=origins, confidence=confidence)


@dataclass(frozen=True)
class ImagePick:
    """The image the plan takes: its reference, its facts, why it fits the target, and what could not be checked."""

    ref: ImageRef
    facts: ImageFacts
    fits: tuple[str, ...]
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.ref.text,
            "local": self.ref.local,
            "registry": self.ref.host or None,
            "repository": self.ref.repository or None,
            "tag": self.ref.tag or None,
            "digest": self.ref.digest or None,
            "facts": self.facts.to_json(),
            "fits": list(self.fits),
            "warnings": list(self.warnings),
        }


def pick(
    ref: ImageRef, facts: ImageFacts, host: HostFacts, matrix: Matrix, allow: frozenset[str] = frozenset()
) -> ImagePick:
    """``ref`` with ``facts`` checked against ``host``; raises ResolverErrors with every failed gate that
    ``allow`` (``container.allow``) does not turn into a warning."""
    fits: list[str] = []
    warnings: list[str] = []
    found = [
        *tag_findings(ref),
        *arch_findings(ref, facts, host, fits, warnings),
        *driver_findings(facts, host, matrix, fits, warnings),
        *gpu_findings(facts, host, matrix, fits, warnings),
    ]
    warnings += [f"{f.message} (allowed: container.allow has {f.gate})" for f in found if f.gate in allow]
    findings = [f for f in found if f.gate not in allow]
    if findings:
        raise ResolverErrors([ResolverError(f.message, gate=f.gate, hint=f.hint) for f in findings])
    unknown = [name for name in ("torch", "cuda", "python") if getattr(facts, name) is None]
    if unknown:
        warnings.append(
            f"unknown for {ref.text}: {', '.join(unknown)} (neither the table nor the image says); create reads "
            "the torch inside the image and records what it finds"
        )
    if facts.confidence != "P" and facts.origins:
        warnings.append(
            f"{ref.text}'s facts come from a secondary source: re-check them against its publisher"
        )
    return ImagePick(ref, facts, tuple(fits), tuple(warnings))


def tag_findings(ref: ImageRef) -> list[Finding]:
    """A moving tag: ``latest``, or none, with no digest pinning what it was."""
    if ref.local or ref.digest or (ref.tag_given and ref.tag != "latest"):
        return []
    return [
        Finding(
            "image-tag",
            f"{ref.text} names {'no tag' if not ref.tag_given else 'the tag latest'}: it moves, so the env would "
            "not be the image this plan checked",
            f"name a release tag ({ref.host}/{ref.repository}:TAG) or pin a digest (@sha256:...)",
        )
    ]


def arch_findings(
    ref: ImageRef, facts: ImageFacts, host: HostFacts, fits: list[str], warnings: list[str]
) -> list[Finding]:
    if facts.archs is None or not host.arch:
        warnings.append(
            f"the CPU architectures {ref.text} is published for are unknown; checked when it runs"
        )
        return []
    if host.arch in facts.archs:
        fits.append(f"published for {host.arch} ({facts.origins.get('archs', '')})")
        return []
    return [
        Finding(
            "platform",
            f"{ref.text} is published for {', '.join(facts.archs)} only; the target is {host.arch}",
            "choose an image built for "
            + host.arch
            + (" (NGC's nvcr.io/nvidia/pytorch tags carry arm64)" if host.arch == "aarch64" else ""),
        )
    ]


def driver_findings(
    facts: ImageFacts, host: HostFacts, m: Matrix, fits: list[str], warnings: list[str]
) -> list[Finding]:
    if facts.cuda is None or not _needs_driver(facts, host, fits, warnings):
        return []
    cuda = minor_tuple(facts.cuda)
    max_cuda = driver_max_cuda(host, m)
    floor = facts.driver or _family_floor(cuda[0], m)
    if host.driver_version and floor and ver(host.driver_version) < ver(floor):
        return [_too_old(facts, f"driver {host.driver_version}, below the {floor} it needs")]
    if max_cuda is not None and max_cuda[0] < cuda[0]:
        return [_too_old(facts, f"driver supports CUDA {max_cuda[0]}.{max_cuda[1]} at most")]
    if max_cuda is None and not host.driver_version:
        warnings.append(f"NVIDIA driver unknown; the image's CUDA {facts.cuda} is checked when it runs")
        return []
    if max_cuda is not None and max_cuda < cuda:
        warnings.append(
            f"the driver supports CUDA {max_cuda[0]}.{max_cuda[1]}, older than the image's {facts.cuda}: it runs "
            "under minor-version compatibility (prebuilt kernels work; PTX JIT of newer PTX does not)"
        )
    fits.append(f"CUDA {facts.cuda} runs on driver {host.driver_version or 'of CUDA ' + str(host.max_cuda)}")
    return []


def gpu_findings(
    facts: ImageFacts, host: HostFacts, m: Matrix, fits: list[str], warnings: list[str]
) -> list[Finding]:
    """GPUs the image's torch carries no code for (where the image says which: TORCH_CUDA_ARCH_LIST)."""
    if not facts.cuda or not host.gpus:
        return []
    if facts.cuda_archs is None:
        warnings.append("the GPU code the image's torch carries is unknown; checked when it runs")
        return []
    sm = tuple(a for a in facts.cuda_archs if not a.endswith("+PTX"))
    ptx = tuple(a[: -len("+PTX")] for a in facts.cuda_archs if a.endswith("+PTX"))
    entry = ArchList("image", "", SpecifierSet(), (*sm, *ptx), ptx, facts.confidence, "")
    findings = []
    for cc in sorted({c for c in (gpu_capability(g, m) for g in host.gpus) if c}):
        runs, jit = covers(entry, cc)
        if runs:
            fits.append(
                f"sm_{cc.replace('.', '')} is in its torch's arch list" + (" (as PTX: JIT)" if jit else "")
            )
            continue
        findings.append(
            Finding(
                "gpu-arch",
                f"the target's GPUs are sm_{cc.replace('.', '')}, which the image's torch carries no code for "
                f"(it has {' '.join(facts.cuda_archs)}, {facts.origins.get('cuda_archs', '')})",
                "choose an image built for this GPU (a newer release)",
            )
        )
    return findings


def _needs_driver(facts: ImageFacts, host: HostFacts, fits: list[str], warnings: list[str]) -> bool:
    """Whether the driver gate applies: a CUDA image on a target with (or perhaps with) NVIDIA GPUs."""
    if not facts.cuda:
        fits.append("a CPU-only image: no driver needed")
        return False
    if host.gpus == ():
        warnings.append(
            f"the target has no NVIDIA GPU: the image's CUDA {facts.cuda} goes unused (torch runs on CPU)"
        )
        return False
    return True


def _too_old(facts: ImageFacts, why: str) -> Finding:
    return Finding(
        "driver",
        f"the image's CUDA {facts.cuda} ({facts.origins.get('cuda', '')}) needs a newer NVIDIA driver: the "
        f"target's {why}",
        "choose an image tag of an older CUDA, or ask the site for a newer driver",
    )


def _family_floor(major: int, m: Matrix) -> Optional[str]:
    """The lowest driver any toolkit of CUDA ``major`` runs on (the wheel table's floor for that major)."""
    floors = [
        v.family_min_driver for v in m.variants.values() if v.cuda_major == major and v.family_min_driver
    ]
    return min(floors, key=ver) if floors else None
