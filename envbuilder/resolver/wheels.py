"""Pure wheel-index resolver: (torch request, target machine facts) -> index URL, pins, flags, warnings.

No I/O here: the matrix is loaded once by :func:`load_matrix` (package data) and passed in. Every gate is an
error with a suggested fix unless the recipe lists the gate's name in ``torch.allow``; then it is a warning.
"""

from __future__ import annotations

import re
from dataclasses import field, replace
from typing import TYPE_CHECKING, Any, Optional

from packaging.version import InvalidVersion, Version

from envbuilder.core.errors import ResolverError, ResolverErrors, did_you_mean
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.resolver import knowledge, vendors, yanked
from envbuilder.resolver.gates import (
    Finding,
    TorchRequest,
    check_gates,
    driver_findings,
    driver_max_cuda,
    platform_findings,
    python_ok,
    quick_findings,
)
from envbuilder.resolver.matrix import Matrix, Release, covers, gpu_capability, load_matrix, minor_tuple

if TYPE_CHECKING:  # the pure parts only name these types; indexfacts is read at plan time
    from envbuilder.resolver.indexfacts import IndexFacts

# Re-exported: callers resolve and look GPUs up through this module.
__all__ = [
    "Matrix",
    "Resolution",
    "TorchRequest",
    "covers",
    "gpu_capability",
    "load_matrix",
    "resolve",
]

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
    #: The local version label the planned index's files carry ("cpu", "cu130"); "" when unknown or unlabelled.
    local: str = ""
    #: Where the resolver's facts came from (index pages read, the shipped table), one line each.
    facts_source: tuple[str, ...] = ()
    #: The release is newer than the shipped table: its GPU and driver facts are inferred.
    inferred: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "variant": self.variant,
            "channel": self.channel,
            "cuda": self.cuda,
            "index_url": self.index_url,
            "requirements": list(self.requirements),
            "pip_flags": list(self.pip_flags),
            "local": self.local,
            "inferred": self.inferred,
            "facts_source": list(self.facts_source),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------------------------------------------
# Resolution


def resolve(
    request: TorchRequest,
    facts: HostFacts,
    matrix: Optional[Matrix] = None,
    index: Optional[IndexFacts] = None,
    table_age: str = "",
) -> Resolution:
    """Resolve ``request`` for the machine ``facts`` describes, from the shipped table corrected by what ``index``
    read from the wheel indexes (the table alone without it). Raises ResolverErrors listing every failed gate.

    The rule: what an index the install will use lists is a fact; the table only fills in what a file name cannot
    say (GPU arch lists, driver floors, PyPI's default build). A variant the index lists is a candidate whatever
    the table says of it; a release is planned from a variant page that lists it, or with a "not checked" warning
    where that page could not be read."""
    if request.channel not in CHANNELS:
        raise ResolverError(
            f"unknown channel {request.channel!r}",
            gate="unknown-channel",
            hint=f"use one of {', '.join(CHANNELS)}",
        )
    know = knowledge.merge(matrix or load_matrix(), index, request.channel, table_age)
    m = know.matrix
    _check_variant_name(request, m, index)
    # No torch wheel for this CPU architecture: stop here, before any channel or variant is picked for it.
    blocked = [f for f in platform_findings(request.variant, facts, m) if f.gate not in request.allow]
    if blocked:
        raise ResolverErrors([ResolverError(f.message, gate=f.gate, hint=f.hint) for f in blocked])
    if request.channel == "nightly":
        res = _resolve_nightly(request, facts, m, index)
    elif request.version == "latest":
        res = _resolve_latest(request, facts, m, index)
    else:
        res = _resolve_pinned(request, facts, m, index)
    return replace(res, facts_source=know.lines)


def _resolve_pinned(
    request: TorchRequest, facts: HostFacts, m: Matrix, index: Optional[IndexFacts]
) -> Resolution:
    """An exact release, or the newest release of a minor ("2.14") whose variant page lists a build: an older
    patch release is taken only where the newer ones are not on the index the install will use."""
    try:
        candidates, why = _pick_releases(request, m)
    except ResolverErrors as exc:  # a release the index lists only as yanked gets its own answer
        notes: list[str] = []
        release = yanked.pinned(exc, request, m=m, index=index, arch=facts.arch or "x86_64", notes=notes)
        return _resolve_release(request, release, facts, m, index=index, notes=notes)
    first: Optional[ResolverErrors] = None
    skipped: list[str] = []
    for release in candidates:
        notes = [why.format(chosen=release.torch)] if why else []
        if skipped:
            notes.append(f"not on the index for this target: {', '.join(skipped)}")
        try:
            return _resolve_release(request, release, facts, m, index=index, notes=notes)
        except ResolverErrors as exc:
            first = first or exc
            if not all(e.gate in _NOT_LISTED for e in exc.errors):
                break
            skipped.append(f"{release.torch} ({exc.errors[0].gate})")
    if first is None:  # _pick_releases gives at least one release or raises
        raise ResolverErrors([ResolverError(f"torch {request.version} is not known", gate="unknown-release")])
    raise first


#: The gates that say "the index has no such build" (so an older patch of a pinned minor may be planned).
_NOT_LISTED = ("index", "variant-not-built")


def _resolve_latest(
    request: TorchRequest, facts: HostFacts, m: Matrix, index: Optional[IndexFacts]
) -> Resolution:
    """The newest release that passes every gate on the target (newer ones that fail are named in a note)."""
    pool = [r for r in m.releases if r.channel == request.channel]
    fitting = [r for r in pool if python_ok(r.python, facts.python)] or pool
    skipped: list[str] = []
    first: Optional[ResolverErrors] = None
    for release in sorted(fitting, key=lambda r: r.version, reverse=True):
        notes = [
            f"'latest' {request.channel} torch for Python {facts.python_minor or '(unknown)'}: {release.torch}"
        ]
        if skipped:
            notes.append(f"newer releases do not fit this target: {', '.join(skipped)}")
        try:
            return _resolve_release(request, release, facts, m, index=index, notes=notes)
        except ResolverErrors as exc:
            first = first or exc
            skipped.append(f"{release.torch} ({exc.errors[0].gate})")
    if first is None:  # the channel has no release at all (a table or index without one)
        raise ResolverErrors(
            [ResolverError(f"no {request.channel} torch release is known", gate="unknown-release")]
        )
    raise first


def _resolve_release(
    request: TorchRequest,
    release: Release,
    facts: HostFacts,
    m: Matrix,
    *,
    index: Optional[IndexFacts],
    notes: list[str],
) -> Resolution:
    warnings: list[str] = []
    variant = request.variant
    if variant == "auto":
        variant = _auto_variant(release, facts, m, request, notes)
    findings = check_gates(release, variant, request, facts, m, warnings=warnings)
    findings += vendors.vendor_findings(release, variant, facts, m, warnings=warnings)
    index_url = m.index[release.channel].format(variant=variant)
    found = _index_findings(index, index_url, release.torch, variant, facts)
    if found:  # what the index itself says explains it better than the table's variant list it corrected
        findings = found + [f for f in findings if f.gate not in ("variant-not-built", found[0].gate)]
    warnings.extend(_unchecked(index, index_url, release.torch, variant))
    info = m.variants[variant]
    if info.inferred:
        warnings.append(
            f"{variant} is listed by the index but not in the shipped table (as of {m.as_of}): {info.source}; "
            + _gpu_facts(m, variant, facts.arch or "x86_64", release.torch)
        )
    if release.origin == "inferred":
        warnings.append(
            f"torch {release.torch} is newer than the shipped table (as of {m.as_of}): its GPU arch list, driver "
            f"floor and companions are inferred ({release.source}); validation confirms them on the node"
        )
    label = knowledge.expected_label(
        index, index_url, release.torch, facts.arch or "x86_64", facts.python_minor
    ) or _allowed_yanked_label(request, index, index_url, release.torch, facts)
    res = _finish(request, release, variant, findings, m, warnings=warnings, notes=notes, label=label)
    return replace(res, local=label, inferred=release.origin == "inferred")


def _unchecked(index: Optional[IndexFacts], url: str, version: str, variant: str) -> list[str]:
    """The plan's "not checked" line where it had pages read, but not the one its build comes from (a plan that
    read nothing, offline or with every read failed, already says so once: ``IndexFacts.fallback``)."""
    if index is None or not index.pages or index.fallback or index.page(url) is not None:
        return []
    return [
        f"not checked: torch {version} {variant} is planned from the shipped table, because {_unread(index, url)}; "
        "the install finds out whether the index has it"
    ]


def _gpu_facts(m: Matrix, variant: str, arch: str, version: str) -> str:
    entry = m.arch_list(variant, arch, version)
    if entry is None:
        return "its GPU arch list is unknown: the GPU gate cannot be checked"
    return f"its GPU arch list is {entry.source}; validation confirms it on the node"


def _index_findings(
    index: Optional[IndexFacts], url: str, version: str, variant: str, facts: HostFacts
) -> list[Finding]:
    """What the index the install will use says about the planned build (nothing when it was not read)."""
    arch = facts.arch or "x86_64"
    files = knowledge.builds_on(index, url, version, arch)
    if files is None or index is None:
        return []
    page = index.page(url)
    where = url + (f" (read from {', '.join(page.sources)})" if page is not None and page.sources else "")
    mine = [f for f in files if knowledge.serves(f, variant)]
    gone = yanked.finding(index, url, version, arch, where) if not files else None
    if gone is not None:
        return [gone]
    if not files:
        have = list(index.versions(url, arch=arch))[-4:]
        return [
            Finding(
                "index",
                f"{where} has no torch {version} file for {arch}"
                + (f"; it has {', '.join(have)}" if have else "; it has no torch file for this architecture"),
                "pin a release the index has, or fix the mirror (ENVBUILDER_INDEX_MIRROR) so it holds this build",
            )
        ]
    if not mine:
        got = ", ".join(sorted({f"+{f.local}" for f in files}))
        return [
            Finding(
                "index",
                f"{where} offers torch {version} for {arch} only as {got}, not as a {variant} build",
                "the mirror holds the wrong build: fix ENVBUILDER_INDEX_MIRROR or the mirror's contents",
            )
        ]
    py = facts.python_minor
    if py and not [f for f in mine if f.supports(py)]:
        pys = sorted({p for f in mine for p in f.pythons}, key=minor_tuple)
        return [
            Finding(
                "python",
                f"{where} has torch {version} {variant} for {arch} only for Python {', '.join(pys)}, "
                f"the target has Python {py}",
                "load a Python module the wheel supports, or pin another torch release",
            )
        ]
    return []


def _allowed_yanked_label(
    request: TorchRequest, index: Optional[IndexFacts], url: str, version: str, facts: HostFacts
) -> str:
    """The label of the yanked build a recipe allowed (``yanked`` in torch.allow), so the pin names that build."""
    if yanked.GATE not in request.allow:
        return ""
    return yanked.label(index, url, version, facts.arch or "x86_64", facts.python_minor)


def _finish(
    request: TorchRequest,
    release: Release,
    variant: str,
    findings: list[Finding],
    m: Matrix,
    *,
    warnings: list[str],
    notes: list[str],
    label: str = "",
) -> Resolution:
    errors = [f for f in findings if f.gate not in request.allow]
    allowed = [f for f in findings if f.gate in request.allow]
    for f in allowed:
        warnings.append(f"allowed by the recipe ({f.gate}): {f.message}")
    if errors:
        raise ResolverErrors([ResolverError(f.message, gate=f.gate, hint=f.hint) for f in errors])
    index_url = m.index[release.channel].format(variant=variant)
    info = m.variants[variant]
    pins = _pins(request, release, label)
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


def _pins(request: TorchRequest, release: Release, label: str) -> list[str]:
    # torch carries the local label its index's files carry, when the index was read: no other index's build
    # (PyPI's unlabelled CUDA wheel, a mirror's CPU wheel) can satisfy it. Without that knowledge the pin stays
    # plain, because some wheels carry no label (the 2.4.0 aarch64 CUDA wheel, aarch64 CPU wheels before 2.6);
    # the build guard checks what arrived either way.
    pins = []
    for pkg in request.packages:
        if pkg == "torch":
            pins.append(f"torch=={release.torch}" + (f"+{label}" if label else ""))
        elif pkg == "torchvision":
            pins.append(f"torchvision=={request.torchvision or release.torchvision}")
        elif pkg == "torchaudio":
            pins.append(f"torchaudio=={request.torchaudio or release.torchaudio}")
    return pins


def _check_variant_name(request: TorchRequest, m: Matrix, index: Optional[IndexFacts]) -> None:
    """A variant the table knows, or one the index lists (merged into ``m``), is a candidate; any other name is
    refused, saying what the index said of it, or that its page was not read."""
    variant = request.variant
    if variant in ("auto", "cpu") or variant in m.variants:
        return
    known = sorted(v for v in m.variants if v != "cpu")
    url = m.index[request.channel].format(variant=variant)
    if not knowledge.is_variant_name(variant):
        reason = "it is not a variant name (expected auto, cpu, cuNNN, rocmX.Y or xpu)"
    elif index is not None and index.page(url) is not None:
        reason = f"{url} lists no torch build for it" + (
            f" ({m.no_index[variant]})" if variant in m.no_index else ""
        )
    else:
        reason = m.no_index.get(variant, "it is not in the shipped table") + f"; {_unread(index, url)}"
    close = did_you_mean(variant, [*known, "auto", "cpu"], n=2)
    hint = f"known variants: {', '.join(known)}"
    if close:
        hint = f"{close} " + hint
    hint += "; pick the newest one your driver supports, never the one nvcc reports"
    raise ResolverErrors(
        [ResolverError(f"unknown variant {variant!r}: {reason}", gate="unknown-variant", hint=hint)]
    )


def _unread(index: Optional[IndexFacts], url: str) -> str:
    """Why the page of ``url`` says nothing: not asked for, or its read failed (with the error)."""
    failed = index.failure(url) if index is not None else None
    return (
        f"its index page could not be read ({failed})" if failed else f"its index page ({url}) was not read"
    )


def _pick_releases(request: TorchRequest, m: Matrix) -> tuple[list[Release], str]:
    """The releases a pinned version may mean, best first, and the note that names the one planned
    (``{chosen}`` stands for it)."""
    wanted = request.version
    pool = [r for r in m.releases if r.channel == request.channel]
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
        return exact[:1], ""
    if re.fullmatch(r"\d+\.\d+", wanted):
        same_minor = sorted((r for r in pool if r.torch.startswith(wanted + ".")), key=lambda r: r.version)
        if same_minor:
            return same_minor[::-1], f"torch {wanted} means the newest {wanted}.x release: {{chosen}}"
    newest = max(pool, key=lambda r: r.version, default=None)
    if (
        newest is not None
        and "unlisted-release" in request.allow
        and re.fullmatch(r"\d+\.\d+\.\d+", wanted)
        and Version(wanted) > newest.version
    ):
        why = f"torch {wanted} is not in the shipped table; allowed by the recipe (unlisted-release)"
        inferred = replace(
            newest,
            torch=wanted,
            torchvision="",
            torchaudio="",
            source=f"not in the table; facts inferred from torch {newest.torch}",
            origin="inferred",
        )
        return [inferred], why
    listed = ", ".join(r.torch for r in sorted(pool, key=lambda r: r.version)[-6:])
    raise ResolverErrors(
        [
            ResolverError(
                f"torch {wanted} is not a known {request.channel} release (known: the index where it was read, "
                f"else the shipped table as of {m.as_of})",
                gate="unknown-release",
                hint=f"newest known {request.channel} releases: {listed}; `--refresh` re-reads the index; "
                'torch.allow = ["unlisted-release"] plans a newer release with inferred facts',
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
    picked = vendors.auto_variant(release, facts, m, notes)  # an AMD or Intel node
    if picked is not None:
        return picked
    arch = facts.arch or "x86_64"
    # "auto" means NVIDIA's CUDA builds: a ROCm or XPU page the index lists is taken only when named.
    offered = [v for v in release.variants.get(arch, ()) if v in m.variants and m.variants[v].is_cuda]
    default = release.pypi_default.get(arch)
    # Prefer a variant this driver runs natively (minor-version compatibility cannot JIT newer PTX), then the
    # variant PyTorch itself ships as default, then the newest CUDA.
    top = driver_max_cuda(facts, m)

    def rank(v: str) -> tuple[bool, bool, list[int]]:
        cuda = minor_tuple(m.variants[v].cuda)
        return (top is not None and cuda > top, v != default, [-x for x in cuda])

    order = sorted(offered, key=rank)
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


def _resolve_nightly(
    request: TorchRequest, facts: HostFacts, m: Matrix, index: Optional[IndexFacts] = None
) -> Resolution:
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
        else ("cpu" if not facts.gpus or arch not in nightly else nightly[arch][-2])
    )
    url = m.index["nightly"].format(variant=variant)
    if variant != "cpu" and variant not in nightly.get(arch, ()) and not _lists_variant(index, url, variant):
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
        findings.extend(driver_findings(rel, m.variants[variant], facts, m, warnings=warnings, arch=arch))
    if not findings:
        findings.extend(_pruned(index, url, version, arch))
    label = knowledge.expected_label(index, url, version, arch, facts.python_minor)
    known = variant if variant in m.variants else "cpu"
    res = _finish(request, rel, known, findings, m, warnings=warnings, notes=[], label=label)
    return replace(res, local=label)


def _lists_variant(index: Optional[IndexFacts], url: str, variant: str) -> bool:
    """Whether the page of ``url`` was read and lists ``variant`` builds: the stream exists, whatever the table says."""
    page = index.page(url) if index is not None else None
    return page is not None and any(f.local and knowledge.serves(f, variant) for f in page.files)


def _pruned(index: Optional[IndexFacts], url: str, version: str, arch: str) -> list[Finding]:
    files = knowledge.builds_on(index, url, version, arch)
    if files or files is None or index is None:
        return []
    newest = list(index.versions(url, arch=arch))[-1:]
    return [
        Finding(
            "nightly-pruned",
            f"torch {version} is no longer on {url} (nightly builds are pruned after a few months)"
            + (f"; the newest there is {newest[0]}" if newest else ""),
            "pin a current dated build, or use a stable release; back a nightly env up once it validates",
        )
    ]
