#!/usr/bin/env python3
"""Where a warm `envbuilder create` spends its time, phase by phase (issue 23's profile).

Builds the bench's env (torch 2.13.0 CPU + numpy, `create local --no-validate`, one local HTTP index) once to fill
uv's cache and envbuilder's index cache, then ``--repeat`` warm creates, each in a fresh process whose envbuilder
functions are wrapped with timers (the wrapping is this script's, in the child only; envbuilder is not changed).
Reports the median of each phase and the whole run's wall time, next to a bare ``python -c pass`` and the raw uv
way (``uv venv`` + one ``uv pip install``) on the same cache, so the overhead can be read off directly:

    python scripts/profile_create.py [--repeat 5] [--tree DIR] [--json FILE]

``--tree`` profiles another checkout of envbuilder (e.g. the tree before a change), with the same harness; a
phase the tree does not have is left out of its table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from bench_create import PYPI_MAX_AGE, make_ways, own_venv  # noqa: E402 - scripts/ is sys.path[0]: its raw uv way, its index
from wheelindex import mirror_env, serve  # noqa: E402 - the tests' index server, found through sys.path

#: (label, module, function): what the child wraps, in the order a create reaches them. A name the tree lacks is
#: skipped.
PHASES = (
    ("recipe catalog + load", "envbuilder.recipe.loader", "load"),
    ("host probe", "envbuilder.system.host", "probe"),
    ("lock lookup", "envbuilder.recipe.catalog", "find_lock"),
    ("index read (plan facts)", "envbuilder.resolver.indexread", "read_torch"),
    ("plan", "envbuilder.plan", "build"),
    ("prepare (installer, modules, python)", "envbuilder.build.create", "_prepare"),
    ("installer commands", "envbuilder.backends.buildlog", "run_logged"),
    ("install (venv + packages)", "envbuilder.build.create", "_install"),
    ("torch build guard", "envbuilder.build.create", "_guard"),
    ("guard: wheel digest (RECORD)", "envbuilder.backends.torcharch", "wheel_digest"),
    ("guard: read the build (files)", "envbuilder.backends.torchbuild", "read_build"),
    ("activate extension", "envbuilder.build.create", "_activate"),
    ("package inventory", "envbuilder.backends.base", "inventory"),
    ("world-write sweep", "envbuilder.backends.buildlog", "drop_world_write"),
    ("record (inventory, version, sweep)", "envbuilder.build.create", "_record"),
    ("installer version", "envbuilder.backends.toolversion", "version"),
    ("record saved", "envbuilder.system.state", "save"),
    ("create, all stages", "envbuilder.build.create", "create"),
)

CHILD = r"""
import functools, importlib, json, sys, time
T0 = time.perf_counter()
from envbuilder import cli
import envbuilder.commands.create

#: The index pages carry PyPI's Cache-Control (max-age=600), so a warm cache answers without asking again, for
#: every way alike.
PYPI_MAX_AGE = 600
T1 = time.perf_counter()
PHASES = json.loads(sys.argv[1])
marks = {}
def wrap(label, modname, attr):
    try:
        mod = importlib.import_module(modname)
    except ImportError:
        return
    fn = getattr(mod, attr, None)
    if fn is None:
        return
    @functools.wraps(fn)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            marks.setdefault(label, []).append(time.perf_counter() - t)
    # Rebind it wherever it was imported by name, so callers in other modules reach the timer too.
    for other in list(sys.modules.values()):
        if getattr(other, attr, None) is fn and (getattr(other, "__name__", "") or "").startswith("envbuilder"):
            setattr(other, attr, timed)
for label, modname, attr in PHASES:
    wrap(label, modname, attr)
T2 = time.perf_counter()
try:
    rc = cli.main(sys.argv[2:])
except SystemExit as e:
    rc = e.code
T3 = time.perf_counter()
marks["imports"] = [T1 - T0]
marks["command (cli.main)"] = [T3 - T2]
print(json.dumps({"rc": rc, "marks": marks}), file=sys.stderr)
"""


def run(argv: list[str], env: dict[str, str], cwd: str = "/") -> subprocess.CompletedProcess[str]:
    """``argv`` run from ``cwd`` (not this checkout, whose envbuilder ``python -c`` would import first)."""
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd=cwd)
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{res.stderr[-2000:]}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tree", type=Path, default=REPO, help="the envbuilder checkout to profile")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    from envbuilder.backends.installers import uv_binary  # noqa: PLC0415 - this checkout's, to find uv

    uv = uv_binary()
    if not uv:
        raise SystemExit("uv is needed (pip install uv)")
    work = Path(tempfile.mkdtemp(prefix="envbuilder-profile-"))
    files = work / "files"
    run(
        [sys.executable, "-m", "pip", "download", "-q", "--dest", str(files), "torch==2.13.0", "numpy"],
        dict(os.environ),
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV"))}
    base.update(UV_CACHE_DIR=str(work / "cache"), NO_COLOR="1", ENVBUILDER_HOME=str(work / "home"))
    with serve(files, max_age=PYPI_MAX_AGE) as index:
        base["ENVBUILDER_INDEX_MIRROR"] = mirror_env(index)
        raw_uv = make_ways(base, uv, index)["uv"]  # the manual way exactly as bench_create times it
        python = own_venv(work, args.tree.resolve())  # envbuilder's own venv, on the tree profiled
        results = profile(args, base, work, python, lambda prefix: raw_uv(prefix, work / "cache"))
    shutil.rmtree(work, ignore_errors=True)
    report(results, args)
    return 0


def profile(
    args: argparse.Namespace, env: dict[str, str], work: Path, python: str, raw_uv: Callable[[Path], None]
) -> dict[str, list[float]]:
    phases = json.dumps(PHASES)
    out: dict[str, list[float]] = {}

    def create(n: str) -> dict[str, list[float]]:
        prefix = work / n
        argv = [python, "-c", CHILD, phases, "create", "local", "--name", n, "--prefix", str(prefix)]
        t0 = time.perf_counter()
        res = run([*argv, "--no-validate", "-q"], env)
        wall = time.perf_counter() - t0
        marks = json.loads(res.stderr.strip().splitlines()[-1])["marks"]
        shutil.rmtree(prefix, ignore_errors=True)
        return {**marks, "wall (whole process)": [wall]}

    def raw(n: str) -> float:
        prefix = work / n
        t0 = time.perf_counter()
        raw_uv(prefix)
        wall = time.perf_counter() - t0
        shutil.rmtree(prefix, ignore_errors=True)
        return wall

    create("fill")  # uv's cache and the index cache
    raw("fill-raw")
    for i in range(args.repeat):
        for label, times in create(f"e{i}").items():
            out.setdefault(label, []).append(sum(times))
            if label == "installer commands":  # each call too: venv, torch, the packages, the version
                for k, seconds in enumerate(times, 1):
                    out.setdefault(f"  installer command {k}", []).append(seconds)
        t0 = time.perf_counter()
        subprocess.run([python, "-c", "pass"], env=env, check=True)
        out.setdefault("bare python -c pass", []).append(time.perf_counter() - t0)
        out.setdefault("raw uv (venv + one install)", []).append(raw(f"r{i}"))
    return out


def report(results: dict[str, list[float]], args: argparse.Namespace) -> None:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"
    print(f"machine: {machine}\ntree: {args.tree}\nmedian of {args.repeat} warm creates, seconds\n")
    order = ["wall (whole process)", "bare python -c pass", "imports", "command (cli.main)"]
    for label in dict.fromkeys(label for label, _, _ in PHASES):
        order.append(label)
        if label == "installer commands":
            order += sorted(k for k in results if k.startswith("  installer command"))
    order.append("raw uv (venv + one install)")
    for label in order:
        if label in results:
            print(f"{label:40s}{statistics.median(results[label]):8.3f}")
    eb, uv = (
        statistics.median(results["wall (whole process)"]),
        statistics.median(results["raw uv (venv + one install)"]),
    )
    paired = statistics.median(
        e - u for e, u in zip(results["wall (whole process)"], results["raw uv (venv + one install)"])
    )  # each create against the raw uv run right after it
    print(f"\nenvbuilder warm - raw uv warm: {eb - uv:+.3f} s (target: within 0.3 s)")
    print(f"  median of the runs' own differences: {paired:+.3f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine, "tree": str(args.tree), "runs": results}, indent=2)
        )


if __name__ == "__main__":
    sys.exit(main())
