"""What the resolver knows (pure): the shipped table, brought up to date by what the wheel indexes say.

The table (``data/torch_matrix.toml``) holds what a file name cannot tell: GPU arch lists, driver floors, PyPI's
default build, companions. The index holds what the table can only remember: which releases exist, which variants
and platforms each has, which Pythons. Where both speak, the index wins, because it is what the install will use.
A release on the index that the table does not know is *inferred*: it takes its variants' facts from the newest
release the table has with that variant, and the plan says so.

No I/O: ``envbuilder.resolver.indexread`` reads the pages and hands an :class:`IndexFacts` in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from envbuilder.resolver.gates import TorchRequest
from envbuilder.resolver.matrix import ArchList, Matrix, Release, minor_tuple
from envbuilder.structs import dataclass

if TYPE_CHECKING:  # the pure parts only name these types; indexfacts is read at plan time
    from envbuilder.resolver.indexfacts import IndexFacts, PageRead, WheelFile

ARCHES = ("x86_64", "aarch64")
#: How many of the newest table releases decide which variant pages an "auto" plan reads.
RECENT = 3


@dataclass(frozen=True)
class Knowledge:
    matrix: Matrix
    #: Where the facts came from, one line each (plan output, ``recipes show --explain``).
    lines: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------------------------
# Which pages to read


def upstreams(request: TorchRequest, m: Matrix) -> list[str]:
    """The index pages a plan for ``request`` reads: each candidate variant's index, and PyPI's for stable."""
    channel = request.channel if request.channel in m.index else "stable"
    base = m.index[channel]
    if request.variant not in ("auto", ""):
        variants = [request.variant]
    elif channel == "nightly":
        variants = ["cpu", *_union(m.nightly.get(a, ()) for a in ARCHES)]
    else:
        pool = sorted((r for r in m.releases if r.channel == channel), key=lambda r: r.version, reverse=True)
        # A pinned release (or minor) reads its own variants' pages; `latest` those of the newest releases.
        pinned = [r for r in pool if r.torch == request.version or r.torch.startswith(request.version + ".")]
        chosen = pinned or pool[:RECENT]
        variants = ["cpu", *_union(arch_variants for r in chosen for arch_variants in r.variants.values())]
    urls = [base.format(variant=v) for v in variants if v == "cpu" or v in m.variants]
    if channel == "stable":
        urls.append(m.index["pypi"])
    return list(dict.fromkeys(urls))


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
    releases, arch_lists, warnings = _merged_releases(m, channel, pages, seen)
    merged = replace(m, releases=tuple(releases), arch_lists=(*m.arch_lists, *arch_lists))
    lines = [_page_line(p) for p in index.pages.values()]
    lines.append(f"GPU arch lists, driver floors, PyPI default builds, companions: {table}")
    return Knowledge(merged, tuple(lines), tuple(warnings))


def _variant_pages(m: Matrix, index: IndexFacts, channel: str) -> dict[str, PageRead]:
    """variant -> the page read for it on ``channel``'s index (ok pages only)."""
    out = {}
    for variant in m.variants:
        page = index.page(m.index[channel].format(variant=variant))
        if page is not None:
            out[variant] = page
    return out


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
