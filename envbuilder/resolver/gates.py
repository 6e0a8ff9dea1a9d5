"""The resolver's gates (pure): each checks one way a torch wheel can fail on the target machine (no wheel for the
CPU architecture at all, variant not built, no CUDA wheel for aarch64, Python, glibc, driver, GPU arch, a missing
companion package) and returns
Findings with a message and a suggested fix. wheels.resolve decides whether a finding is an error or, where the
recipe allows the gate, a warning."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

from envbuilder.core.errors import ResolverError, ResolverErrors
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.recipe.schema import TORCH_PACKAGES
from envbuilder.resolver.matrix import (
    ArchList,
    Matrix,
    Release,
    VariantInfo,
    covers,
    gpu_capability,
    minor_tuple,
)

if TYPE_CHECKING:  # only types here: the sections arrive loaded
    from envbuilder.recipe.sections import Conda, Torch


@dataclass(frozen=True)
class TorchRequest:
    #: "latest", a minor ("2.7"), an exact release ("2.7.1"), or a dated nightly ("2.15.0.dev20260801").
    version: str = "latest"
    #: "auto", "cpu", or a CUDA variant ("cu126").
    variant: str = "auto"
    channel: str = "stable"
    packages: tuple[str, ...] = TORCH_PACKAGES
    #: Explicit companion versions (required for nightlies; optional otherwise).
    torchvision: Optional[str] = None
    torchaudio: Optional[str] = None
    allow: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Finding:
    gate: str
    message: str
    hint: Optional[str] = None


def python_ok(release_range: tuple[str, str], python: Optional[str]) -> bool:
    if not python:
        return True
    lo, hi = (minor_tuple(v) for v in release_range)
    return lo <= minor_tuple(python) <= hi


def driver_max_cuda(facts: HostFacts, m: Matrix) -> Optional[tuple[int, int]]:
    if facts.max_cuda:
        return minor_tuple(facts.max_cuda)
    if not facts.driver_version:
        return None
    # The newest CUDA whose toolkit driver this driver meets.
    best: Optional[tuple[int, int]] = None
    for info in m.variants.values():
        if info.toolkit_driver and ver(facts.driver_version) >= ver(info.toolkit_driver):
            cand = minor_tuple(info.cuda)
            best = cand if best is None or cand > best else best
    return best


def ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def platform_findings(variant: str, facts: HostFacts, m: Matrix) -> list[Finding]:
    """The target's CPU architecture has no torch wheel at all (ppc64le, riscv64, ...), or only CPU ones (s390x)
    while ``variant`` is a CUDA one. Nothing else can be planned there, so this gate is checked first."""
    arch = facts.arch
    if not arch:
        return []
    if arch in m.no_wheels:
        return [
            Finding(
                "platform",
                f"PyTorch publishes no torch wheel for Linux {arch} ({m.no_wheels[arch]}), CPU or CUDA: neither "
                "PyPI nor download.pytorch.org has one",
                f'use conda-forge\'s pytorch where it is built for {arch} (env.kind = "conda"), a torch the site '
                'provides (env.kind = "overlay"), or build torch from source',
            )
        ]
    info = m.variants.get(variant)
    if arch in m.cpu_only and info is not None and info.is_cuda:
        return [
            Finding(
                "platform",
                f"PyTorch publishes no CUDA torch wheel for Linux {arch} ({m.cpu_only[arch]}), so no {variant} "
                "build: its torch wheels are CPU-only, on download.pytorch.org/whl/cpu",
                'use variant = "cpu"',
            )
        ]
    return []


def check_gates(
    release: Release,
    variant: str,
    request: TorchRequest,
    facts: HostFacts,
    m: Matrix,
    *,
    warnings: list[str],
) -> list[Finding]:
    blocked = platform_findings(variant, facts, m)
    if blocked:
        # Every other gate would only restate that no wheel exists.
        return blocked
    findings: list[Finding] = []
    info = m.variants[variant]
    arch = facts.arch or "x86_64"
    if not facts.arch:
        warnings.append("target CPU architecture unknown; assuming x86_64")
    if info.is_cuda:
        findings.extend(offered_findings(release, variant, request, facts, m, warnings=warnings, arch=arch))
    findings.extend(package_findings(release, variant, info, request))
    findings.extend(interpreter_findings(release, variant, facts, m))
    if info.is_cuda:
        findings.extend(driver_findings(release, info, facts, m, warnings=warnings, arch=arch))
        findings.extend(gpu_findings(release, variant, facts, m, warnings=warnings, arch=arch))
    elif facts.gpus and variant == "cpu":
        warnings.append(
            f"the target has {len(facts.gpus)} GPU(s) ({facts.gpus[0].name}) but the CPU wheel was chosen"
        )
    elif variant != "cpu" and not (info.rocm or info.xpu):  # ROCm and XPU: vendors.vendor_findings
        warnings.append(
            f"unknown: envbuilder has no GPU facts for {variant}, so the GPU gate cannot be checked"
        )
    return findings


def offered_findings(
    release: Release,
    variant: str,
    request: TorchRequest,
    facts: HostFacts,
    m: Matrix,
    *,
    warnings: list[str],
    arch: str,
) -> list[Finding]:
    """Whether this release has the CUDA ``variant`` on this CPU architecture (on the stable index)."""
    offered = release.variants.get(arch, ())
    if variant in offered:
        if arch == "aarch64" and release.aarch64_confidence != "P":
            warnings.append(
                f"the {variant} aarch64 CUDA wheel for torch {release.torch} is known only from a secondary "
                f"source ({release.source}); validation will confirm torch.version.cuda"
            )
        if m.variants[variant].nightly_only:
            return [Finding("variant-not-built", f"{variant} exists only on the nightly index")]
        return []
    if arch == "aarch64":
        return [aarch64_finding(release, variant, request, facts, m)]
    have = [r.torch for r in m.stable_releases() if variant in r.variants.get(arch, ())]
    span = f"{have[0]}–{have[-1]}" if have else "no stable release"
    # Only the variants that also pass this node's driver and GPU gates are worth suggesting.
    fits = [v for v in offered if not quick_findings(release, v, facts, m)]
    options = [f"use one of {', '.join(fits)} with torch {release.torch}"] if fits else []
    if have:
        options.append(f"pin a torch in {span}")
    return [
        Finding(
            "variant-not-built",
            f"torch {release.torch} has no {variant} build for {arch} "
            f"(it offers {', '.join(offered) or 'none'}); "
            + (f"{variant} exists for torch {span}" if have else f"no release has {variant} for {arch}"),
            ", or ".join(options) or None,
        )
    ]


def package_findings(
    release: Release, variant: str, info: VariantInfo, request: TorchRequest
) -> list[Finding]:
    """Companion packages that the variant's index does not carry, or the release never had."""
    findings = []
    for pkg in request.packages:
        if pkg in info.lacks:
            findings.append(
                Finding(
                    "package-missing",
                    f"the {variant} index has no {pkg} wheel",
                    f"drop {pkg} from torch.packages, or choose another variant",
                )
            )
        if pkg == "torchvision" and not (request.torchvision or release.torchvision):
            findings.append(
                Finding(
                    "package-missing",
                    f"no torchvision version is known for torch {release.torch}",
                    "set torch.torchvision explicitly or drop it from torch.packages",
                )
            )
        if pkg == "torchaudio" and not (request.torchaudio or release.torchaudio):
            findings.append(
                Finding(
                    "package-missing",
                    f"no torchaudio version is known for torch {release.torch}",
                    "set torch.torchaudio explicitly or drop it from torch.packages",
                )
            )
    return findings


def interpreter_findings(release: Release, variant: str, facts: HostFacts, m: Matrix) -> list[Finding]:
    """The target's Python and glibc against the release's wheels."""
    findings = []
    if facts.python and not python_ok(release.python, facts.python):
        fitting = [r.torch for r in m.stable_releases() if python_ok(r.python, facts.python)]
        findings.append(
            Finding(
                "python",
                f"torch {release.torch} supports Python {release.python[0]}–{release.python[1]}, "
                f"the target has Python {facts.python}",
                f"load a Python {release.python[0]}–{release.python[1]} module, or pin torch "
                + (
                    f"{fitting[-1]} (the newest for Python {facts.python_minor})"
                    if fitting
                    else "to another release"
                ),
            )
        )
    floor = release.glibc_by_variant.get(variant, release.glibc)
    if facts.glibc and ver(facts.glibc) < ver(floor):
        findings.append(
            Finding(
                "glibc",
                f"torch {release.torch} {variant} wheels need glibc ≥ {floor} (manylinux), "
                f"the target has glibc {facts.glibc}",
                "use a torch release built on manylinux2014 (≤ 2.5, or 2.6 with cu118/cu124), or a container",
            )
        )
    return findings


def aarch64_finding(
    release: Release, variant: str, request: TorchRequest, facts: HostFacts, m: Matrix
) -> Finding:
    offered = release.variants.get("aarch64", ())
    options = []
    working = [v for v in offered if not quick_findings(release, v, facts, m)]
    if working:
        options.append(f"use {working[0]} with torch {release.torch}")
    else:
        # The first newer stable release with an aarch64 CUDA wheel that fits this node.
        for rel in m.stable_releases():
            if rel.version <= release.version:
                continue
            fits = [v for v in rel.variants.get("aarch64", ()) if not quick_findings(rel, v, facts, m)]
            if fits:
                options.append(
                    f"use torch {rel.torch} with {fits[0]} (the first release with a fitting aarch64 CUDA wheel)"
                )
                break
    with_variant = [r.torch for r in m.stable_releases() if variant in r.variants.get("aarch64", ())]
    if with_variant and with_variant[-1] != release.torch:
        options.append(f"torch {with_variant[-1]} with {variant}")
    if variant in m.nightly.get("aarch64", ()):
        options.append(f"the nightly {variant} index with a dated pin")
    if not options:
        options.append(
            "a torch release with aarch64 CUDA wheels (cu128 in 2.7, cu129 in 2.8, several from 2.9)"
        )
    return Finding(
        "aarch64-no-cuda-wheel",
        f"the stable {variant} index has no aarch64 CUDA wheel of torch {release.torch}: pip would install a "
        "CPU-only torch (the Vista cu124 trap)",
        " or ".join(options),
    )


def driver_findings(
    release: Release, info: VariantInfo, facts: HostFacts, m: Matrix, *, warnings: list[str], arch: str
) -> list[Finding]:
    max_cuda = driver_max_cuda(facts, m)
    if facts.driver_version is None and max_cuda is None:
        warnings.append(
            f"NVIDIA driver unknown; {info.name} needs driver ≥ {info.family_min_driver} (checked at validation)"
        )
        return []
    shown = facts.driver_version or f"supporting CUDA ≤ {facts.max_cuda}"
    if info.family_min_driver is None and not facts.max_cuda:
        # A CUDA major the table has no driver floor for: the table's toolkit drivers cannot say this driver is
        # too old for it, only the driver's own report (max_cuda) could.
        warnings.append(
            f"unknown: no driver floor is known for CUDA {info.cuda_major}.x ({info.name}), so the driver gate "
            f"cannot be checked for driver {shown}; validation checks it on the node"
        )
        return []
    if not driver_ok(info, facts, max_cuda):
        ok = [
            v
            for v in release.variants.get(arch, ())
            if m.variants[v].is_cuda and driver_ok(m.variants[v], facts, max_cuda)
        ]
        hint = f"use {ok[-1]} with torch {release.torch}" if ok else "ask the site for a newer driver"
        return [
            Finding(
                "driver",
                f"{info.name} wheels need an NVIDIA driver "
                + (f"≥ {info.family_min_driver}" if info.family_min_driver else "for")
                + f" (CUDA {info.cuda_major}.x); "
                f"the target's driver is {shown}",
                hint,
            )
        ]
    if max_cuda is not None and max_cuda < minor_tuple(info.cuda):
        warnings.append(
            f"driver {shown} is older than CUDA {info.cuda}'s own driver: {info.name} runs under minor-version "
            "compatibility (prebuilt kernels work; PTX JIT of newer PTX does not)"
        )
    return []


def driver_ok(info: VariantInfo, facts: HostFacts, max_cuda: Optional[tuple[int, int]]) -> bool:
    if facts.driver_version and info.family_min_driver:
        return ver(facts.driver_version) >= ver(info.family_min_driver)
    if info.family_min_driver is None and not facts.max_cuda:
        return (
            True  # no floor known (a CUDA major newer than the table): only the driver's own report could say
        )
    if max_cuda is not None and info.cuda_major is not None:
        return max_cuda[0] >= info.cuda_major
    return True


def gpu_findings(
    release: Release, variant: str, facts: HostFacts, m: Matrix, *, warnings: list[str], arch: str
) -> list[Finding]:
    """GPUs the planned wheel has no code for. When ``variant`` is not built for this release (the variant gate
    says so), a GPU is still reported here if *no* build of the release carries it: no other variant helps."""
    if not facts.gpus:
        return []
    built = variant in release.variants.get(arch, ())
    entry = m.arch_list(variant, arch, release.torch)
    if entry is None and built:
        warnings.append(
            f"no arch list known for torch {release.torch} {variant} on {arch}; GPU support unchecked"
        )
        return []
    if entry is not None and entry.confidence != "P":
        warnings.append(
            f"the {variant} arch list for torch {release.torch} comes from a secondary source ({entry.source})"
        )
    findings = []
    seen = set()
    for gpu in facts.gpus:
        cc = gpu_capability(gpu, m)
        if cc is None:
            warnings.append(f"compute capability of {gpu.name!r} unknown; GPU support unchecked")
            continue
        if cc in seen:
            continue
        seen.add(cc)
        sm = "sm_" + cc.replace(".", "")
        if entry is not None:
            runs, jit = covers(entry, cc)
            if runs and jit:
                warnings.append(
                    f"{gpu.name} ({sm}) runs {variant} only through PTX JIT: the first launch "
                    "compiles kernels, and the driver must be at least as new as the toolkit"
                )
            if runs:
                continue
        carrying = variants_carrying(release, cc, m, arch)
        has = f"{variant} has {_code_list(entry)}" if entry is not None else ""
        if carrying is not None and not carrying:
            findings.append(
                Finding(
                    "gpu-arch",
                    f"{gpu.name} is {sm}, and no torch {release.torch} wheel for {arch} carries {sm} code"
                    + (f" ({has})" if has else ""),
                    older_release_hint(variant, cc, m, arch, facts),
                )
            )
        elif entry is not None:
            fix = variants_covering(release, cc, facts, m, arch)
            hint = (
                f"use {fix[0]} with torch {release.torch}"
                if fix
                else older_release_hint(variant, cc, m, arch, facts)
            )
            findings.append(
                Finding(
                    "gpu-arch",
                    f"{gpu.name} is {sm}, which torch {release.torch} {variant} does not carry (it has "
                    f"{_code_list(entry)})",
                    hint,
                )
            )
    return findings


def _code_list(entry: ArchList) -> str:
    return "sm_" + ", sm_".join(s.replace(".", "") for s in entry.sm)


def variants_carrying(release: Release, cc: str, m: Matrix, arch: str) -> Optional[list[str]]:
    """The variants of ``release`` on ``arch`` with code for ``cc`` (the driver aside); None when the release has no
    CUDA build there (the variant gates say so) or one has no known arch list: "no wheel carries it" would be
    a guess."""
    offered = release.variants.get(arch, ())
    if not offered:
        return None
    out = []
    for v in offered:
        entry = m.arch_list(v, arch, release.torch)
        if entry is None:
            return None
        if covers(entry, cc)[0]:
            out.append(v)
    return out


def variants_covering(release: Release, cc: str, facts: HostFacts, m: Matrix, arch: str) -> list[str]:
    out = []
    for v in release.variants.get(arch, ()):
        entry = m.arch_list(v, arch, release.torch)
        if entry and covers(entry, cc)[0] and driver_ok(m.variants[v], facts, driver_max_cuda(facts, m)):
            out.append(v)
    return out


def older_release_hint(variant: str, cc: str, m: Matrix, arch: str, facts: Optional[HostFacts] = None) -> str:
    """Names the newest stable release with code for ``cc``; with ``facts``, preferably one whose variant also
    suits the node's driver and Python (else the newest with the code at all)."""
    sm = "sm_" + cc.replace(".", "")
    newest: Optional[tuple[Release, str]] = None
    for rel in reversed(m.stable_releases()):
        for v in rel.variants.get(arch, ()):
            entry = m.arch_list(v, arch, rel.torch)
            if not (entry and covers(entry, cc)[0]):
                continue
            if facts is None or (
                driver_ok(m.variants[v], facts, driver_max_cuda(facts, m))
                and python_ok(rel.python, facts.python)
            ):
                if newest is None:
                    return f"the newest release with {sm} code is torch {rel.torch} with {v}"
                return (
                    f"the newest release with {sm} code that also suits this node's driver and Python is torch "
                    f"{rel.torch} with {v} (the newest at all is torch {newest[0].torch} with {newest[1]})"
                )
            newest = newest or (rel, v)
    if newest is not None:
        return f"the newest release with {sm} code is torch {newest[0].torch} with {newest[1]}"
    return f"no PyTorch wheel carries {sm}; build from source"


def quick_findings(release: Release, variant: str, facts: HostFacts, m: Matrix) -> list[Finding]:
    """Gates for a candidate variant (used for suggestions and 'auto'); never recursive into suggestions."""
    arch = facts.arch or "x86_64"
    info = m.variants[variant]
    out: list[Finding] = []
    if info.is_cuda and variant not in release.variants.get(arch, ()):
        out.append(Finding("variant-not-built", variant))
    if info.is_cuda and not driver_ok(info, facts, driver_max_cuda(facts, m)):
        out.append(Finding("driver", variant))
    if info.is_cuda and facts.gpus:
        entry = m.arch_list(variant, arch, release.torch)
        for gpu in facts.gpus:
            cc = gpu_capability(gpu, m)
            if entry and cc and not covers(entry, cc)[0]:
                out.append(Finding("gpu-arch", variant))
    return out


_PYTORCH_CHANNELS = ("pytorch", "pytorch-nightly")
_CONDA_TORCH = re.compile(r"^(pytorch|torchvision|torchaudio|pytorch-cuda)(?:[=<>!~ ]+\s*([0-9][^,\s]*))?")


def conda_pytorch_gate(name: str, conda: Conda, torch: Torch) -> None:
    """PyTorch's own conda channel stopped with 2.5 (deprecated, no 2.6 builds): refuse what recipe ``name``'s
    ``[conda]`` and ``[torch]`` sections would need it for."""
    channels = [c for c in conda.channels if c.rstrip("/").rsplit("/", 1)[-1] in _PYTORCH_CHANNELS]
    wanted = [m for m in (_CONDA_TORCH.match(p) for p in conda.packages) if m]
    if not channels and not wanted:
        return
    versions: list[Optional[str]] = [m.group(2) for m in wanted if m.group(1) == "pytorch"]
    if torch.install:
        versions.append(torch.version)
    if all(v and v != "latest" and not _at_least(v, (2, 6)) for v in versions or [None]):
        return
    source = ", ".join([*(f"channel {c}" for c in channels), *(m.group(0) for m in wanted)])
    raise ResolverErrors(
        [
            ResolverError(
                f"{name} asks for torch through PyTorch's conda channel ({source}), which was deprecated "
                "with 2.5 and has no builds from 2.6 on",
                gate="conda-pytorch-channel",
                hint="drop pytorch from conda.channels and conda.packages; set torch.install = true so torch comes "
                "from the wheel index, installed with pip inside the env",
            )
        ]
    )


def _at_least(version: str, minimum: tuple[int, int]) -> bool:
    parts = re.findall(r"\d+", version)[:2]
    return len(parts) < 2 or (int(parts[0]), int(parts[1])) >= minimum
