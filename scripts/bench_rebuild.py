#!/usr/bin/env python3
"""Benchmark: a default `envbuilder create` (with its validation) and a warm `create --force` rebuild, against a
cold create and raw uv, for one or more envbuilder trees side by side (before/after a change).

For each repeat, with a fresh uv cache per tree, from one local HTTP index serving a wheel directory:

  uv cold       uv venv + uv pip install (the reference for "no slower than a cold create")
  cold          envbuilder create RECIPE (default: the validation follows)
  force         envbuilder create RECIPE --force, warm (the old env replaced)
  force-novalidate   the same with --no-validate

The trees are interleaved within each repeat, so a slow spell of the machine falls on all alike. Usage:

    python scripts/bench_rebuild.py --wheels DIR [--recipe local] [--spec torch==2.13.0 --spec numpy]
        [--tree OLD_CHECKOUT] [--repeat 3] [--json FILE]

No network: ``--wheels`` holds every wheel the recipe and the specs need (as scripts/repack_wheels.py or
``pip download`` leave them). ``--tree`` adds an envbuilder source tree to compare (this one is always run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

from bench_create import PYPI_MAX_AGE, own_venv, sh, timed  # noqa: E402
from wheelindex import mirror_env, serve  # noqa: E402 - the tests' index server, found through sys.path

from envbuilder.backends.installers import uv_binary  # noqa: E402

STEPS = ("cold", "force", "force-novalidate")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", required=True, type=Path, help="directory of the wheels to serve")
    ap.add_argument("--recipe", default="local", help="the recipe envbuilder creates (default: local)")
    ap.add_argument("--spec", action="append", help="raw uv's requirements (default: torch==2.13.0, numpy)")
    ap.add_argument("--tree", action="append", default=[], type=Path, help="another envbuilder tree to time")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    uv = uv_binary()
    if not uv:
        raise SystemExit("uv is needed (pip install uv)")
    work = Path(tempfile.mkdtemp(prefix="envbuilder-bench-rebuild-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV"))}
    trees = {"this": REPO, **{f"tree{i + 1}": t.resolve() for i, t in enumerate(args.tree)}}
    pythons = {name: own_venv(work / name, tree) for name, tree in trees.items()}
    results: dict[str, dict[str, list[float]]] = {"uv": {"cold": []}}
    results.update({name: {s: [] for s in STEPS} for name in trees})
    with serve(args.wheels, max_age=PYPI_MAX_AGE) as index:
        for i in range(args.repeat):
            cache = work / f"cache-uv-{i}"
            results["uv"]["cold"].append(timed(_uv(base, uv, index.url, args.spec), work / f"uv-{i}", cache))
            shutil.rmtree(work / f"uv-{i}", ignore_errors=True)
            _say("uv", "cold", i, results["uv"]["cold"][-1])
            for name, python in pythons.items():
                env = {
                    **base,
                    "UV_CACHE_DIR": str(work / f"cache-{name}-{i}"),
                    "ENVBUILDER_HOME": str(work / f"home-{name}-{i}"),
                    "ENVBUILDER_INDEX_MIRROR": mirror_env(index),
                    "NO_COLOR": "1",
                }
                prefix = work / f"env-{name}-{i}"
                for step, more in zip(STEPS, ([], ["--force"], ["--force", "--no-validate"])):
                    argv = [python, "-m", "envbuilder", "create", args.recipe, "--prefix", str(prefix), "-q"]
                    seconds = timed(_run(argv + more, env), prefix, work / "unused")
                    results[name][step].append(seconds)
                    _say(name, step, i, seconds)
                shutil.rmtree(prefix, ignore_errors=True)
    _report(results, args)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _uv(base: dict[str, str], uv: str, url: str, specs: Optional[list[str]]) -> Callable[[Path, Path], None]:
    def way(prefix: Path, cache: Path) -> None:
        env = {**base, "UV_CACHE_DIR": str(cache)}
        sh([uv, "venv", "-q", "--python", sys.executable, str(prefix)], env)
        python = str(prefix / "bin" / "python")
        index = ["--index-url", f"{url}/simple/"]
        sh(
            [uv, "pip", "install", "-q", "--python", python, *index, *(specs or ["torch==2.13.0", "numpy"])],
            env,
        )

    return way


def _run(argv: list[str], env: dict[str, str]) -> Callable[[Path, Path], None]:
    return lambda prefix, cache: sh(argv, env)


def machine_line() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"


def _say(name: str, step: str, i: int, seconds: float) -> None:
    print(f"{name:8s} {step:17s} run {i + 1}: {seconds:7.2f} s", file=sys.stderr)


def _report(results: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> None:
    med = {n: {s: statistics.median(v) for s, v in r.items()} for n, r in results.items()}
    print(f"\nmachine: {machine_line()}")
    print(f"median of {args.repeat} runs ({args.recipe}, wheels from {args.wheels})\n")
    print(f"raw uv cold install: {med['uv']['cold']:.2f} s")
    print(f"{'tree':8s}" + "".join(f"{s + ' s':>20s}" for s in STEPS) + f"{'force / cold':>14s}")
    for name, m in med.items():
        if name != "uv":
            row = "".join(f"{m[s]:20.2f}" for s in STEPS)
            print(f"{name:8s}{row}{m['force'] / m['cold']:13.2f}x")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine_line(), "runs": results, "median": med}, indent=2)
        )


if __name__ == "__main__":
    sys.exit(main())
