"""What the index says about the shipped table, nightly pins and locks: releases the table does not know, and
pinned files the index no longer lists; and which rows of the table were last checked too long ago. Also which index pages those checks need, so that the command reads
them once (:func:`envbuilder.doctor.collect.read_indexes`). Pure: the pages come in as :class:`IndexFacts`."""

from __future__ import annotations

import datetime
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Optional

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuilder import lockfile
from envbuilder import plan as planner
from envbuilder.doctor.findings import ACTION, INFO, NODE, WARNING, Finding
from envbuilder.resolver import knowledge
from envbuilder.resolver.indexfacts import IndexFacts
from envbuilder.resolver.matrix import Matrix
from envbuilder.system.state import EnvRecord

if TYPE_CHECKING:  # report imports these checks; the inputs are only read here
    from envbuilder.doctor.report import EnvInputs

#: PyTorch prunes nightly wheels after roughly two to three months (the table's nightly.retention_days wins).
NIGHTLY_OLD_DAYS = 60
#: A table older than this is worth comparing with the index even when nothing looks wrong.
TABLE_OLD_DAYS = 30
#: A table row last checked longer ago than this is named: its facts may have moved since.
TABLE_ROW_OLD_DAYS = 90
#: Projects the torch indexes serve (a lock's files of these are checked against their index pages).
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")

_NIGHTLY_DATE = re.compile(r"\.dev(\d{8})")


# ---------------------------------------------------------------------------------------------------------------
# The shipped table's age against the index


def table_findings(
    matrix: Matrix, today: datetime.date, index: Optional[IndexFacts], upstreams: Sequence[str]
) -> list[Finding]:
    age = matrix.age_days(today)
    known = [Version(r.torch) for r in matrix.releases if r.channel == "stable"]
    newest_known = max(known) if known else None
    pages = [u for u in upstreams if index is not None and index.page(u) is not None]
    if index is None or not pages:
        why = (index.fallback if index is not None else None) or "no index page was read"
        return [
            Finding(
                INFO,
                NODE,
                "table",
                f"the shipped table is {age} days old (as of {matrix.as_of}); the index was not read ({why})",
                "run envbuilder doctor where the index is reachable to compare"
                if age > TABLE_OLD_DAYS
                else "",
            )
        ]
    seen: list[Version] = []
    for url in pages:
        for text in index.versions(url):
            try:
                v = Version(text)
            except InvalidVersion:
                continue
            if not v.is_prerelease and not v.is_devrelease:
                seen.append(v)
    newest = max(seen) if seen else None
    if newest is not None and (newest_known is None or newest > newest_known):
        unknown = sorted({str(v) for v in seen if newest_known is None or v > newest_known}, key=Version)
        return [
            Finding(
                WARNING,
                NODE,
                "table",
                f"the table is {age} days old (as of {matrix.as_of}); the index has torch "
                f"{', '.join(unknown)}, which the table does not know (its newest is {newest_known})",
                "upgrade envbuilder for current GPU and driver facts; until then plans read the releases from "
                "the index and infer their GPU facts from the newest release the table knows",
            )
        ]
    return [
        Finding(
            INFO,
            NODE,
            "table",
            f"the table (as of {matrix.as_of}, {age} days old) knows the newest torch on the index "
            f"({newest or 'none listed'})",
        )
    ]


def table_row_findings(matrix: Matrix, today: datetime.date, days: int = TABLE_ROW_OLD_DAYS) -> list[Finding]:
    """One warning per part of the shipped table (variants, releases, GPU arch lists, ...) naming its rows whose
    ``checked`` day is more than ``days`` before ``today``, or that carry no readable day at all."""
    found: dict[str, dict[str, list[str]]] = {}  # part -> checked -> row names, in table order
    rows = _dated_rows(matrix)
    releases = [n for p, n, _ in rows if p == "release rows"]
    for part, name, checked in rows:
        try:
            age = (today - datetime.date.fromisoformat(checked)).days
        except ValueError:
            age = None
        if age is None or age > days:
            when = f"checked {checked}, {age} days ago" if age is not None else "no checked date"
            found.setdefault(part, {}).setdefault(when, []).append(name)
    return [
        Finding(
            WARNING,
            NODE,
            "table-rows",
            f"{sum(len(n) for n in by_day.values())} {part} of the shipped table were last checked more than "
            f"{days} days ago: "
            + "; ".join(
                f"{_runs(names, releases) if part == 'release rows' else ', '.join(names)} ({when})"
                for when, names in by_day.items()
            ),
            "their facts may have changed since: plans read releases, variants and Pythons from the index, but GPU "
            "arch lists and driver floors only from this table; a newer envbuilder ships re-checked rows",
        )
        for part, by_day in found.items()
    ]


def _dated_rows(matrix: Matrix) -> list[tuple[str, str, str]]:
    """(part, row name, checked) of every dated row of the shipped table, in table order."""
    rows = [("variant rows", name, v.checked) for name, v in matrix.variants.items()]
    rows += [("release rows", r.torch, r.checked) for r in matrix.releases if r.origin == "table"]
    rows += [
        ("GPU arch list rows", f"{a.variant}/{a.platform} torch {_spec(a.torch)}", a.checked)
        for a in matrix.arch_lists
    ]
    rows.append(("nightly rows", "nightly", str(matrix.nightly.get("checked") or "")))
    for key, (_, checked) in matrix.provenance.items():
        part, _, name = key.partition(".")
        rows.append((f"{part} rows", name, checked))
    return rows


def _spec(spec: SpecifierSet) -> str:
    """``>=2.9,<2.12`` (lower bound first), as the table writes it."""
    return ",".join(sorted((str(s) for s in spec), reverse=True))


def _runs(names: Sequence[str], order: Sequence[str]) -> str:
    """``names`` (a subset of ``order``, in its order) with each run of three or more neighbours in ``order``
    written ``first–last``: the releases 2.0.0 to 2.12.1 as ``2.0.0–2.12.1``, not 24 versions."""
    where = {n: i for i, n in enumerate(order)}
    runs: list[list[str]] = []
    for name in names:
        if runs and name in where and where.get(runs[-1][-1], -2) + 1 == where[name]:
            runs[-1].append(name)
        else:
            runs.append([name])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) >= 3 else ", ".join(r) for r in runs)


# ---------------------------------------------------------------------------------------------------------------
# Nightly pins and locks whose files left their index


def nightly_findings(
    record: EnvRecord,
    index: Optional[IndexFacts],
    today: datetime.date,
    backed_up: bool,
    retention_days: int = NIGHTLY_OLD_DAYS,
) -> list[Finding]:
    torch = (record.plan or {}).get("torch") or {}
    if torch.get("channel") != "nightly":
        return []
    name, version, url = record.name, str(torch.get("torch", "")), str(torch.get("index_url", ""))
    keep = (
        f"keep the backup you have (envbuilder restore {name} brings it back)"
        if backed_up
        else f"back it up now while it works: envbuilder backup {name}"
    )
    page = index.page(url) if index is not None and url else None
    dated = _NIGHTLY_DATE.search(version)
    age = (today - datetime.datetime.strptime(dated.group(1), "%Y%m%d").date()).days if dated else None
    if page is not None:
        listed = {_normal(v) for v in index.versions(url)} if index is not None else set()
        if _normal(version) not in listed:
            return [
                Finding(
                    ACTION,
                    name,
                    "nightly",
                    f"its nightly torch {version} has left {url}: a rebuild cannot install it",
                    f"{keep}; to rebuild, move the recipe to a nightly the index still has, or to a release",
                )
            ]
    if age is not None and age > retention_days:
        where = "still on its index" if page is not None else "not checked against its index"
        return [
            Finding(
                WARNING,
                name,
                "nightly",
                f"its nightly torch {version} is {age} days old ({where}); PyTorch prunes nightlies after two to "
                "three months",
                keep,
            )
        ]
    return []


def _normal(version: str) -> str:
    try:
        return str(Version(version).public)
    except InvalidVersion:
        return version


def lock_index_urls(platform: lockfile.PlatformLock) -> list[str]:
    """The index URLs a platform's lock was resolved from (its --index-url / --extra-index-url values)."""
    flags = list(platform.inputs.get("index_flags") or [])
    return [flags[i + 1] for i, f in enumerate(flags[:-1]) if f in ("--index-url", "--extra-index-url")]


def lock_findings(
    name: str, lock: lockfile.Lock, arch: Optional[str], indexes: Mapping[str, IndexFacts]
) -> list[Finding]:
    """A lock's torch-family files that no page of their index lists any more (``indexes``: project -> what was
    read for it). Files whose index could not be read are not judged."""
    platform = lock.for_arch(arch) if arch else (lock.platforms[0] if lock.platforms else None)
    if platform is None:
        return []
    urls = lock_index_urls(platform)
    missing: list[str] = []
    checked = 0
    for pkg in platform.packages:
        project = canonicalize_name(pkg.name)
        index = indexes.get(project)
        if project not in TORCH_FAMILY or pkg.is_conda or index is None:
            continue
        pages = [p for p in (index.page(u) for u in urls) if p is not None]
        if not pages:
            continue
        listed = {f.filename for p in pages for f in p.files}
        for f in pkg.files:
            filename = urllib.parse.unquote(f.url.rsplit("/", 1)[-1].split("#", 1)[0])
            checked += 1
            if filename not in listed:
                missing.append(filename)
    where = f"the lock {lock.path or '(unnamed)'}"
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return [
            Finding(
                ACTION,
                name,
                "lock",
                f"{where} pins files its index no longer lists: {', '.join(missing[:3])}{more}; "
                "create --locked cannot install them",
                f"make a new lock (envbuilder lock {name}); keep this env with envbuilder backup {name}",
            )
        ]
    if checked:
        return [Finding(INFO, name, "lock", f"{where}: its {checked} torch file(s) are still on their index")]
    return []


# ---------------------------------------------------------------------------------------------------------------
# The index pages the checks need


def torch_upstreams(inputs: Sequence[EnvInputs], matrix: Matrix) -> list[str]:
    """The torch index pages the checks read: what each recipe's plan reads, each env's own index, PyPI."""
    urls: list[str] = []
    for inp in inputs:
        request = planner.torch_request(inp.recipe) if inp.recipe is not None else None
        if request is not None:
            urls += knowledge.upstreams(request, matrix)
        recorded = ((inp.record.plan or {}).get("torch") or {}).get("index_url")
        if recorded:
            urls.append(str(recorded))
    urls.append(matrix.index["pypi"])
    return list(dict.fromkeys(urls))


def lock_upstreams(inputs: Sequence[EnvInputs]) -> dict[str, list[str]]:
    """project -> the index URLs the envs' locks resolved their torch-family files from."""
    out: dict[str, list[str]] = {}
    for inp in inputs:
        if inp.lock is None:
            continue
        for platform in inp.lock.platforms:
            for pkg in platform.packages:
                project = canonicalize_name(pkg.name)
                if project in TORCH_FAMILY and not pkg.is_conda:
                    out.setdefault(project, []).extend(lock_index_urls(platform))
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}
