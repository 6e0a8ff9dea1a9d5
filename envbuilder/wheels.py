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
from envbuilder.gates import (
    TORCH_PACKAGES,
    Finding,
    TorchRequest,
    check_gates,
    driver_findings,
    python_ok,
    quick_findings,
)
from envbuilder.host import HostFacts
from envbuilder.matrix import Matrix, Release, VariantInfo, covers, gpu_capability, load_matrix, minor_tuple

# Re-exported: callers resolve and look GPUs up through this module.
__all__ = [
    "GATES",
    "TORCH_PACKAGES",
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


# ---------------------------------------------------------------------------------------------------------------
# Request and result


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
    findings = check_gates(release, variant, request, facts, m, warnings)
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


def _pick_release(request: TorchRequest, facts: HostFacts, m: Matrix, notes: list[str]) -> Release:
    wanted = request.version
    pool = [r for r in m.releases if r.channel == request.channel]
    if wanted == "latest":
        fitting = [r for r in pool if python_ok(r.python, facts.python)]
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
        if not any(f.gate != "variant-not-built" for f in quick_findings(release, v, facts, m))
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
    if facts.python and not python_ok(tuple(nightly["python"]), facts.python):
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
        findings.extend(driver_findings(rel, m.variants[variant], facts, m, warnings, arch))
    return _finish(request, rel, variant if variant in m.variants else "cpu", findings, warnings, [], m)
