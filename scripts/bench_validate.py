#!/usr/bin/env python3
"""Benchmark the bundled validation against the manual way, in one run, on one env.

For a recorded env (``envbuilder create`` made it): the whole suite through ``envbuilder validate`` (its wall
time, and the busbw its bandwidth sweep reports at its largest message), and a bare torch.distributed
all_reduce loop (scripts/raw_allreduce.py) launched with torchrun on the same ranks and message size. Reports
the ratio of the two busbw figures (target >= 0.95), the suite's wall time (target <= 10 s, on 2 GPUs or 2 gloo
CPU ranks) and its ratio to the bare loop's wall time (torchrun's start, one `import torch` per rank, the loop),
and both wall times split into parts (``suite_parts_s``, ``raw_parts_s``: start-up, each check, the end; the
median of the runs) from the times the ranks record.
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
from typing import Any, Optional

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
    suite_walls, suite_busbw, reports, suite_parts = [], [], [], []
    for _ in range(args.runs):
        begun, t0 = time.time(), time.perf_counter()
        res = envbuilder("validate", args.env, "--json", *(["--cpu"] if args.cpu else []), *args.extra)
        wall = time.perf_counter() - t0
        data = json.loads(res.stdout)["data"]
        if res.returncode != 0:
            sys.exit(f"validate failed (rc {res.returncode}): {res.stderr[-2000:]}")
        reports.append(data)
        suite_walls.append(wall)
        suite_parts.append(suite_breakdown(_last_run(prefix, begun), begun, begun + wall))
        busbw = data["checks"]["nccl"]["figures"]["busbw"]
        suite_busbw.append(busbw["value"])
    world, device = reports[0]["world"], reports[0]["device"]
    nbytes = reports[0]["checks"]["nccl"]["figures"]["busbw"]["bytes"]

    raw_busbw, raw_walls, raw_parts, ddp_walls, ddp_parts = [], [], [], [], []
    for _ in range(args.runs):
        wall, busbw = bare_loop(python, world, nbytes, device, parts=raw_parts)
        raw_walls.append(wall)
        raw_busbw.append(busbw)
        ddp_walls.append(bare_loop(python, world, nbytes, device, parts=ddp_parts, ddp=True)[0])

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
        # The bare program that also trains as the DDP check does: the suite's work, like for like.
        "raw_ddp_wall_s": [round(x, 2) for x in ddp_walls],
        "suite_over_raw_ddp_wall_median": round(
            statistics.median(suite_walls) / statistics.median(ddp_walls), 2
        ),
        # One rank moves nothing between ranks (busbw 0): no ratio then.
        "busbw_ratio_median": round(statistics.median(suite_busbw) / statistics.median(raw_busbw), 3)
        if statistics.median(raw_busbw)
        else None,
        "per_check_s": _per_check(reports[-1]),
        # Where the wall time goes, part by part (median of the runs; see suite_breakdown, raw_breakdown).
        "suite_parts_s": _median_parts(suite_parts),
        "raw_parts_s": _median_parts(raw_parts),
        "raw_ddp_parts_s": _median_parts(ddp_parts),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def bare_loop(
    python: str,
    world: int,
    nbytes: int,
    device: str,
    *,
    parts: Optional[list[dict[str, Any]]] = None,
    ddp: bool = False,
) -> tuple[float, float]:
    """The bare program (raw_allreduce.py under torchrun, ``world`` ranks of ``python``; ``ddp``: then the DDP
    check's training too): its wall time and the busbw it prints (and, into ``parts``, where that time went). Also
    scripts/bench_create.py's bare probe."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    argv = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
            str(HERE / "raw_allreduce.py"), "--bytes", str(nbytes), "--device", device]  # fmt: skip
    argv += ["--ddp"] if ddp else []
    begun, t0 = time.time(), time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if not line:
        sys.exit(f"raw loop failed (rc {res.returncode}): {res.stderr[-2000:]}")
    data = json.loads(line[-1])
    if parts is not None:
        parts.append(raw_breakdown(data, begun, begun + wall))
    return wall, float(data["busbw"])


def bytecode(prefix: Path) -> dict[str, bool]:
    """Whether the env holds compiled modules of torch, and of what DDP's constructor imports."""
    site = "lib/python*/site-packages"
    return {
        pkg.replace("/", "."): any(prefix.glob(f"{site}/{pkg}/__pycache__/__init__.*.pyc"))
        for pkg in ("torch", "torch/_dynamo")
    }


def _last_run(prefix: Path, begun: float) -> Optional[Path]:
    """The run directory this run made among the env's validations (its rank files say when each part happened);
    None where it made none there (``--image`` keeps its runs beside the image)."""
    runs = sorted((prefix / "envbuilder" / "validation").glob("run-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs and runs[-1].stat().st_mtime >= begun - 1 else None


def suite_breakdown(run: Optional[Path], begun: float, ended: float) -> dict[str, float | None]:
    """The suite's wall time in parts, from the ranks' event files (epoch times; the slowest rank each time):
    envbuilder's own start-up until the launcher starts, the launcher's until the ranks start (torchrun's agent
    imports torch and rendezvouses), each rank's python until its first event, each check, the payload's steps
    between checks, and the end: from the last rank's last event until envbuilder has exited (the ranks' and the
    launcher's exit, the report merged and written)."""
    if run is None:
        return {}
    ranks = []
    for path in (run / "ranks").glob("rank-*.jsonl"):
        ranks.append([json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line])
    hellos = [ev for evs in ranks for ev in evs if ev["event"] == "hello"]
    ends = [ev["t"] for evs in ranks for ev in evs if ev["event"] == "end"]
    if not hellos or not ends:
        return {}
    rank_start = min(ev.get("started") or ev["t"] for ev in hellos)
    agents = [ev["agent_started"] for ev in hellos if ev.get("agent_started")]
    launched = min(agents) if agents else rank_start
    checks: dict[str, float] = {}
    between = 0.0  # the payload's own steps: a rank's time from its hello to its end not spent in a check
    for evs in ranks:
        spent = 0.0
        for ev in evs:
            if ev["event"] == "result":
                checks[ev["check"]] = max(checks.get(ev["check"], 0.0), float(ev.get("seconds") or 0.0))
                spent += float(ev.get("seconds") or 0.0)
        times = [ev["t"] for ev in evs if ev["event"] in ("hello", "end")]
        between = max(between, max(times) - min(times) - spent)
    parts: dict[str, float | None] = {
        "envbuilder_start": launched - begun,
        "launcher_start": rank_start - launched if agents else None,
        "rank_start": max(ev["t"] for ev in hellos) - rank_start,
        **{f"check.{name}": secs for name, secs in checks.items() if secs >= 0.001},
        "between_checks": between,
        "end": ended - max(ends),
    }
    return parts


def raw_breakdown(line: dict, begun: float, ended: float) -> dict[str, float | None]:
    """The bare program's wall time in the same parts, from rank 0's times (raw_allreduce.py)."""
    if not line.get("started"):
        return {}
    launched = line.get("agent_started") or line["started"]
    return {
        "envbuilder_start": launched - begun,  # here: the start of torchrun's process
        "launcher_start": line["started"] - launched,
        "import_torch": line["imported"] - line["started"],  # python's own start included
        "work": line.get("looped", line["done"]) - line["imported"],
        **({"ddp": line["done"] - line["looped"]} if "looped" in line else {}),
        "end": ended - line["done"],
    }


def _median_parts(runs: list[dict[str, float | None]]) -> dict[str, float | None]:
    names = [name for run in runs for name in run]
    out: dict[str, float | None] = {}
    for name in dict.fromkeys(names):
        values = [run[name] for run in runs if run.get(name) is not None]
        out[name] = round(statistics.median(values), 3) if values else None  # type: ignore[type-var]
    return out


def _per_check(data: dict) -> dict:
    """Seconds per check in the last run (the slowest rank)."""
    return {
        name: max((r.get("seconds") or 0.0 for r in check["per_rank"].values()), default=None)
        for name, check in data["checks"].items()
    }


if __name__ == "__main__":
    sys.exit(main())
