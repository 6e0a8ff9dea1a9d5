"""The gates of AMD (ROCm) and Intel (XPU) builds (pure), beside the CUDA ones in :mod:`gates`: the build exists for
the release, the node's GPUs are the vendor's, its gfx target (AMD) or device family (Intel) is in the build's list,
and its kernel driver runs the build's ROCm user space (AMD) or it has the Level Zero runtime (Intel). ``auto``
picks among the builds the node can run. The messages follow the CUDA gates' wording.

None of this has run on AMD or Intel hardware here: every plan for such a build says so."""

from __future__ import annotations

from typing import Optional

from envbuilder.core.facts import HostFacts
from envbuilder.resolver.gates import Finding
from envbuilder.resolver.matrix import Matrix, Release, VariantInfo
from envbuilder.resolver.vendortable import gfx_of, rocm_order, xpu_family_of

#: What every ROCm/XPU plan and validation says.
NEW_SUPPORT = "support for ROCm/XPU is new and has not run on such hardware here"
_VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}


def vendor_of(info: VariantInfo) -> str:
    """The GPU vendor a variant's wheels run on ("" for the CPU build)."""
    if info.rocm:
        return "amd"
    if info.xpu:
        return "intel"
    return "nvidia" if info.is_cuda else ""


def offered(release: Release, arch: str, m: Matrix) -> list[str]:
    """The ROCm variants of ``release`` on ``arch`` (the table's, and those the index listed), newest ROCm first,
    then ``xpu`` where the release has it."""
    listed = [v for v in release.variants.get(arch, ()) if v in m.variants and not m.variants[v].is_cuda]
    table = [*release.rocm, *(("xpu",) if release.xpu else ())] if arch == "x86_64" else []
    names = [v for v in dict.fromkeys([*table, *listed]) if v in m.variants]
    rocm = sorted((v for v in names if m.variants[v].rocm), key=lambda v: rocm_order(m.variants[v].rocm))
    return [*reversed(rocm), *(v for v in names if m.variants[v].xpu)]


def vendor_findings(
    release: Release, variant: str, facts: HostFacts, m: Matrix, *, warnings: list[str]
) -> list[Finding]:
    """Every gate of a ROCm or XPU ``variant`` on the target, and the vendor gate of any GPU variant."""
    info = m.variants[variant]
    want = vendor_of(info)
    have = facts.gpu_vendor
    if want and have and have != want:
        return [_vendor_mismatch(release, variant, facts, m, want=want)]
    if want in ("", "nvidia"):
        return []
    warnings.append(f"{NEW_SUPPORT} ({variant})")
    arch = facts.arch or "x86_64"
    builds = offered(release, arch, m)
    if variant not in builds:
        with_it = [r.torch for r in m.stable_releases() if variant in offered(r, arch, m)]
        span = f"{with_it[0]}–{with_it[-1]}" if with_it else ""
        return [
            Finding(
                "variant-not-built",
                f"torch {release.torch} has no {variant} build for {arch} "
                f"(it offers {', '.join(builds) or 'none of ROCm or XPU'})"
                + (f"; {variant} exists for torch {span}" if span else ""),
                f"use one of {', '.join(builds)} with torch {release.torch}" if builds else None,
            )
        ]
    if want == "amd":
        return [
            *gfx_findings(release, variant, facts, m, warnings=warnings),
            *kmd_findings(info, facts, m, warnings=warnings, release=release),
        ]
    return xpu_findings(release, facts, m, warnings=warnings)


def _vendor_mismatch(release: Release, variant: str, facts: HostFacts, m: Matrix, *, want: str) -> Finding:
    have = facts.gpu_vendor or "nvidia"
    gpu = facts.gpus[0].name if facts.gpus else "GPU"
    fits = [v for v in offered(release, facts.arch or "x86_64", m) if vendor_of(m.variants[v]) == have]
    if have == "nvidia":
        hint = 'use variant = "auto" (it picks the CUDA build for this driver) or a cuNNN variant'
    else:
        hint = f"use one of {', '.join(fits)} with torch {release.torch}" if fits else 'use variant = "auto"'
    return Finding(
        "gpu-arch",
        f"{variant} wheels run on {_VENDOR_NAMES[want]} GPUs; the target's GPUs are {_VENDOR_NAMES[have]} ({gpu})",
        hint,
    )


def gfx_findings(
    release: Release, variant: str, facts: HostFacts, m: Matrix, *, warnings: list[str]
) -> list[Finding]:
    """AMD GPUs whose gfx target the ROCm build does not carry (same wording as the CUDA arch gate)."""
    entry = m.vendor.gfx_list(variant, release.torch)
    if entry is None:
        warnings.append(f"no gfx list known for torch {release.torch} {variant}; GPU support unchecked")
        return []
    if entry.why.confidence != "P":
        warnings.append(
            f"the {variant} gfx list for torch {release.torch} comes from a secondary source ({entry.why.source})"
        )
    findings = []
    seen = set()
    for gpu in facts.gpus or ():
        gfx = gfx_of(gpu, m.vendor)
        if gfx is None:
            warnings.append(f"gfx target of {gpu.name!r} unknown; GPU support unchecked")
            continue
        if gfx in seen or gfx in entry.gfx:
            continue
        seen.add(gfx)
        fix = [v for v in offered(release, "x86_64", m) if _carries(m, v, release.torch, gfx)]
        findings.append(
            Finding(
                "gpu-arch",
                f"{gpu.name} is {gfx}, which torch {release.torch} {variant} does not carry (it has "
                f"{', '.join(entry.gfx)})",
                f"use {fix[0]} with torch {release.torch}" if fix else _newest_with(gfx, m),
            )
        )
    return findings


def _carries(m: Matrix, variant: str, torch: str, gfx: str) -> bool:
    entry = m.vendor.gfx_list(variant, torch)
    return entry is not None and gfx in entry.gfx


def _newest_with(gfx: str, m: Matrix) -> str:
    for rel in reversed(m.stable_releases()):
        for v in offered(rel, "x86_64", m):
            if _carries(m, v, rel.torch, gfx):
                return f"the newest release with {gfx} code is torch {rel.torch} with {v}"
    return f"no PyTorch ROCm wheel carries {gfx}; build from source with PYTORCH_ROCM_ARCH={gfx}"


def kmd_findings(
    info: VariantInfo, facts: HostFacts, m: Matrix, *, warnings: list[str], release: Release
) -> list[Finding]:
    """The ROCm runtime inside the wheel against the node's AMD kernel driver: newer than it runs is refused."""
    driver = facts.amdgpu_version
    if not driver:
        warnings.append(
            f"AMD kernel driver unknown; {info.name} needs one that runs ROCm {info.rocm} user space "
            "(checked at validation)"
        )
        return []
    kmd = m.vendor.kmd_of(driver)
    if kmd is None:
        warnings.append(
            f"unknown: amdgpu driver {driver} is not in the table, so the driver gate cannot be checked for "
            f"{info.name}; validation checks it on the node"
        )
        return []
    if kmd.why.confidence != "P":
        warnings.append(
            f"amdgpu {driver} is taken for ROCm {kmd.rocm}'s driver, which runs ROCm {', '.join(kmd.runs)} "
            f"({kmd.why.source})"
        )
    if rocm_order(info.rocm) <= max(rocm_order(r) for r in kmd.runs):
        if rocm_order(info.rocm) < min(rocm_order(r) for r in kmd.runs):
            warnings.append(f"ROCm {info.rocm} is older than the user space amdgpu {driver} was tested with")
        return []
    ok = [v for v in offered(release, "x86_64", m) if m.variants[v].rocm and m.variants[v].rocm in kmd.runs]
    return [
        Finding(
            "driver",
            f"{info.name} wheels need an AMD kernel driver that runs ROCm {info.rocm}; the target's driver is "
            f"amdgpu {driver} (ROCm {kmd.rocm}'s, which runs ROCm {kmd.runs[0]}–{kmd.runs[-1]})",
            f"use {ok[0]} with torch {release.torch}" if ok else _older_release(kmd.runs, m),
        )
    ]


def _older_release(runs: tuple[str, ...], m: Matrix) -> str:
    """The newest release with a ROCm build this driver runs, or the site's newer driver."""
    for rel in reversed(m.stable_releases()):
        fits = [v for v in offered(rel, "x86_64", m) if m.variants[v].rocm in runs]
        if fits:
            return f"pin torch {rel.torch} with {fits[0]}, or ask the site for a newer amdgpu driver"
    return "ask the site for a newer amdgpu driver"


def xpu_findings(release: Release, facts: HostFacts, m: Matrix, *, warnings: list[str]) -> list[Finding]:
    """Intel GPUs outside the families the XPU build is validated on, and a node without Level Zero."""
    findings = []
    support = m.vendor.xpu_families(release.torch)
    if support is None:
        warnings.append(f"no Intel GPU list known for torch {release.torch} xpu; GPU support unchecked")
    for gpu in facts.gpus or ():
        family = xpu_family_of(gpu, m.vendor) if support is not None else None
        if support is None:
            break
        if family is None:
            warnings.append(f"Intel GPU family of {gpu.name!r} unknown; GPU support unchecked")
            break
        if family not in support.families:
            device = m.vendor.xpu_device(family)
            findings.append(
                Finding(
                    "gpu-arch",
                    f"{gpu.name} is {device.title if device else family}, which torch {release.torch} xpu does "
                    f"not support (it supports {', '.join(support.families)})",
                    "PyTorch's XPU builds cover the families of its 'Getting Started on Intel GPU' page; "
                    "use Intel's own builds for this GPU",
                )
            )
            break
    if facts.level_zero == "":
        findings.append(
            Finding(
                "driver",
                f"xpu wheels need {m.vendor.xpu_driver or 'the Intel GPU driver with Level Zero'}; the target has "
                "no Level Zero runtime",
                "ask the site for the Intel GPU driver (compute runtime and Level Zero loader) on the nodes",
            )
        )
    elif facts.level_zero is None and facts.gpus:
        warnings.append("Level Zero runtime unknown; xpu needs it (checked at validation)")
    return findings


def auto_variant(release: Release, facts: HostFacts, m: Matrix, notes: list[str]) -> Optional[str]:
    """``auto`` on an AMD or Intel node: the newest ROCm build (or the XPU build) that passes the gates, else the
    newest one so the gates explain why; None on other nodes."""
    vendor = facts.gpu_vendor
    if vendor not in ("amd", "intel"):
        return None
    builds = [v for v in offered(release, facts.arch or "x86_64", m) if vendor_of(m.variants[v]) == vendor]
    for v in builds:
        if not vendor_findings(release, v, facts, m, warnings=[]):
            notes.append(
                f"variant auto: {v} ({_VENDOR_NAMES[vendor]} GPU {facts.gpus[0].name if facts.gpus else ''}) "
                f"from {', '.join(builds)}"
            )
            return v
    if builds:
        return builds[0]
    # The release has no such build: the newest the table knows, so the variant gate names the releases with it.
    rocm = sorted((i for i in m.variants.values() if i.rocm), key=lambda i: rocm_order(i.rocm))
    return rocm[-1].name if vendor == "amd" and rocm else "xpu"
