"""Pure wheel-index resolver: (torch request, target machine facts) -> index URL, pins, flags, warnings.

No I/O here: the matrix is loaded once by :func:`load_matrix` (package data) and passed in. Every gate is an
error with a suggested fix unless the recipe lists the gate's name in ``torch.allow``; then it is a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from packaging.version import InvalidVersion, Version

from envbuilder.errors import ResolverError, ResolverErrors, did_you_mean
from envbuilder.host import HostFacts
from envbuilder.matrix import Matrix, Release, VariantInfo, covers, gpu_capability, load_matrix, minor_tuple

# Re-exported: callers resolve and look GPUs up through this module.
__all__ = [
    "GATES",
    "Matrix",
    "Resolution",
    "TorchRequest",
    "covers",
    "gpu_capability",
    "load_matrix",
    "resolve",
]

#: Gate names a recipe may list in ``torch.allow`` to turn the error into a warning.
GATES = (
    "variant-not-built",
    "aarch64-no-cuda-wheel",
    "python",
    "glibc",
    "driver",
    "gpu-arch",
    "nightly-unpinned",
    "nightly-stream-removed",
    "package-missing",
    "unlisted-release",
)
CHANNELS = ("stable", "test", "nightly")
TORCH_PACKAGES = ("torch", "torchvision", "torchaudio")


# ---------------------------------------------------------------------------------------------------------------
# Request and result


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


@dataclass(frozen=True)
class Resolution:
    torch: str
    variant: str
    channel: str
    index_url: str
    requirements: tuple[str, ...]
    pip_flags: tuple[str, ...]
    cuda: Optional[str]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    allowed: tuple[Finding, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "variant": self.variant,
            "channel": self.channel,
            "cuda": self.cuda,
            "index_url": self.index_url,
            "requirements": list(self.requirements),
            "pip_flags": list(self.pip_flags),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------------------------------------------
# Resolution


def resolve(request: TorchRequest, facts: HostFacts, matrix: Optional[Matrix] = None) -> Resolution:
    """Resolve ``request`` for the machine ``facts`` describes. Raises ResolverErrors listing every failed gate."""
    m = matrix or load_matrix()
    if request.channel not in CHANNELS:
        raise ResolverError(
            f"unknown channel {request.channel!r}",
            gate="unknown-channel",
            hint=f"use one of {', '.join(CHANNELS)}",
        )
    _check_variant_name(request.variant, m)
    if request.channel == "nightly":
        return _resolve_nightly(request, facts, m)

    warnings: list[str] = []
    notes: list[str] = []
    release = _pick_release(request, facts, m, notes)
    variant = request.variant
    if variant == "auto":
        variant = _auto_variant(release, facts, m, request, notes)
    findings = _gates(release, variant, request, facts, m, warnings)
    return _finish(request, release, variant, findings, warnings, notes, m)


def _finish(
    request: TorchRequest,
    release: Release,
    variant: str,
    findings: list[Finding],
    warnings: list[str],
    notes: list[str],
    m: Matrix,
) -> Resolution:
    errors = [f for f in findings if f.gate not in request.allow]
    allowed = [f for f in findings if f.gate in request.allow]
    for f in allowed:
        warnings.append(f"allowed by the recipe ({f.gate}): {f.message}")
    if errors:
        raise ResolverErrors([ResolverError(f.message, gate=f.gate, hint=f.hint) for f in errors])
    index_url = m.index[release.channel].format(variant=variant)
    info = m.variants[variant]
    pins = _pins(request, release, info)
    flags = ["--index-url", index_url]
    if release.channel == "nightly":
        flags.append("--pre")
    return Resolution(
        torch=release.torch,
        variant=variant,
        channel=release.channel,
        index_url=index_url,
        requirements=tuple(pins),
        pip_flags=tuple(flags),
        cuda=info.cuda or None,
        warnings=tuple(warnings),
        notes=tuple(notes),
        allowed=tuple(allowed),
    )


def _pins(request: TorchRequest, release: Release, info: VariantInfo) -> list[str]:
    # Plain version pins with --index-url: the index decides the variant. A "+cuXXX" local label would fail on
    # wheels published without one (the 2.4.0 aarch64 CUDA wheel, aarch64 CPU wheels before 2.6).
    pins = []
    for pkg in request.packages:
        if pkg == "torch":
            pins.append(f"torch=={release.torch}")
        elif pkg == "torchvision":
            pins.append(f"torchvision=={request.torchvision or release.torchvision}")
        elif pkg == "torchaudio":
            pins.append(f"torchaudio=={request.torchaudio or release.torchaudio}")
    return pins


def _check_variant_name(variant: str, m: Matrix) -> None:
    if variant in ("auto", "cpu") or variant in m.variants:
        return
    known = sorted(v for v in m.variants if v != "cpu")
    if variant in m.no_index:
        reason = m.no_index[variant]
    elif re.fullmatch(r"cu\d{3}", variant):
        reason = "no PyTorch index exists for it"
    else:
        reason = "it is not a variant name (expected auto, cpu or cuNNN)"
    close = did_you_mean(variant, [*known, "auto", "cpu"], n=2)
    hint = f"known CUDA variants: {', '.join(known)}"
    if close:
        hint = f"{close} " + hint
    hint += "; pick the newest one your driver supports, never the one nvcc reports"
    raise ResolverErrors(
        [ResolverError(f"unknown CUDA variant {variant!r}: {reason}", gate="unknown-variant", hint=hint)]
    )


def _python_ok(release_range: tuple[str, str], python: Optional[str]) -> bool:
    if not python:
        return True
    lo, hi = (minor_tuple(v) for v in release_range)
    return lo <= minor_tuple(python) <= hi


def _pick_release(request: TorchRequest, facts: HostFacts, m: Matrix, notes: list[str]) -> Release:
    wanted = request.version
    pool = [r for r in m.releases if r.channel == request.channel]
    if wanted == "latest":
        fitting = [r for r in pool if _python_ok(r.python, facts.python)]
        chosen = max(fitting or pool, key=lambda r: r.version)
        notes.append(
            f"'latest' {request.channel} torch for Python {facts.python_minor or '(unknown)'}: {chosen.torch}"
        )
        return chosen
    try:
        Version(wanted)
    except InvalidVersion:
        raise ResolverErrors(
            [
                ResolverError(
                    f"torch version {wanted!r} is not a version",
                    gate="unknown-release",
                    hint="use 'latest', a minor like '2.7', or an exact release like '2.7.1'",
                )
            ]
        ) from None
    exact = [r for r in pool if r.torch == wanted]
    if exact:
        return exact[0]
    if re.fullmatch(r"\d+\.\d+", wanted):
        same_minor = [r for r in pool if r.torch.startswith(wanted + ".")]
        if same_minor:
            chosen = max(same_minor, key=lambda r: r.version)
            notes.append(f"torch {wanted} means the newest {wanted}.x release: {chosen.torch}")
            return chosen
    listed = ", ".join(r.torch for r in sorted(pool, key=lambda r: r.version)[-6:])
    raise ResolverErrors(
        [
            ResolverError(
                f"torch {wanted} is not a known {request.channel} release (the matrix is as of {m.as_of})",
                gate="unknown-release",
                hint=f"newest known {request.channel} releases: {listed}",
            )
        ]
    )


def _driver_max_cuda(facts: HostFacts, m: Matrix) -> Optional[tuple[int, int]]:
    if facts.max_cuda:
        return minor_tuple(facts.max_cuda)
    if not facts.driver_version:
        return None
    # The newest CUDA whose toolkit driver this driver meets.
    best: Optional[tuple[int, int]] = None
    for info in m.variants.values():
        if info.toolkit_driver and _ver(facts.driver_version) >= _ver(info.toolkit_driver):
            cand = minor_tuple(info.cuda)
            best = cand if best is None or cand > best else best
    return best


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def _gates(
    release: Release,
    variant: str,
    request: TorchRequest,
    facts: HostFacts,
    m: Matrix,
    warnings: list[str],
) -> list[Finding]:
    findings: list[Finding] = []
    info = m.variants[variant]
    arch = facts.arch or "x86_64"
    if not facts.arch:
        warnings.append("target CPU architecture unknown; assuming x86_64")

    # Which variants this release has on this CPU architecture.
    if info.is_cuda:
        offered = release.variants.get(arch, ())
        if variant not in offered:
            if arch == "aarch64":
                findings.append(_aarch64_finding(release, variant, request, facts, m))
            else:
                have = [r.torch for r in m.stable_releases() if variant in r.variants.get(arch, ())]
                span = f"{have[0]}–{have[-1]}" if have else "no stable release"
                findings.append(
                    Finding(
                        "variant-not-built",
                        f"torch {release.torch} has no {variant} build for {arch} "
                        f"(it offers {', '.join(offered) or 'none'}); {variant} exists for torch {span}",
                        f"use one of {', '.join(offered)} with torch {release.torch}, or pin a torch in {span}",
                    )
                )
        elif arch == "aarch64" and release.aarch64_confidence != "P":
            warnings.append(
                f"the {variant} aarch64 CUDA wheel for torch {release.torch} is known only from a secondary "
                f"source ({release.source}); validation will confirm torch.version.cuda"
            )
        if variant in release.variants.get(arch, ()) and info.nightly_only:
            findings.append(Finding("variant-not-built", f"{variant} exists only on the nightly index"))

    # Companion packages that the variant's index does not carry, or the release never had.
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

    # Python and glibc.
    if facts.python and not _python_ok(release.python, facts.python):
        fitting = [r.torch for r in m.stable_releases() if _python_ok(r.python, facts.python)]
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
    if facts.glibc and _ver(facts.glibc) < _ver(floor):
        findings.append(
            Finding(
                "glibc",
                f"torch {release.torch} {variant} wheels need glibc ≥ {floor} (manylinux), "
                f"the target has glibc {facts.glibc}",
                "use a torch release built on manylinux2014 (≤ 2.5, or 2.6 with cu118/cu124), or a container",
            )
        )

    if info.is_cuda:
        findings.extend(_driver_findings(release, info, facts, m, warnings, arch))
        findings.extend(_gpu_findings(release, variant, facts, m, warnings, arch))
    elif facts.gpus:
        warnings.append(
            f"the target has {len(facts.gpus)} GPU(s) ({facts.gpus[0].name}) but the CPU wheel was chosen"
        )
    return findings


def _aarch64_finding(
    release: Release, variant: str, request: TorchRequest, facts: HostFacts, m: Matrix
) -> Finding:
    offered = release.variants.get("aarch64", ())
    options = []
    working = [v for v in offered if not _quick_findings(release, v, facts, m)]
    if working:
        options.append(f"use {working[0]} with torch {release.torch}")
    else:
        # The first newer stable release with an aarch64 CUDA wheel that fits this node.
        for rel in m.stable_releases():
            if rel.version <= release.version:
                continue
            fits = [v for v in rel.variants.get("aarch64", ()) if not _quick_findings(rel, v, facts, m)]
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


def _driver_findings(
    release: Release, info: VariantInfo, facts: HostFacts, m: Matrix, warnings: list[str], arch: str
) -> list[Finding]:
    max_cuda = _driver_max_cuda(facts, m)
    if facts.driver_version is None and max_cuda is None:
        warnings.append(
            f"NVIDIA driver unknown; {info.name} needs driver ≥ {info.family_min_driver} (checked at validation)"
        )
        return []
    shown = facts.driver_version or f"supporting CUDA ≤ {facts.max_cuda}"
    if not _driver_ok(info, facts, max_cuda):
        ok = [v for v in release.variants.get(arch, ()) if _driver_ok(m.variants[v], facts, max_cuda)]
        hint = f"use {ok[-1]} with torch {release.torch}" if ok else "ask the site for a newer driver"
        return [
            Finding(
                "driver",
                f"{info.name} wheels need an NVIDIA driver ≥ {info.family_min_driver} (CUDA {info.cuda_major}.x); "
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


def _driver_ok(info: VariantInfo, facts: HostFacts, max_cuda: Optional[tuple[int, int]]) -> bool:
    if facts.driver_version and info.family_min_driver:
        return _ver(facts.driver_version) >= _ver(info.family_min_driver)
    if max_cuda is not None and info.cuda_major is not None:
        return max_cuda[0] >= info.cuda_major
    return True


def _gpu_findings(
    release: Release, variant: str, facts: HostFacts, m: Matrix, warnings: list[str], arch: str
) -> list[Finding]:
    if not facts.gpus:
        return []
    entry = m.arch_list(variant, arch, release.torch)
    if entry is None:
        warnings.append(
            f"no arch list known for torch {release.torch} {variant} on {arch}; GPU support unchecked"
        )
        return []
    if entry.confidence != "P":
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
        runs, jit = covers(entry, cc)
        if runs and jit:
            warnings.append(
                f"{gpu.name} (sm_{cc.replace('.', '')}) runs {variant} only through PTX JIT: the first launch "
                "compiles kernels, and the driver must be at least as new as the toolkit"
            )
        if not runs:
            fix = _variants_covering(release, cc, facts, m, arch)
            hint = (
                f"use {fix[0]} with torch {release.torch}"
                if fix
                else _older_release_hint(variant, cc, m, arch)
            )
            findings.append(
                Finding(
                    "gpu-arch",
                    f"{gpu.name} is sm_{cc.replace('.', '')}, which torch {release.torch} {variant} does not carry "
                    f"(it has sm_{', sm_'.join(s.replace('.', '') for s in entry.sm)})",
                    hint,
                )
            )
    return findings


def _variants_covering(release: Release, cc: str, facts: HostFacts, m: Matrix, arch: str) -> list[str]:
    out = []
    for v in release.variants.get(arch, ()):
        entry = m.arch_list(v, arch, release.torch)
        if entry and covers(entry, cc)[0] and _driver_ok(m.variants[v], facts, _driver_max_cuda(facts, m)):
            out.append(v)
    return out


def _older_release_hint(variant: str, cc: str, m: Matrix, arch: str) -> str:
    for rel in reversed(m.stable_releases()):
        for v in rel.variants.get(arch, ()):
            entry = m.arch_list(v, arch, rel.torch)
            if entry and covers(entry, cc)[0]:
                return f"the newest release with sm_{cc.replace('.', '')} code is torch {rel.torch} with {v}"
    return f"no PyTorch wheel carries sm_{cc.replace('.', '')}; build from source"


def _quick_findings(release: Release, variant: str, facts: HostFacts, m: Matrix) -> list[Finding]:
    """Gates for a candidate variant (used for suggestions and 'auto'); never recursive into suggestions."""
    arch = facts.arch or "x86_64"
    info = m.variants[variant]
    out: list[Finding] = []
    if info.is_cuda and variant not in release.variants.get(arch, ()):
        out.append(Finding("variant-not-built", variant))
    if info.is_cuda and not _driver_ok(info, facts, _driver_max_cuda(facts, m)):
        out.append(Finding("driver", variant))
    if info.is_cuda and facts.gpus:
        entry = m.arch_list(variant, arch, release.torch)
        for gpu in facts.gpus:
            cc = gpu_capability(gpu, m)
            if entry and cc and not covers(entry, cc)[0]:
                out.append(Finding("gpu-arch", variant))
    return out


def _auto_variant(
    release: Release, facts: HostFacts, m: Matrix, request: TorchRequest, notes: list[str]
) -> str:
    if not facts.gpus:
        why = "has no NVIDIA GPU" if facts.gpus is not None else "has no known GPU"
        notes.append(f"variant auto: the target {why}, so the CPU wheel")
        return "cpu"
    arch = facts.arch or "x86_64"
    offered = list(release.variants.get(arch, ()))
    default = release.pypi_default.get(arch)
    # Prefer the variant PyTorch itself ships as default, then the newest CUDA.
    order = sorted(offered, key=lambda v: (v != default, [-x for x in minor_tuple(m.variants[v].cuda)]))
    usable = [
        v
        for v in order
        if not any(f.gate != "variant-not-built" for f in _quick_findings(release, v, facts, m))
    ]
    usable = [v for v in usable if not any(p in m.variants[v].lacks for p in request.packages)]
    if usable:
        notes.append(
            f"variant auto: {usable[0]} (driver {facts.driver_version or 'unknown'}, "
            f"GPU {facts.gpus[0].name}) from {', '.join(offered)}"
        )
        return usable[0]
    # Nothing fits: resolve the default so the gates explain why.
    return (
        default
        if default and default in m.variants and default != "cpu"
        else (offered[-1] if offered else "cpu")
    )


def _resolve_nightly(request: TorchRequest, facts: HostFacts, m: Matrix) -> Resolution:
    nightly = m.nightly
    arch = facts.arch or "x86_64"
    findings: list[Finding] = []
    warnings = ["nightly wheels disappear from the index after a while: back this env up once it validates"]
    version = request.version
    if not re.fullmatch(r"\d+\.\d+\.\d+\.dev\d{8}", version):
        findings.append(
            Finding(
                "nightly-unpinned",
                f"a nightly recipe must pin a dated build (torch==X.Y.Z.devYYYYMMDD), not {version!r}: an unpinned "
                "--pre install is different every day",
                f"pin e.g. {nightly['torch']}.dev{m.as_of.replace('-', '')}, or use the stable channel",
            )
        )
    variant = (
        request.variant
        if request.variant not in ("auto",)
        else ("cpu" if not facts.gpus else nightly[arch][-2])
    )
    if variant != "cpu" and variant not in nightly.get(arch, ()):
        removed = nightly.get("removed", {}).get(variant)
        findings.append(
            Finding(
                "nightly-stream-removed",
                f"the nightly {variant} index no longer exists"
                + (f" (removed {removed})" if removed else "")
                + f"; nightly builds today: {', '.join(nightly.get(arch, ()))}",
                "use a stable release on a variant that exists, e.g. the stable channel with cu126",
            )
        )
    for pkg, explicit in (("torchvision", request.torchvision), ("torchaudio", request.torchaudio)):
        if pkg in request.packages and not explicit:
            findings.append(
                Finding(
                    "nightly-unpinned",
                    f"nightly {pkg} must be pinned to its dated build too",
                    f"set torch.{pkg} or drop {pkg} from torch.packages",
                )
            )
    if facts.python and not _python_ok(tuple(nightly["python"]), facts.python):
        findings.append(
            Finding("python", f"nightly torch supports Python {nightly['python'][0]}–{nightly['python'][1]}")
        )
    rel = Release(
        torch=version,
        channel="nightly",
        torchvision=request.torchvision or "",
        torchaudio=request.torchaudio or "",
        python=(nightly["python"][0], nightly["python"][1]),
        variants={arch: tuple(nightly.get(arch, ()))},
        aarch64_confidence=nightly.get("aarch64_confidence", "U"),
        pypi_default={},
        glibc=nightly["glibc"],
        glibc_by_variant={},
        source=nightly["source"],
    )
    if variant in m.variants and m.variants[variant].is_cuda and not findings:
        findings.extend(_driver_findings(rel, m.variants[variant], facts, m, warnings, arch))
    return _finish(request, rel, variant if variant in m.variants else "cpu", findings, warnings, [], m)
