"""What the resolver knows (pure): the shipped table, brought up to date by what the wheel indexes say.

The table (``data/torch_matrix.toml``) holds what a file name cannot tell: GPU arch lists, driver floors, PyPI's
default build, companions. The index holds what the table can only remember: which releases exist, which variants
and platforms each has, which Pythons. Where both speak, the index wins, because it is what the install will use.
A release on the index that the table does not know is *inferred*: it takes its variants' facts from the newest
release the table has with that variant, and the plan says so. Variant names follow the index too: any ``cuNNN``,
``rocmX.Y``, ``xpu`` or ``cpu`` page that lists builds is a candidate, whatever the table says of it (a
"nightly-only" mark does not veto the stable page); an unknown CUDA variant's version, order and driver floor
follow from its number (:func:`inferred_variant`).

No I/O: ``envbuilder.resolver.indexread`` reads the pages and hands an :class:`IndexFacts` in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from envbuilder.core.structs import dataclass
from envbuilder.resolver.gates import TorchRequest
from envbuilder.resolver.matrix import ArchList, Matrix, Release, VariantInfo, minor_tuple

if TYPE_CHECKING:  # the pure parts only name these types; indexfacts is read at plan time
    from envbuilder.resolver.indexfacts import IndexFacts, PageRead, WheelFile

ARCHES = ("x86_64", "aarch64")
#: The names a variant index can have: the index, not the table, says which of them exist.
VARIANT_NAME = re.compile(r"cpu|xpu|cu(?P<cuda>\d{3,})|rocm\d+\.\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Knowledge:
    matrix: Matrix
    #: Where the facts came from, one line each (plan output, ``recipes show --explain``).
    lines: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------------------------
# Which pages to read


def upstreams(request: TorchRequest, m: Matrix) -> list[str]:
    """The index pages a plan for ``request`` reads: each candidate variant's index, and PyPI's for stable.

    A named variant reads its own page whether the table knows it or not (the index says whether it exists).
    ``auto`` reads the page of every variant a release it may fall back to offers, and of the variants the table
    has not seen on this channel yet (nightly-only ones, the next CUDA numbers), so nothing it plans is taken
    from the table without its page."""
    channel = request.channel if request.channel in m.index else "stable"
    base = m.index[channel]
    if request.variant not in ("auto", ""):
        variants = [request.variant] if is_variant_name(request.variant) else []
    elif channel == "nightly":
        variants = ["cpu", *_union(m.nightly.get(a, ()) for a in ARCHES)]
    else:
        pool = sorted((r for r in m.releases if r.channel == channel), key=lambda r: r.version, reverse=True)
        pinned = [r for r in pool if r.torch == request.version or r.torch.startswith(request.version + ".")]
        offered = _union(arch_variants for r in pinned or pool for arch_variants in r.variants.values())
        variants = ["cpu", *offered, *upcoming(m, channel)]
    urls = [base.format(variant=v) for v in dict.fromkeys(variants)]
    if channel == "stable":
        urls.append(m.index["pypi"])
    return list(dict.fromkeys(urls))


def is_variant_name(name: str) -> bool:
    """Whether ``name`` is the name a variant index can have (cu140, rocm6.4, xpu, cpu)."""
    return VARIANT_NAME.fullmatch(name) is not None


def cuda_of(name: str) -> Optional[str]:
    """The CUDA version a ``cuNNN`` name stands for (cu140 -> "14.0", cu118 -> "11.8"); None for other names."""
    found = VARIANT_NAME.fullmatch(name)
    digits = found["cuda"] if found is not None else None
    return f"{int(digits[:-1])}.{digits[-1]}" if digits else None


def upcoming(m: Matrix, channel: str) -> list[str]:
    """CUDA variants no table release of ``channel`` offers yet: the table's nightly-only ones and the names it
    lists as having no index yet that are newer than every variant it knows. Their pages are read so that the day
    one appears, the plan sees it."""
    offered = {v for r in m.releases if r.channel == channel for vs in r.variants.values() for v in vs}
    newest = max((minor_tuple(i.cuda) for i in m.variants.values() if i.cuda), default=(0, 0))
    later = [n for n in m.no_index if (cuda_of(n) or "") and minor_tuple(cuda_of(n) or "0") > newest]
    return [v for v in m.variants if m.variants[v].cuda and v not in offered] + sorted(later)


def _union(groups: Iterable[Iterable[str]]) -> list[str]:
    out: list[str] = []
    for group in groups:
        out.extend(v for v in group if v not in out)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Merging


def merge(m: Matrix, index: Optional[IndexFacts], channel: str, table_age: str = "") -> Knowledge:
    """The table with ``channel``'s releases corrected by the pages ``index`` read (unchanged without pages)."""
    table = f"the shipped table (as of {m.as_of}{', ' + table_age if table_age else ''})"
    if index is None or not any(p.ok for p in index.pages.values()):
        why = index.fallback if index is not None and index.fallback else "no index read"
        return Knowledge(m, (f"torch releases, variants, Pythons: {table}; {why}",))
    pages = _variant_pages(m, index, channel)
    if not pages:
        failed = [p.error for p in index.pages.values() if not p.ok and p.error]
        why = (
            f": {failed[0]}" + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else "") if failed else ""
        )
        return Knowledge(
            m, (f"torch releases and variants: {table}; no {channel} variant page was read{why}",)
        )
    seen = _versions_seen(pages)
    variants, variant_lines = _variants_listed(m, channel, pages)
    m = replace(m, variants=variants)
    releases, arch_lists, warnings = _merged_releases(m, channel, pages, seen)
    arch_lists += _borrowed_lists(m, releases, arch_lists)
    merged = replace(m, releases=tuple(releases), arch_lists=(*m.arch_lists, *arch_lists))
    lines = [_page_line(p) for p in index.pages.values()]
    lines.extend(variant_lines)
    lines.append(f"GPU arch lists, driver floors, PyPI default builds, companions: {table}")
    return Knowledge(merged, tuple(lines), tuple(warnings))


def _variant_pages(m: Matrix, index: IndexFacts, channel: str) -> dict[str, PageRead]:
    """variant -> the page read for it on ``channel``'s index (ok pages only), whatever its name: a variant the
    table does not know is named by its page's URL (``.../whl/cu140`` -> cu140)."""
    prefix, _, suffix = m.index[channel].partition("{variant}")
    tail = suffix.rstrip("/")
    out = {}
    for url in index.pages:
        name = url.rstrip("/")[len(prefix) :]
        name = name[: len(name) - len(tail)] if tail else name
        page = index.page(url)
        if page is not None and url.startswith(prefix) and "/" not in name and is_variant_name(name):
            out[name] = page
    return out


def _variants_listed(
    m: Matrix, channel: str, pages: Mapping[str, PageRead]
) -> tuple[dict[str, VariantInfo], list[str]]:
    """The table's variants, plus each variant whose page lists builds of it that the table does not know (its
    CUDA version and driver floor follow from its name), less the "nightly-only" mark of a variant this
    channel's index lists: what the index lists is a fact, the table only fills in what a name cannot say."""
    variants = dict(m.variants)
    lines = []
    for name, page in pages.items():
        if not any(serves(f, name) and not f.yanked for f in page.files):
            continue
        info = variants.get(name)
        if info is None:
            variants[name] = inferred_variant(name, m)
            lines.append(f"{name}: listed by the index, not in the shipped table; {variants[name].source}")
        elif info.nightly_only and channel != "nightly":
            variants[name] = replace(info, nightly_only=False)
            lines.append(f"{name}: listed by the {channel} index (the shipped table has it as nightly-only)")
    return variants, lines


def inferred_variant(name: str, m: Matrix) -> VariantInfo:
    """What a variant the table does not know is, from its name alone: ``cuNNN`` is CUDA N.N, whose driver floor
    is that of the table's newest variant of the same CUDA major (unknown for a new major); ``rocmX.Y`` and
    ``xpu`` carry no fact envbuilder could check."""
    cuda = cuda_of(name) or ""
    if name.startswith("rocm"):
        rocm = ".".join(name[len("rocm") :].split(".")[:2])
        return VariantInfo(
            name, "", None, None, source=f"inferred from its name: ROCm {rocm}", inferred=True, rocm=rocm
        )
    if not cuda:
        return VariantInfo(
            name, "", None, None, source="no GPU facts known for it", inferred=True, xpu=name == "xpu"
        )
    major = minor_tuple(cuda)[0]
    kin = sorted(
        (
            i
            for i in m.variants.values()
            if i.cuda and minor_tuple(i.cuda)[0] == major and i.family_min_driver
        ),
        key=lambda i: minor_tuple(i.cuda),
    )
    floor = kin[-1].family_min_driver if kin else None
    why = (
        f"driver floor of CUDA {major}.x from {kin[-1].name}"
        if kin
        else f"no CUDA {major}.x driver floor known"
    )
    return VariantInfo(
        name, cuda, floor, None, source=f"inferred from its name: CUDA {cuda}, {why}", inferred=True
    )


def _borrowed_lists(m: Matrix, releases: Sequence[Release], made: Sequence[ArchList]) -> list[ArchList]:
    """GPU arch lists for the builds of a variant the table does not know: those of the same release's known CUDA
    variant nearest to it in number (confidence U); none where the release has no such variant."""
    have = replace(m, arch_lists=(*m.arch_lists, *made))
    out = []
    for rel in releases:
        for arch, names in rel.variants.items():
            for name in names:
                info = m.variants.get(name)
                if info is None or not info.inferred or have.arch_list(name, arch, rel.torch) is not None:
                    continue
                near = _nearest_list(have, rel, arch, info)
                if near is not None:
                    source = f"inferred from torch {rel.torch} {near[0]}"
                    out.append(
                        replace(
                            near[1], variant=name, torch=_exactly(rel.torch), confidence="U", source=source
                        )
                    )
    return out


def _nearest_list(m: Matrix, rel: Release, arch: str, info: VariantInfo) -> Optional[tuple[str, ArchList]]:
    """The known CUDA variant of ``rel`` on ``arch`` nearest to ``info`` in CUDA version, with its arch list."""
    if not info.cuda:
        return None
    want = minor_tuple(info.cuda)
    known = []
    for name in rel.variants.get(arch, ()):
        other = m.variants.get(name)
        entry = m.arch_list(name, arch, rel.torch)
        if other is not None and other.cuda and not other.inferred and entry is not None:
            have = minor_tuple(other.cuda)
            known.append((abs((want[0] - have[0]) * 100 + want[1] - have[1]), name, entry))
    if not known:
        return None
    _, name, entry = min(known, key=lambda k: k[0])
    return name, entry


def _versions_seen(pages: dict[str, PageRead]) -> dict[str, dict[str, list[WheelFile]]]:
    """version -> variant -> its files on that variant's page."""
    seen: dict[str, dict[str, list[WheelFile]]] = {}
    for variant, page in pages.items():
        for f in page.files:
            if f.yanked or f.arch is None or not serves(f, variant):
                continue
            seen.setdefault(f.version, {}).setdefault(variant, []).append(f)
    return seen


def _merged_releases(
    m: Matrix, channel: str, pages: dict[str, PageRead], seen: dict[str, dict[str, list[WheelFile]]]
) -> tuple[list[Release], list[ArchList], list[str]]:
    pool = [r for r in m.releases if r.channel == channel]
    newest = max((r.version for r in pool), default=Version("0"))
    out = [r for r in m.releases if r.channel != channel]
    for rel in pool:
        out.append(_corrected(rel, pages, seen.get(rel.torch, {})))
    arch_lists: list[ArchList] = []
    warnings: list[str] = []
    for version, by_variant in sorted(seen.items(), key=lambda kv: _version(kv[0]) or Version("0")):
        v = _version(version)
        if v is None or v <= newest or v.is_devrelease or v.is_prerelease or v.local:
            continue
        rel, lists = _inferred(m, channel, version, by_variant)
        out.append(rel)
        arch_lists.extend(lists)
        warnings.append(
            f"torch {version} is on the index but newer than the shipped table ({m.as_of}): its GPU arch lists, "
            f"driver floors and companions are inferred from the newest release with the same variants"
        )
    return out, arch_lists, warnings


def serves(f: WheelFile, variant: str) -> bool:
    """Whether ``f`` on ``variant``'s page is a ``variant`` build: a file labelled for another variant (a mirror
    holding the CPU wheel under cu126) is not; an unlabelled one may be (the build guard has the last word). A
    label's first segment names the variant: ``+cu130.post1`` is a cu130 build."""
    return f.variant in ("", variant)


def _version(text: str) -> Optional[Version]:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _corrected(rel: Release, pages: dict[str, PageRead], by_variant: dict[str, list[WheelFile]]) -> Release:
    """A table release with its variants as the index has them: a variant whose page was read offers exactly the
    arches that page has files for; a variant whose page was not read keeps the table's word."""
    variants: dict[str, tuple[str, ...]] = {}
    for arch in ARCHES:
        table = [v for v in rel.variants.get(arch, ()) if v not in pages]
        found = [v for v, files in by_variant.items() if any(f.arch == arch for f in files) and v != "cpu"]
        variants[arch] = tuple(dict.fromkeys([*table, *found]))
    confirmed = any(v in pages for v in by_variant)
    python = _python_range(f for files in by_variant.values() for f in files) or rel.python
    return replace(rel, variants=variants, python=python, origin="index" if confirmed else rel.origin)


def _inferred(
    m: Matrix, channel: str, version: str, by_variant: dict[str, list[WheelFile]]
) -> tuple[Release, list[ArchList]]:
    variants = {
        arch: tuple(
            v for v, files in sorted(by_variant.items()) if v != "cpu" and any(f.arch == arch for f in files)
        )
        for arch in ARCHES
    }
    files = [f for fs in by_variant.values() for f in fs]
    base = max(
        (r for r in m.releases if r.channel in (channel, "stable")),
        key=lambda r: r.version,
    )
    glibcs = [f.glibc for f in files if f.glibc]
    rel = Release(
        torch=version,
        channel=channel,
        torchvision="",
        torchaudio="",
        python=_python_range(files) or base.python,
        variants=variants,
        aarch64_confidence="U",
        pypi_default=dict(base.pypi_default),
        glibc=max(glibcs, key=minor_tuple) if glibcs else base.glibc,
        glibc_by_variant={},
        source=f"read from the index; facts inferred from torch {base.torch}",
        checked="",
        origin="inferred",
    )
    lists = []
    for arch, names in variants.items():
        for variant in names:
            if m.arch_list(variant, arch, version) is None:
                prior = _newest_list(m, variant, arch)
                if prior is not None:
                    lists.append(replace(prior, torch=_exactly(version), confidence="U"))
    return rel, lists


def _newest_list(m: Matrix, variant: str, arch: str) -> Optional[ArchList]:
    rel = m.newest_with_variant(variant, arch)
    return m.arch_list(variant, arch, rel.torch) if rel is not None else None


def _exactly(version: str) -> SpecifierSet:
    return SpecifierSet(f"=={version}", prereleases=True)


def _python_range(files: Iterable[WheelFile]) -> Optional[tuple[str, str]]:
    minors = sorted(
        {p for f in files for p in f.pythons if p[:1].isdigit() and not p.endswith("t")}, key=minor_tuple
    )
    return (minors[0], minors[-1]) if minors else None


def _page_line(page: PageRead) -> str:
    if not page.ok:
        return f"{page.upstream}: not read ({page.error}); the shipped table stands in for it"
    return f"{page.upstream}: {len(page.files)} torch files, {page.line()}"


# ---------------------------------------------------------------------------------------------------------------
# What the install must bring


def expected_label(
    index: Optional[IndexFacts],
    upstream: str,
    version: str,
    arch: str,
    python: Optional[str],
) -> str:
    """The local version label every matching file on ``upstream`` carries ("cpu", "cu130"), or "" when the page
    was not read, has no such file, or its files disagree (then the plain pin and the build guard decide)."""
    if index is None or index.page(upstream) is None:
        return ""
    files = index.files_for(upstream, version, arch=arch, python=python)
    labels = {f.local for f in files if not f.yanked}
    return labels.pop() if len(labels) == 1 else ""


def builds_on(
    index: Optional[IndexFacts], upstream: str, version: str, arch: str
) -> Optional[list[WheelFile]]:
    """The ``version`` files ``upstream`` lists for ``arch`` (any label); None when that page was not read."""
    if index is None or index.page(upstream) is None:
        return None
    return [f for f in index.files_for(upstream, version, arch=arch) if not f.yanked]


def newest_on_index(index: Optional[IndexFacts], urls: Sequence[str]) -> Optional[str]:
    """The newest final release any of ``urls`` lists (for the table-age report)."""
    best: Optional[Version] = None
    for url in urls:
        if index is None or index.page(url) is None:
            continue
        for text in index.versions(url):
            v = _version(text)
            if v is not None and not (v.is_prerelease or v.is_devrelease) and (best is None or v > best):
                best = v
    return str(best) if best else None
