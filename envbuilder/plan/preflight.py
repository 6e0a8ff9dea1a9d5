"""What an operation will write, estimated before it writes (pure): the bytes and files of a planned env, of an env
from its record, and the limits a recipe states for the file system a path is on.

Where no better figure is known (a plan's wheels carry no sizes: neither envbuilder's locks nor the PEP 503 pages
of download.pytorch.org give one), an env's size comes from :data:`INSTALLED`, a dated table of installed sizes per
torch variant, each with where its figure comes from. An env envbuilder made or restored has its own size in its
record (``files.bytes``/``files.count``, measured by ``system.envfiles``), which restore, backup and pack use.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, Callable, Optional

from envbuilder.core.space import Need, Stated, parse_count, parse_size
from envbuilder.core.structs import dataclass
from envbuilder.plan.prefix import expand
from envbuilder.plan.record import Plan
from envbuilder.recipe.loader import Recipe


@dataclass(frozen=True)
class Figure:
    bytes: int
    files: int
    source: str


#: Installed sizes of an env per torch variant (venv, torch and its dependencies), with their sources.
INSTALLED: Mapping[str, Figure] = {
    "cpu": Figure(
        872_679_596,
        21_784,
        "measured 2026-11-28 on envbuilder's test machine: a uv venv with torch 2.13.0+cpu (cp311) and its "
        "dependencies, 872,679,596 bytes in 21,784 files and directories",
    ),
    "cuda": Figure(
        5 << 30,
        25_000,
        "estimated, not measured here: a CUDA 12/13 torch wheel is 0.8-1.1 GB packed (pytorch/pytorch#157265, "
        "2025-06-30) and pulls nvidia-* wheels (cudnn 0.56 GB, cublas 0.32 GB packed: pytorch/builder#1371, "
        "2023-03-30); torch wheels unpack to about twice their size (pytorch/pytorch#56055, 2021-04-16): "
        "4.5-5 GB installed; files: the CPU env's count plus the nvidia-* packages' (a few thousand)",
    ),
    "none": Figure(
        23_088_707,
        1_659,
        "measured 2026-11-28 on envbuilder's test machine: python -m venv (3.11, with pip), 23 MB in 1,659 "
        "files and directories",
    ),
}


def figure(variant: Optional[str]) -> Figure:
    """The table's figure for a torch variant ("cpu", "cu126", "cu130"; None: no torch)."""
    if variant is None:
        return INSTALLED["none"]
    if variant == "cpu":
        return INSTALLED["cpu"]
    cuda = INSTALLED["cuda"]
    if variant.startswith("cu"):
        return cuda
    return Figure(
        cuda.bytes, cuda.files, f"no figure for {variant}: the CUDA one, the largest known ({cuda.source})"
    )


#: How many times its packed size a torch wheel takes once installed, per variant, with the source.
UNPACK: Mapping[str, tuple[float, str]] = {
    "cpu": (
        3.95,
        "torch 2.13.0+cpu cp311: a 191,794,682-byte wheel, 757,817,452 bytes installed (measured 2026-11-28)",
    ),
    "cuda": (2.05, "a CUDA torch wheel of 1.9 GB unpacked to 3.9 GB (pytorch/pytorch#56055, 2021-04-16)"),
}


def from_lock(the_plan: Plan) -> Optional[Figure]:
    """An env's size from the sizes its applying lock gives for every file it installs (times the variant's
    unpack ratio, plus a bare venv), with its files from the table; None where the lock is not used or a file
    lacks its size."""
    lock = the_plan.lock
    locked = the_plan.locked
    if lock is None or not lock.applies or locked is None or not locked.packages:
        return None
    sizes = [p.files[0].size for p in locked.packages if p.files]
    if not sizes or any(size is None for size in sizes):
        return None
    res = the_plan.resolution
    variant = res.variant if res else "cpu"
    ratio, why = UNPACK["cpu" if variant == "cpu" else "cuda"]
    packed = sum(size or 0 for size in sizes)
    bare, table = INSTALLED["none"], figure(res.variant if res else None)
    return Figure(
        int(packed * ratio) + bare.bytes,
        table.files,
        f"the lock's sizes: {len(sizes)} files, {packed:,} bytes packed, times {ratio} ({why}), plus a bare "
        f"venv; files: {table.source}",
    )


def for_plan(the_plan: Plan, cache: Optional[str]) -> list[Need]:
    """What creating ``the_plan``'s env writes: the env beside its prefix and, for uv, the unpacked copy its
    cache keeps (``cache``; a soft need: the cache may hold it already). uv hard-links from its cache where
    both are on one file system, so the two share their blocks there and are checked apart, not added up."""
    if the_plan.container is not None:
        return []  # an image's size is the registry's to say; not estimated
    res = the_plan.resolution
    fig = from_lock(the_plan) or figure(res.variant if res else None)
    where = str(PurePosixPath(the_plan.prefix).parent)
    needs = [Need(where, f"the env {the_plan.prefix}", fig.bytes, fig.files, fig.source)]
    if cache and the_plan.installer == "uv":
        needs.append(
            Need(cache, "uv's cache (its unpacked copy)", fig.bytes, fig.files, fig.source, soft=True)
        )
    return needs


def of_record(record: Mapping[str, Any]) -> Figure:
    """An env's size from its record's JSON: as measured when it was made (``files``), else the table's."""
    files = record.get("files") or {}
    if isinstance(files.get("bytes"), int) and isinstance(files.get("count"), int):
        when = files.get("measured") or "when it was made"
        return Figure(files["bytes"], files["count"], f"the env's record (measured {when})")
    res = (record.get("plan") or {}).get("resolution") or {}
    fig = figure(res.get("variant") if res else None)
    return Figure(fig.bytes, fig.files, f"not measured in its record: {fig.source}")


def of_backup(data: Mapping[str, Any]) -> Figure:
    """What restoring a backup (its ``backup.json``) puts back: the env as its record measured it, else a container
    env's image file as the backup holds it, else the table's figure for its variant."""
    record = data.get("record") or {}
    fig = of_record(record)
    image = data.get("image")
    if (
        fig.source.startswith("not measured")
        and isinstance(image, dict)
        and isinstance(image.get("size"), int)
    ):
        return Figure(image["size"], 16, f"the backup's image file, {image['size']:,} bytes")
    return fig


def limits(recipe: Recipe, env: Mapping[str, str]) -> Callable[[str], Optional[tuple[Stated, str]]]:
    """For a directory: the limits the recipe states for the [filesystems] entry holding it (the longest of
    their expanded paths that holds it) and that entry's quota tool ("" where it names none); None where no
    entry holds it."""
    roots = [(_root(fs.path, env, recipe.name), n, fs) for n, fs in recipe.filesystems.items()]

    def of(path: str) -> Optional[tuple[Stated, str]]:
        held = [r for r in roots if r[0] and (path == r[0] or path.startswith(r[0].rstrip("/") + "/"))]
        if not held:
            return None
        _, name, fs = max(held, key=lambda r: len(r[0]))
        size = parse_size(fs.quota) if fs.quota else None
        count = parse_count(fs.files_quota) if fs.files_quota else None
        return Stated(name, size, count), fs.quota_command or ""

    return of


def _root(path: str, env: Mapping[str, str], name: str) -> str:
    text, missing = expand(path, env, name)
    return "" if missing or not text.startswith("/") else text


def elsewhere(recipe: Recipe, env: Mapping[str, str], but: str) -> list[str]:
    """The site's other file systems, for a refusal's suggestion: "NAME (PATH)" of each entry that does not
    hold ``but``."""
    holding = limits(recipe, env)(but)
    skip = holding[0].name if holding else None
    out = []
    for n, fs in recipe.filesystems.items():
        root = _root(fs.path, env, recipe.name)
        if n != skip and root:
            out.append(f"{n} ({root})")
    return out
