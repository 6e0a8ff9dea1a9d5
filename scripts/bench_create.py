#!/usr/bin/env python3
"""Benchmark: `envbuilder create` against the manual ways, on the same wheels and the same cache state.

Three ways to build the same torch env (torch 2.13.0 CPU + numpy), each from one local HTTP index serving the same
files (so no run is favoured by the network):

  pip        the seeds' way: python -m venv, then pip install from the index
  uv         raw uv: uv venv, then uv pip install from the index
  envbuilder envbuilder create local --no-validate (the index reached through ENVBUILDER_INDEX_MIRROR)

Each is timed cold (empty cache: pip's or uv's) and warm (the cache filled by an earlier build), ``--repeat``
times; the median is reported with ratios. Usage:

    python scripts/bench_create.py [--repeat 3] [--skip-pip] [--json FILE]

Needs the CPU torch 2.13.0 file that pip finds here (find-links) for CPython 3.11.

Node mode (``--wheels DIR``, scripts/bench_node.py; scripts/gpu_bench36.sh runs it on a GPU node): raw uv against
``envbuilder create`` from a local wheel directory (cold, warm, with validation, ``--force``, backup and restore),
for one or more source trees in one run:

    python scripts/bench_create.py --wheels DIR [--cpu] [--tree OLD=PATH --tree NEW=PATH] [--parts create,default,restore]
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
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from wheelindex import Index, mirror_env, serve  # noqa: E402 - the tests' index server, found through sys.path

from envbuilder.backends.installers import uv_binary  # noqa: E402

#: The index pages carry PyPI's Cache-Control (max-age=600), so a warm cache answers without asking again, for
#: every way alike.
PYPI_MAX_AGE = 600


def own_venv(work: Path, tree: Path = REPO) -> str:
    """A Python of envbuilder's own, as ``pipx install hpc-envbuilder`` gives users: a venv that sees ``tree`` and
    the packages envbuilder needs (rich, packaging: this interpreter's site-packages, as plain path entries) and
    nothing else. Run from this interpreter instead, every start would also pay for the ``.pth`` files of its
    site-packages (on the 2-core VM a sandbox hook imports certifi at each start, about 23 ms), which no user's
    envbuilder runs and the raw ways never pay (uv starts no Python; pip runs inside the new venv)."""
    venv = work / "envbuilder-venv"
    sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], dict(os.environ))
    site_dirs = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site_packages(venv) / "envbuilder-bench.pth").write_text(
        "".join(f"{d}\n" for d in [str(tree), *site_dirs])
    )
    return str(venv / "bin" / "python")


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def sh(argv: list[str], env: dict[str, str]) -> None:
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{res.stderr[-2000:]}")


def timed(fn, prefix: Path, cache: Path) -> float:
    # Untimed: what earlier runs left dirty (a cold run writes about 1.5 GB) is written out first, so no run pays for
    # the write-back of the run before it. Without it a warm run right after its own cold run was slowed by that
    # run's write-back, more for a way whose cold run ends without an fsync (raw uv) than for envbuilder (whose
    # record's fsyncs flush as it ends).
    os.sync()
    t0 = time.perf_counter()
    fn(prefix, cache)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-pip", action="store_true", help="leave out the slow pip way")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    node = ap.add_argument_group("node mode (scripts/bench_node.py): a local wheel directory, no network")
    node.add_argument(
        "--wheels", metavar="DIR", help="the wheel directory (torch and what it needs): node mode"
    )
    node.add_argument("--cpu", action="store_true", help="CPU torch (fetched into DIR if absent), gloo ranks")
    node.add_argument(
        "--tree", action="append", metavar="NAME=PATH", help="a source tree to measure (repeat)"
    )
    node.add_argument(
        "--parts",
        default="create,default,restore",
        help="comma-separated: create, default, restore, validate",
    )
    node.add_argument("--python", default="python3", help="the python of raw uv's venv and of the recipe")
    node.add_argument("--variant", help="torch variant where the torch file's version has no label")
    node.add_argument("--nproc", type=int, default=2, help="bare probe ranks where no suite report says")
    node.add_argument("--out", metavar="DIR", help="bench36.md and bench36.json go here (default .)")
    node.add_argument(
        "--work", metavar="DIR", help="envs and caches (default a new temporary directory; emptied)"
    )
    args = ap.parse_args()
    if args.wheels:
        import bench_node  # noqa: PLC0415 - a sibling script, only for this mode

        uv = uv_binary()
        if not uv:
            raise SystemExit("uv is needed (pip install uv)")
        return bench_node.run(args, uv)

    work = Path(tempfile.mkdtemp(prefix="envbuilder-bench-"))
    files = work / "files"
    sh(
        [sys.executable, "-m", "pip", "download", "-q", "--dest", str(files), "torch==2.13.0", "numpy"],
        dict(os.environ),
    )
    uv = uv_binary()
    if not uv:
        raise SystemExit("uv is needed (pip install uv)")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV"))}
    base["PIP_CONFIG_FILE"] = os.devnull
    base["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    with serve(files, max_age=PYPI_MAX_AGE) as index:
        ways = make_ways(base, uv, index, own_venv(work))
        if args.skip_pip:
            del ways["pip"]
        results = time_ways(ways, work, args.repeat)

    report(results, args)
    shutil.rmtree(work, ignore_errors=True)
    return 0


Way = Callable[[Path, Path], None]


def make_ways(base: dict[str, str], uv: str, index: Index, python: str = sys.executable) -> dict[str, Way]:
    """The three ways to build the env at a prefix with a cache directory, all from ``index``; envbuilder runs
    under ``python`` (see ``own_venv``)."""
    simple = f"{index.url}/simple/"
    specs = ["torch==2.13.0", "numpy"]

    def pip_way(prefix: Path, cache: Path) -> None:
        env = {**base, "PIP_CACHE_DIR": str(cache)}
        sh([sys.executable, "-m", "venv", str(prefix)], env)
        sh(
            [str(prefix / "bin" / "python"), "-m", "pip", "install", "-q", "--index-url", simple, *specs],
            env,
        )

    def uv_way(prefix: Path, cache: Path) -> None:
        env = {**base, "UV_CACHE_DIR": str(cache)}
        sh([uv, "venv", "-q", "--python", sys.executable, str(prefix)], env)
        sh(
            [
                uv,
                "pip",
                "install",
                "-q",
                "--python",
                str(prefix / "bin" / "python"),
                "--index-url",
                simple,
                *specs,
            ],
            env,
        )

    def envbuilder_way(prefix: Path, cache: Path) -> None:
        env = {
            **base,
            "UV_CACHE_DIR": str(cache),
            # Beside the cache, so the warm run also has what the cold one left in envbuilder's own cache (the
            # index pages read for the plan), as a user's second create does.
            "ENVBUILDER_HOME": str(cache.parent / f"{cache.name}-envbuilder-home"),
            "ENVBUILDER_INDEX_MIRROR": mirror_env(index),
            "NO_COLOR": "1",
        }
        sh(
            [
                python,
                "-m",
                "envbuilder",
                "create",
                "local",
                "--prefix",
                str(prefix),
                "--no-validate",
                "-q",
            ],
            env,
        )

    return {"pip": pip_way, "uv": uv_way, "envbuilder": envbuilder_way}


def time_ways(ways: dict[str, Way], work: Path, repeat: int) -> dict[str, dict[str, list[float]]]:
    """Each repeat runs every way in turn (cold, then warm on the cache the cold run filled), so a slow spell of the
    machine (this VM's disk swings a warm uv install between 0.5 and 1.2 s) falls on all ways alike, not on
    whichever way happened to run then."""
    results: dict[str, dict[str, list[float]]] = {name: {"cold": [], "warm": []} for name in ways}
    for i in range(repeat):
        for name, fn in ways.items():
            cache = work / f"cache-{name}-{i}"
            for state in ("cold", "warm"):  # cold fills the cache the warm run then uses
                prefix = work / f"env-{name}-{i}-{state}"
                seconds = timed(fn, prefix, cache)
                results[name][state].append(seconds)
                shutil.rmtree(prefix, ignore_errors=True)
                print(f"{name:10s} {state:4s} run {i + 1}: {seconds:7.2f} s", file=sys.stderr)
    return results


def report(results: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> None:
    med = {n: {s: statistics.median(v) for s, v in r.items()} for n, r in results.items()}
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"
    print(f"\nmachine: {machine}")
    print(f"median of {args.repeat} runs (torch 2.13.0 CPU + numpy, local HTTP index)\n")
    print(f"{'way':12s}{'cold s':>10s}{'warm s':>10s}")
    for n, m in med.items():
        print(f"{n:12s}{m['cold']:10.2f}{m['warm']:10.2f}")
    eb, raw = med["envbuilder"], med["uv"]
    print()
    paired = statistics.median(
        e - u for e, u in zip(results["envbuilder"]["warm"], results["uv"]["warm"])
    )  # each envbuilder run against the raw uv run of its own repeat
    print(f"envbuilder warm - raw uv warm: {eb['warm'] - raw['warm']:+.2f} s   (target: within 0.3 s)")
    print(f"  median of the repeats' own differences: {paired:+.2f} s")
    print(f"envbuilder cold / raw uv cold: {eb['cold'] / raw['cold']:.2f}x   (target: within 1.1x)")
    if "pip" in med:
        print(
            f"pip warm / envbuilder warm:    {med['pip']['warm'] / eb['warm']:.1f}x   (target: 50x or more)"
        )
        print(f"pip cold / envbuilder cold:    {med['pip']['cold'] / eb['cold']:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "runs": results, "median": med}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
