"""The report of scripts/bench_node.py: the medians of its runs, the table of each tree against its baseline and
the issue's target (OUT/bench36.md), and the JSON of every run (OUT/bench36.json)."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from bench_node import Bench

#: The suite's largest all_reduce message (envbuilder/plan/suite.py), used when no report says it.
PROBE_BYTES = {"cuda": 1 << 30, "cpu": 16 << 20}


def medians(bench: Bench) -> dict[str, dict[str, float]]:
    got: dict[str, dict[str, list[float]]] = {}
    for r in bench.runs:
        if r["seconds"] is not None:
            got.setdefault(r["way"], {}).setdefault(r["what"], []).append(r["seconds"])
    return {way: {what: statistics.median(v) for what, v in whats.items()} for way, whats in got.items()}


#: Each row: the tree's figure, its baseline (a sum of raw figures, or the tree's own cold default create) and the
#: target the issue sets.
ROWS = [
    ("cold create --no-validate", "cold", ["uv:cold"], "<= 1.15x"),
    ("warm create --no-validate", "warm", ["uv:warm"], "<= +0.5 s"),
    ("warm create, against uv's cache in $HOME", "warm", ["uv:warm-home"], ""),
    ("default create (validation)", "default", ["uv:d-cold", "uv:probe"], "<= +2 s"),
    ("--force rebuild (warm)", "force", ["self:default"], "<= 1.0x"),
    ("restore (warm)", "restore", ["uv:r-warm"], "<= 1.2x"),
    ("restore --no-validate (warm)", "restore-nv", ["uv:r-warm"], "<= 1.2x"),
    ("restore (warm), against uv's cache in $HOME", "restore", ["uv:r-home"], ""),
    ("restore --check-import (warm)", "restore-import", ["uv:r-warm"], ""),
    ("backup", "backup", [], ""),
    ("validation suite (bench_validate.py)", "suite", ["self:bare"], "<= 1.3x"),
    ("suite against the bare loop + DDP training", "suite", ["self:bare-ddp"], ""),
]


def table(bench: Bench) -> str:
    med = medians(bench)
    raw = med.get("uv", {})
    n = max((r["round"] for r in bench.runs), default=-1) + 1
    lines = [
        f"machine: {machine()}; torch {bench.torch}+{bench.variant}, {wheels_size(bench.wheels)} of wheels; "
        f"median of {n} round(s)",
        "",
        "| | baseline | baseline s | "
        + " | ".join(f"{t} s | {t} vs baseline" for t in bench.trees)
        + " | target |",
        "|---|---|---|" + "---|---|" * len(bench.trees) + "---|",
    ]
    for label, what, base, target in ROWS:
        cells = []
        for tree in bench.trees:
            mine = med.get(tree, {})
            ref = baseline(base, raw, mine)
            value = mine.get(what)
            cells.append(fmt(value))
            cells.append(compare(value, ref) if base else "")
        if any(c not in ("-", "") for c in cells):
            own = any(b.startswith("self:") for b in base)  # each tree's own figure: no one number
            ref0 = "each tree's" if own else fmt(baseline(base, raw, {}))
            lines.append(f"| {label} | {' + '.join(base)} | {ref0} | {' | '.join(cells)} | {target} |")
    if "probe" in raw:
        lines.append(
            f"\nbare probe: {raw['probe']:.2f} s ({bench.probe.get('world', bench.nproc)} ranks, "
            f"{bench.probe.get('bytes', PROBE_BYTES[bench.device])} bytes)"
        )
    for tree in bench.trees:
        ratios = [
            r["busbw_ratio"] for r in bench.runs if r["way"] == tree and r.get("busbw_ratio") is not None
        ]
        if ratios:
            lines.append(
                f"{tree} suite busbw / bare busbw, median: {statistics.median(ratios):.3f} (target >= 0.97)"
            )
        diff = paired(bench, tree, "warm")
        if diff is not None:
            lines.append(f"{tree} warm - raw uv warm, median of the rounds' own differences: {diff:+.2f} s")
    lines += [f"{t}: {tree_rev(p)}" for t, p in bench.trees.items()]
    failed = [r for r in bench.runs if r["seconds"] is None]
    if failed:
        lines.append(
            f"FAILED runs: {', '.join(sorted({r['way'] + ':' + r['what'] for r in failed}))} (see JSON)"
        )
    return "\n".join(lines)


def paired(bench: Bench, tree: str, what: str) -> Optional[float]:
    """The median over rounds of the tree's figure less raw uv's of the same round (same slow spells)."""
    by_round: dict[int, dict[str, float]] = {}
    for r in bench.runs:
        if r["what"] == what and r["seconds"] is not None and r["way"] in ("uv", tree):
            by_round.setdefault(r["round"], {})[r["way"]] = r["seconds"]
    diffs = [d[tree] - d["uv"] for d in by_round.values() if len(d) == 2]
    return statistics.median(diffs) if diffs else None


def baseline(base: list[str], raw: dict[str, float], mine: dict[str, float]) -> Optional[float]:
    parts = [(mine if src == "self" else raw).get(what) for src, _, what in (b.partition(":") for b in base)]
    return None if not parts or None in parts else sum(p for p in parts if p is not None)


def compare(value: Optional[float], ref: Optional[float]) -> str:
    if value is None or not ref:
        return "-"
    return f"{value / ref:.2f}x, {value - ref:+.2f} s"


def fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


@functools.cache
def machine() -> str:
    gpus = ""
    if shutil.which("nvidia-smi"):
        res = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            check=False,
            capture_output=True,
            text=True,
        )
        names = res.stdout.split("\n")
        gpus = f", {len([x for x in names if x.strip()])}x {names[0].strip()}"
    return f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores{gpus}, Python {platform.python_version()}"


def wheels_size(wheels: Path) -> str:
    return f"{sum(f.stat().st_size for f in wheels.glob('*.whl')) / 2**30:.2f} GiB"


def tree_rev(tree: Path) -> str:
    """``tree`` and what it holds: its commit, with a mark where its package differs from that commit (a device
    copy is the landed commit plus the session's work), or that it is no checkout of its own (a `git archive` of
    another commit unpacked inside this one)."""

    def git(*args: str) -> str:
        res = subprocess.run(["git", "-C", str(tree), *args], check=False, capture_output=True, text=True)
        return res.stdout.strip() if res.returncode == 0 else ""

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != tree.resolve():
        return f"{tree} (not a git checkout of its own)"
    changed = (
        " + uncommitted changes to envbuilder/" if git("status", "--porcelain", "--", "envbuilder") else ""
    )
    return f"{tree} ({git('log', '-1', '--format=%h %s')[:90]}{changed})"


def save(bench: Bench) -> None:
    doc = {
        "machine": machine(),
        "torch": f"{bench.torch}+{bench.variant}",
        "wheels": str(bench.wheels),
        "python": bench.python,
        "trees": {t: str(p) for t, p in bench.trees.items()},
        "probe": bench.probe,
        "median": medians(bench),
        "runs": [{k: v for k, v in r.items() if k != "output"} for r in bench.runs],
    }
    (bench.out / "bench36.json").write_text(json.dumps(doc, indent=2) + "\n")
    (bench.out / "bench36.md").write_text(table(bench) + "\n")
