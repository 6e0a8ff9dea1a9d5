#!/usr/bin/env python3
"""Benchmark the bundled validation against the manual way, in one run, on one env.

For a recorded env (``envbuilder create`` made it): the whole suite through ``envbuilder validate`` (its wall
time, and the busbw its bandwidth sweep reports at its largest message), and a bare torch.distributed
all_reduce loop (scripts/raw_allreduce.py) launched with torchrun on the same ranks and message size. Reports
the ratio of the two busbw figures (target >= 0.95), the suite's wall time (target <= 10 s, on 2 GPUs or 2 gloo
CPU ranks) and its ratio to the bare loop's wall time (torchrun's start, one `import torch` per rank, the loop).
Also says what the figures depend on: the 1-minute load average before and after, and whether the env holds
bytecode for torch and for what DDP imports (torch._dynamo); without it every rank compiles them from source.

    python scripts/bench_validate.py ENV [--runs 3] [--cpu] [-- extra validate args]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def envbuilder(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbuilder", *args], capture_output=True, text=True, check=False
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("env")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="validate with --cpu (gloo) and a CPU raw loop")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    parser.add_argument("extra", nargs="*", help="more `envbuilder validate` arguments")
    args = parser.parse_args()

    shown = envbuilder("show", args.env, "--json")
    if shown.returncode != 0:
        sys.exit(f"envbuilder show {args.env}: {shown.stderr.strip()}")
    prefix = Path(json.loads(shown.stdout)["data"]["prefix"])
    python = str(prefix / "bin" / "python")

    load_before = round(os.getloadavg()[0], 2)
    suite_walls, suite_busbw, reports = [], [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        res = envbuilder("validate", args.env, "--json", *(["--cpu"] if args.cpu else []), *args.extra)
        wall = time.perf_counter() - t0
        data = json.loads(res.stdout)["data"]
        if res.returncode != 0:
            sys.exit(f"validate failed (rc {res.returncode}): {res.stderr[-2000:]}")
        reports.append(data)
        suite_walls.append(wall)
        busbw = data["checks"]["nccl"]["figures"]["busbw"]
        suite_busbw.append(busbw["value"])
    world, device = reports[0]["world"], reports[0]["device"]
    nbytes = reports[0]["checks"]["nccl"]["figures"]["busbw"]["bytes"]

    raw_busbw, raw_walls = [], []
    for _ in range(args.runs):
        wall, busbw = bare_loop(python, world, nbytes, device)
        raw_walls.append(wall)
        raw_busbw.append(busbw)

    figures = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
        "env": args.env,
        "device": device,
        "world": world,
        "bytes": nbytes,
        "runs": args.runs,
        "load_1min": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "bytecode": bytecode(prefix),
        "suite_wall_s": [round(x, 2) for x in suite_walls],
        "suite_wall_median_s": round(statistics.median(suite_walls), 2),
        "suite_busbw_GBps": suite_busbw,
        "raw_busbw_GBps": [round(x, 2) for x in raw_busbw],
        "raw_wall_s": [round(x, 2) for x in raw_walls],
        "suite_over_raw_wall_median": round(statistics.median(suite_walls) / statistics.median(raw_walls), 2),
        # One rank moves nothing between ranks (busbw 0): no ratio then.
        "busbw_ratio_median": round(statistics.median(suite_busbw) / statistics.median(raw_busbw), 3)
        if statistics.median(raw_busbw)
        else None,
        "per_check_s": _per_check(reports[-1]),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def bare_loop(python: str, world: int, nbytes: int, device: str) -> tuple[float, float]:
    """The bare program (raw_allreduce.py under torchrun, ``world`` ranks of ``python``): its wall time and the
    busbw it prints. Also scripts/bench_create.py's bare probe."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    argv = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
            str(HERE / "raw_allreduce.py"), "--bytes", str(nbytes), "--device", device]  # fmt: skip
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if not line:
        sys.exit(f"raw loop failed (rc {res.returncode}): {res.stderr[-2000:]}")
    return wall, float(json.loads(line[-1])["busbw"])


def bytecode(prefix: Path) -> dict[str, bool]:
    """Whether the env holds compiled modules of torch, and of what DDP's constructor imports."""
    site = "lib/python*/site-packages"
    return {
        pkg.replace("/", "."): any(prefix.glob(f"{site}/{pkg}/__pycache__/__init__.*.pyc"))
        for pkg in ("torch", "torch/_dynamo")
    }


def _per_check(data: dict) -> dict:
    """Seconds per check in the last run (the slowest rank)."""
    return {
        name: max((r.get("seconds") or 0.0 for r in check["per_rank"].values()), default=None)
        for name, check in data["checks"].items()
    }


if __name__ == "__main__":
    sys.exit(main())
