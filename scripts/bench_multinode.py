#!/usr/bin/env python3
"""Benchmark: validation across simulated nodes, on the tests' multi-node Slurm bed (tests/slurm.py's
MultiNodeCluster: nodes n1..nN, each slurmd a host of its own in UTS and mount namespaces of this machine).

Two measurements, each ``--repeat`` times (medians), every run from inside ``salloc`` through srun (one torchrun
agent per node; across nodes the agents meet at a c10d rendezvous on n1, one node's agent is ``--standalone``):

  same bed   the suite on two nodes (``--nodes 2``, 2 ranks per node) against the suite on one (``--nodes 1``)
             with the same ranks per node (2) and with the same world (4 ranks)
  growth     N = 1, 2, ... simulated nodes (``--max-nodes``), 1 rank per node: the suite's wall time, and the
             time from the start until every rank is up (salloc, srun, the agents' rendezvous, the workers'
             start), each as a ratio to N = 1

Usage (root; ENV is a recorded env with torch, CPU is enough, found through the usual ENVBUILDER_* variables):

    python scripts/bench_multinode.py ENV [--repeat 1] [--max-nodes 4] [--checks import,nccl,ddp] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from slurm import MultiNodeCluster, multinode_available  # noqa: E402 - the tests' bed, found through sys.path

#: Generous: every run imports torch once per rank on cores the ranks share.
RUN_TIMEOUT_S = 900


def validate(
    cluster: MultiNodeCluster, *, env_name: str, prefix: Path, nodes: int, per_node: int, checks: str
) -> dict[str, float]:
    """One ``envbuilder validate ENV --nodes N --cpu`` inside ``salloc --nodes=N``: its wall time, the report's
    own seconds, the seconds from the start until the last rank said hello, and each check's seconds."""
    argv = [
        "salloc",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        sys.executable,
        "-m",
        "envbuilder",
        "validate",
        env_name,
        "--nodes",
        str(nodes),
        "--nproc-per-node",
        str(per_node),
        "--launcher",
        "srun",  # --nodes 1 too, so both sizes run on the bed's nodes, not on this machine
        "--cpu",
        "--json",
        "--checks",
        checks,
    ]
    t0 = time.time()
    res = subprocess.run(
        argv, env=cluster.environ(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    wall = time.time() - t0
    if res.returncode != 0:
        raise SystemExit(f"validate --nodes {nodes} failed (rc {res.returncode}):\n{res.stderr[-3000:]}")
    data = json.loads(res.stdout)["data"]
    if sorted(set(data["hosts"].values())) != [f"n{i}" for i in range(1, nodes + 1)]:
        raise SystemExit(f"the ranks did not run on n1..n{nodes}: {data['hosts']}")
    hellos = _hellos(prefix, data["started"])
    figures = {"wall_s": wall, "suite_s": float(data["seconds"]), "up_s": max(hellos) - t0}
    for name, check in data["checks"].items():  # each check's time on its slowest rank
        figures[f"{name}_s"] = max(float(r.get("seconds") or 0.0) for r in check["per_rank"].values())
    return figures


def _hellos(prefix: Path, started: str) -> list[float]:
    """The time of each rank's first event (its hello) in the run whose report started at ``started``."""
    for run in (prefix / "envbuilder" / "validation").glob("run-*"):
        report = run / "report.json"
        if report.exists() and json.loads(report.read_text())["started"] == started:
            return [
                float(json.loads(path.read_text().splitlines()[0])["t"])
                for path in (run / "ranks").glob("rank-*.jsonl")
            ]
    raise SystemExit(f"no run directory holds the report of {started}")


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("env")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--max-nodes", type=int, default=4)
    ap.add_argument("--checks", default="import,nccl,ddp")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    reason = multinode_available()
    if reason is not None:
        raise SystemExit(f"no multi-node bed here: {reason}")
    shown = subprocess.run(
        [sys.executable, "-m", "envbuilder", "show", args.env, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        raise SystemExit(f"envbuilder show {args.env}: {shown.stderr.strip()}")
    prefix = Path(json.loads(shown.stdout)["data"]["prefix"])

    results: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "env": args.env,
        "checks": args.checks,
        "repeat": args.repeat,
        # Other work on the machine shows here: a busy machine's figures are not an idle one's.
        "load_avg_1min_start": round(os.getloadavg()[0], 2),
    }
    with tempfile.TemporaryDirectory(prefix="eb-bench-") as tmp:
        cluster = MultiNodeCluster(Path(tmp), nodes=args.max_nodes)
        with cluster:
            results["bed_start_s"] = round(cluster.start_seconds or 0.0, 2)

            def measure(nodes: int, per_node: int) -> dict[str, float]:
                runs = [
                    validate(
                        cluster,
                        env_name=args.env,
                        prefix=prefix,
                        nodes=nodes,
                        per_node=per_node,
                        checks=args.checks,
                    )
                    for _ in range(args.repeat)
                ]
                print(f"nodes={nodes} ranks/node={per_node}: {medians(runs)}", file=sys.stderr, flush=True)
                return medians(runs)

            # Two nodes of 2 ranks against one node of 2 (the same ranks per node) and of 4 (the same world).
            one, one_world, two = measure(1, 2), measure(1, 4), measure(2, 2)
            results["same_bed"] = {
                "one_node": one,
                "one_node_4_ranks": one_world,
                "two_nodes": two,
                "wall_ratio": ratio(two["wall_s"], one["wall_s"]),
                "suite_ratio": ratio(two["suite_s"], one["suite_s"]),
                "same_world_wall_ratio": ratio(two["wall_s"], one_world["wall_s"]),
            }
            growth = {n: measure(n, 1) for n in range(1, args.max_nodes + 1)}
            results["growth"] = {
                str(n): {
                    **m,
                    "wall_ratio": ratio(m["wall_s"], growth[1]["wall_s"]),
                    "up_ratio": ratio(m["up_s"], growth[1]["up_s"]),
                }
                for n, m in growth.items()
            }
    results["load_avg_1min_end"] = round(os.getloadavg()[0], 2)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
