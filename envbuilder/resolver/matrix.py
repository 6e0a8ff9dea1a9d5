"""The wheel matrix: which PyTorch wheels exist for which CUDA variant, CPU arch, Python and glibc, the GPU code
each carries, and the NVIDIA driver each CUDA major needs. Loaded once from package data; pure lookups.

Every row of the shipped table carries its ``source`` and the day it was ``checked``; the loader keeps both so
that plan output and ``doctor`` can say how old a fact is."""

from __future__ import annotations

import re
from dataclasses import field
from datetime import date
from functools import lru_cache
from importlib.resources import files
from typing import Any, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from envbuilder.core._toml import loads_shipped
from envbuilder.core.facts import Gpu
from envbuilder.core.structs import dataclass
from envbuilder.resolver.vendortable import VendorTable, vendor_from_data


@dataclass(frozen=True)
class VariantInfo:
    name: str
    cuda: str  # "" for cpu
    family_min_driver: Optional[str]
    toolkit_driver: Optional[str]
    lacks: tuple[str, ...] = ()
    nightly_only: bool = False
    source: str = ""
    #: The day this row was last checked against its source (YYYY-MM-DD; "" where the data gives none).
    checked: str = ""
    #: Not in the table: an index lists it, and its facts follow from its name (knowledge.inferred_variant).
    inferred: bool = False
    #: The ROCm release of a ``rocmX.Y`` build ("" for others).
    rocm: str = ""
    #: An Intel XPU build.
    xpu: bool = False

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
    #: The day this row was last checked against its source ("" for a release read from an index).
    checked: str = ""
    #: "table" (the shipped table), "index" (confirmed by the index read) or "inferred" (newer than the table).
    origin: str = "table"
    #: The day the release reached PyPI, where the table knows it.
    released: Optional[str] = None
    #: Free-threaded CPython builds with Linux wheels ("3.14t"), where the table knows them.
    free_threaded: tuple[str, ...] = ()
    #: The ROCm variants and whether an XPU build exists (x86_64), per the table's [vendor.builds].
    rocm: tuple[str, ...] = ()
    xpu: bool = False

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
    checked: str = ""


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
    #: CPU architectures with no Linux torch wheel anywhere (PyPI or download.pytorch.org) -> why.
    no_wheels: dict[str, str] = field(default_factory=dict)
    #: CPU architectures with CPU-only torch wheels (download.pytorch.org/whl/cpu), no CUDA build -> why.
    cpu_only: dict[str, str] = field(default_factory=dict)
    #: (source, checked) of the keyed rows: "no_index.cu131", "no_wheels.ppc64le", "cpu_only.s390x".
    provenance: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: The AMD (ROCm) and Intel (XPU) facts.
    vendor: VendorTable = field(default_factory=VendorTable)

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

    def newest_with_variant(self, variant: str, arch: str) -> Optional[Release]:
        """The newest stable release of the table that offers ``variant`` on ``arch``. "cpu" counts as offered
        wherever the table lists the architecture at all (x86_64, aarch64)."""
        for rel in reversed(self.stable_releases()):
            offered = rel.variants.get(arch)
            if offered is not None and (variant == "cpu" or variant in offered):
                return rel
        return None

    def age_days(self, today: date) -> int:
        """Days from the table's ``as_of`` to ``today`` (negative when ``today`` is earlier)."""
        return (today - date.fromisoformat(self.as_of)).days


def _keyed_rows(data: dict[str, Any], table: str, provenance: dict[str, tuple[str, str]]) -> dict[str, str]:
    """A table of name -> reason; each entry is a {reason, source, checked} table or a plain string."""
    out: dict[str, str] = {}
    for name, row in data.get(table, {}).items():
        if isinstance(row, dict):
            out[name] = row["reason"]
            provenance[f"{table}.{name}"] = (row.get("source", ""), row.get("checked", ""))
        else:
            out[name] = str(row)
    return out


def matrix_from_data(data: dict[str, Any]) -> Matrix:
    variants = {
        name: VariantInfo(
            name=name,
            cuda=v.get("cuda", ""),
            family_min_driver=v.get("family_min_driver"),
            toolkit_driver=v.get("toolkit_driver"),
            lacks=tuple(v.get("lacks", ())),
            nightly_only=bool(v.get("nightly_only", False)),
            source=v.get("source", ""),
            checked=v.get("checked", ""),
            rocm=v.get("rocm", ""),
            xpu=bool(v.get("xpu", False)),
        )
        for name, v in data["variant"].items()
    }
    vendor = vendor_from_data(data.get("vendor", {}))
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
            checked=r.get("checked", ""),
            released=r.get("released"),
            free_threaded=tuple(r.get("free_threaded", ())),
            **_vendor_builds(vendor, r["torch"]),
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
            checked=a.get("checked", ""),
        )
        for a in data["arch_list"]
    )
    provenance: dict[str, tuple[str, str]] = {}
    return Matrix(
        as_of=data["as_of"],
        index=dict(data["index"]),
        variants=variants,
        no_index=_keyed_rows(data, "no_index", provenance),
        nightly=dict(data["nightly"]),
        releases=releases,
        arch_lists=arch_lists,
        gpu_cc=dict(data["gpu"]),
        no_wheels=_keyed_rows(data, "no_wheels", provenance),
        cpu_only=_keyed_rows(data, "cpu_only", provenance),
        provenance=provenance,
        vendor=vendor,
    )


def _vendor_builds(vendor: VendorTable, torch: str) -> dict[str, Any]:
    builds = vendor.builds_of(torch)
    return {"rocm": builds.rocm, "xpu": builds.xpu} if builds else {}


@lru_cache(maxsize=1)
def load_matrix() -> Matrix:
    """The matrix shipped in the package (read once)."""
    text = files("envbuilder").joinpath("data/torch_matrix.toml").read_text(encoding="utf-8")
    return matrix_from_data(loads_shipped(text))


def table_age(today: Optional[date] = None) -> str:
    """How old the shipped table is, in words ("94 days old")."""
    days = load_matrix().age_days(today or date.today())
    return f"{days} day{'s' if days != 1 else ''} old"


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
