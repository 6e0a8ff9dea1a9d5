#!/usr/bin/env python3
"""Benchmark `envbuilder run` against the manual way, in one run, on one env.

For a recorded env: a small DDP program (scripts/ddp_train.py) started with ``envbuilder run ENV
--gpus-per-node N -- PROGRAM``, and the same program started the way a site page says: activate the env, then
``python -m torch.distributed.run --standalone --nproc-per-node=N PROGRAM``. Runs alternate, so both meet the
same machine load. Reports the median wall time of each and their ratio (what envbuilder's launch costs: its
start, reading the record and the recipe, binding the launch).

    python scripts/bench_run.py ENV [--runs 5] [--ranks 2] [--json FILE]
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
PROGRAM = HERE / "ddp_train.py"


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"{argv[0]} failed (rc {res.returncode}): {res.stderr[-2000:]}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("env")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()

    shown = subprocess.run(
        [sys.executable, "-m", "envbuilder", "show", args.env, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        sys.exit(f"envbuilder show {args.env}: {shown.stderr.strip()}")
    prefix = Path(json.loads(shown.stdout)["data"]["prefix"])
    env = dict(os.environ)
    envbuilder = [
        sys.executable,
        "-m",
        "envbuilder",
        "run",
        args.env,
        "--gpus-per-node",
        str(args.ranks),
        "--",
    ]
    # The manual way: the env's activate, then torchrun by hand (a site page's two lines).
    manual = [
        "bash",
        "-c",
        'source "$1/bin/activate" && exec python -m torch.distributed.run --standalone --nnodes=1 '
        '--nproc-per-node="$2" "$3"',
        "manual",
        str(prefix),
        str(args.ranks),
        str(PROGRAM),
    ]
    ours, theirs = [], []
    for _ in range(args.runs):
        ours.append(timed([*envbuilder, str(PROGRAM)], env))
        theirs.append(timed(manual, env))
    result = {
        "env": args.env,
        "ranks": args.ranks,
        "runs": args.runs,
        "envbuilder_run_s": [round(w, 3) for w in ours],
        "manual_s": [round(w, 3) for w in theirs],
        "envbuilder_median_s": round(statistics.median(ours), 3),
        "manual_median_s": round(statistics.median(theirs), 3),
        "ratio_median": round(statistics.median(ours) / statistics.median(theirs), 3),
        "overhead_median_s": round(statistics.median(ours) - statistics.median(theirs), 3),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
