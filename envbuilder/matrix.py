"""The wheel matrix: which PyTorch wheels exist for which CUDA variant, CPU arch, Python and glibc, the GPU code
each carries, and the NVIDIA driver each CUDA major needs. Loaded once from package data; pure lookups."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from typing import Any, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from envbuilder._toml import loads
from envbuilder.host import Gpu


@dataclass(frozen=True)
class VariantInfo:
    name: str
    cuda: str  # "" for cpu
    family_min_driver: Optional[str]
    toolkit_driver: Optional[str]
    lacks: tuple[str, ...] = ()
    nightly_only: bool = False

    @property
    def is_cuda(self) -> bool:
        return bool(self.cuda)

    @property
    def cuda_major(self) -> Optional[int]:
        return int(self.cuda.split(".")[0]) if self.cuda else None


@dataclass(frozen=True)
class Release:
    torch: str
    channel: str
    torchvision: str
    torchaudio: str
    python: tuple[str, str]
    variants: dict[str, tuple[str, ...]]  # arch -> variants on the index
    aarch64_confidence: str
    pypi_default: dict[str, str]
    glibc: str
    glibc_by_variant: dict[str, str]
    source: str

    @property
    def version(self) -> Version:
        return Version(self.torch)


@dataclass(frozen=True)
class ArchList:
    variant: str
    platform: str
    torch: SpecifierSet
    sm: tuple[str, ...]
    ptx: tuple[str, ...]
    confidence: str
    source: str


@dataclass(frozen=True)
class Matrix:
    as_of: str
    index: dict[str, str]
    variants: dict[str, VariantInfo]
    no_index: dict[str, str]
    nightly: dict[str, Any]
    releases: tuple[Release, ...]
    arch_lists: tuple[ArchList, ...]
    gpu_cc: dict[str, str]

    def release(self, torch: str) -> Optional[Release]:
        for rel in self.releases:
            if rel.torch == torch:
                return rel
        return None

    def arch_list(self, variant: str, platform: str, torch: str) -> Optional[ArchList]:
        """The GPU code list of ``variant`` wheels of ``torch`` on ``platform``, where the matrix knows it."""
        v = Version(torch)
        for entry in self.arch_lists:
            if entry.variant == variant and entry.platform == platform and v in entry.torch:
                return entry
        return None

    def stable_releases(self) -> list[Release]:
        return sorted((r for r in self.releases if r.channel == "stable"), key=lambda r: r.version)


def matrix_from_data(data: dict[str, Any]) -> Matrix:
    variants = {
        name: VariantInfo(
            name=name,
            cuda=v.get("cuda", ""),
            family_min_driver=v.get("family_min_driver"),
            toolkit_driver=v.get("toolkit_driver"),
            lacks=tuple(v.get("lacks", ())),
            nightly_only=bool(v.get("nightly_only", False)),
        )
        for name, v in data["variant"].items()
    }
    releases = tuple(
        Release(
            torch=r["torch"],
            channel=r["channel"],
            torchvision=r["torchvision"],
            torchaudio=r["torchaudio"],
            python=(r["python"][0], r["python"][1]),
            variants={"x86_64": tuple(r["x86_64"]), "aarch64": tuple(r["aarch64"])},
            aarch64_confidence=r["aarch64_confidence"],
            pypi_default=dict(r["pypi_default"]),
            glibc=r["glibc"],
            glibc_by_variant=dict(r.get("glibc_by_variant", {})),
            source=r["source"],
        )
        for r in data["release"]
    )
    arch_lists = tuple(
        ArchList(
            variant=a["variant"],
            platform=a["platform"],
            torch=SpecifierSet(a["torch"], prereleases=True),
            sm=tuple(a["sm"]),
            ptx=tuple(a.get("ptx", ())),
            confidence=a.get("confidence", "P"),
            source=a["source"],
        )
        for a in data["arch_list"]
    )
    return Matrix(
        as_of=data["as_of"],
        index=dict(data["index"]),
        variants=variants,
        no_index=dict(data["no_index"]),
        nightly=dict(data["nightly"]),
        releases=releases,
        arch_lists=arch_lists,
        gpu_cc=dict(data["gpu"]),
    )


@lru_cache(maxsize=1)
def load_matrix() -> Matrix:
    """The matrix shipped in the package (read once)."""
    text = files("envbuilder").joinpath("data/torch_matrix.toml").read_text(encoding="utf-8")
    return matrix_from_data(loads(text))


def gpu_capability(gpu: Gpu, m: Optional[Matrix] = None) -> Optional[str]:
    """A GPU's compute capability: as reported, else looked up from its model name."""
    if gpu.compute_capability:
        return gpu.compute_capability
    table = (m or load_matrix()).gpu_cc
    # Longest key first so "GH200" wins over "H200" and "RTX 5090" over nothing shorter.
    for key in sorted(table, key=len, reverse=True):
        if re.search(r"(?<![A-Za-z0-9])" + re.escape(key) + r"(?![0-9])", gpu.name):
            return table[key]
    return None


def covers(entry: ArchList, cc: str) -> tuple[bool, bool]:
    """(runs, needs_jit): SASS of the same major and lower-or-equal minor runs; PTX of an older arch JITs."""
    major, minor = minor_tuple(cc)
    for sm in entry.sm:
        smaj, smin = minor_tuple(sm)
        if smaj == major and smin <= minor:
            return True, False
    for ptx in entry.ptx:
        if minor_tuple(ptx) <= (major, minor):
            return True, True
    return False, False


def minor_tuple(version: str) -> tuple[int, int]:
    parts = re.findall(r"\d+", version)
    return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
