"""The AMD (ROCm) and Intel (XPU) part of the wheel matrix (pure): which ROCm/XPU builds each release has, the gfx
targets of each ROCm build, the ROCm user space each AMD kernel driver runs, and the Intel GPU families each XPU
build supports. Read from the ``[vendor]`` tables of ``data/torch_matrix.toml``; every row keeps its source, day and
confidence so the resolver can say how sure a gate is. None of it has run on AMD or Intel hardware here."""

from __future__ import annotations

import re
from dataclasses import field
from typing import Any, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from envbuilder.core.facts import Gpu
from envbuilder.core.structs import dataclass


@dataclass(frozen=True)
class Sourced:
    source: str = ""
    checked: str = ""
    confidence: str = "P"


@dataclass(frozen=True)
class Builds:
    """The ROCm variants and the XPU build of the releases ``torch`` matches."""

    torch: SpecifierSet
    rocm: tuple[str, ...]
    xpu: bool
    why: Sourced


@dataclass(frozen=True)
class GfxList:
    variants: tuple[str, ...]
    torch: SpecifierSet
    gfx: tuple[str, ...]
    why: Sourced


@dataclass(frozen=True)
class Kmd:
    """One ROCm release's kernel driver: the module versions it reports and the ROCm user space it runs."""

    rocm: str
    module: tuple[str, ...]
    package: str
    runs: tuple[str, ...]
    why: Sourced


@dataclass(frozen=True)
class XpuDevice:
    family: str
    title: str
    pci: tuple[str, ...]
    names: tuple[str, ...]
    why: Sourced


@dataclass(frozen=True)
class XpuSupport:
    torch: SpecifierSet
    families: tuple[str, ...]
    why: Sourced


@dataclass(frozen=True)
class VendorTable:
    builds: tuple[Builds, ...] = ()
    gfx: tuple[GfxList, ...] = ()
    amd_gpu: dict[str, str] = field(default_factory=dict)
    amd_gpu_why: Sourced = Sourced()
    kmd: tuple[Kmd, ...] = ()
    xpu_devices: tuple[XpuDevice, ...] = ()
    xpu_support: tuple[XpuSupport, ...] = ()
    xpu_driver: str = ""
    xpu_driver_why: Sourced = Sourced()

    def builds_of(self, torch: str) -> Optional[Builds]:
        v = Version(torch)
        return next((b for b in self.builds if v in b.torch), None)

    def gfx_list(self, variant: str, torch: str) -> Optional[GfxList]:
        v = Version(torch)
        return next((g for g in self.gfx if variant in g.variants and v in g.torch), None)

    def kmd_of(self, driver: str) -> Optional[Kmd]:
        """The ROCm release whose kernel driver reports ``driver`` (module version or amdgpu-install package
        line): the longest prefix the table knows wins."""
        best: Optional[tuple[int, Kmd]] = None
        for row in self.kmd:
            for prefix in (*row.module, *((row.package + ".",) if row.package else ())):
                hit = driver.startswith(prefix) or driver == prefix.rstrip(".")
                if hit and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), row)
        return best[1] if best else None

    def xpu_families(self, torch: str) -> Optional[XpuSupport]:
        v = Version(torch)
        return next((s for s in self.xpu_support if v in s.torch), None)

    def xpu_device(self, family: str) -> Optional[XpuDevice]:
        return next((d for d in self.xpu_devices if d.family == family), None)


def _why(row: dict[str, Any]) -> Sourced:
    return Sourced(row.get("source", ""), row.get("checked", ""), row.get("confidence", "P"))


def _spec(text: str) -> SpecifierSet:
    return SpecifierSet(text, prereleases=True)


def vendor_from_data(data: dict[str, Any]) -> VendorTable:
    """The ``[vendor]`` tables of the matrix (an empty table where the data has none)."""
    if not data:
        return VendorTable()
    amd = dict(data.get("amd_gpu", {}))
    amd_why = _why(amd)
    for key in ("source", "checked", "confidence"):
        amd.pop(key, None)
    driver = data.get("xpu_driver", {})
    return VendorTable(
        builds=tuple(
            Builds(_spec(b["torch"]), tuple(b["rocm"]), bool(b.get("xpu", False)), _why(b))
            for b in data.get("builds", ())
        ),
        gfx=tuple(
            GfxList(tuple(g["variant"]), _spec(g["torch"]), tuple(g["gfx"]), _why(g))
            for g in data.get("gfx", ())
        ),
        amd_gpu=amd,
        amd_gpu_why=amd_why,
        kmd=tuple(
            Kmd(k["rocm"], tuple(k.get("module", ())), k.get("package", ""), tuple(k["runs"]), _why(k))
            for k in data.get("kmd", ())
        ),
        xpu_devices=tuple(
            XpuDevice(d["family"], d["title"], tuple(d["pci"]), tuple(d.get("names", ())), _why(d))
            for d in data.get("xpu_device", ())
        ),
        xpu_support=tuple(
            XpuSupport(_spec(s["torch"]), tuple(s["families"]), _why(s)) for s in data.get("xpu_support", ())
        ),
        xpu_driver=driver.get("needs", ""),
        xpu_driver_why=_why(driver),
    )


def gfx_of(gpu: Gpu, table: VendorTable) -> Optional[str]:
    """An AMD GPU's gfx target: as reported (``gfx90a:sramecc+:xnack-`` -> ``gfx90a``), else from its model name."""
    if gpu.arch:
        return gpu.arch.split(":")[0]
    for key in sorted(table.amd_gpu, key=len, reverse=True):
        if re.search(r"(?<![A-Za-z0-9])" + re.escape(key) + r"(?![0-9A-Za-z])", gpu.name):
            return table.amd_gpu[key]
    return None


def xpu_family_of(gpu: Gpu, table: VendorTable) -> Optional[str]:
    """An Intel GPU's family: as reported, else from the PCI device ids and names the table knows for each."""
    if gpu.arch:
        return gpu.arch
    text = gpu.name.lower()
    pci = set(re.findall(r"0x[0-9a-f]{4}", text))  # a GPU the probe names by its PCI device id
    for device in table.xpu_devices:
        if pci & set(device.pci) or any(name.lower() in text for name in device.names):
            return device.family
    return None


def rocm_order(version: str) -> tuple[int, int]:
    parts = [int(x) for x in re.findall(r"\d+", version)[:2]]
    return (parts[0], parts[1] if len(parts) > 1 else 0)
