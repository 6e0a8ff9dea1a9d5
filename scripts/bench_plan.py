#!/usr/bin/env python3
"""Benchmark: what reading the wheel indexes adds to `envbuilder plan`.

`envbuilder plan local` (in-process, ``commands.plan.make_plan``, host facts from a file so no probe runs) against
the tests' fixture index (tests/torchindex.py: download.pytorch.org's layout and PyPI on 127.0.0.1, reached through
ENVBUILDER_INDEX_MIRROR), three ways:

  offline   ``--offline``: the shipped table alone, no index read (the plan as it was before index reads)
  warm      the index pages in envbuilder's cache (fresh), so no request is made
  cold      an empty cache: one request per index page, in parallel

Reported: the median of ``--repeat`` runs each, warm - offline in milliseconds (target: at most 50 ms), and for the
cold read the number of page requests and its time. ``--latency S`` makes the fixture server wait S seconds before
every page, as a distant index would: a cold read in parallel then costs about S, not S times the page count.
Usage:

    python scripts/bench_plan.py [--repeat 20] [--latency 0.2] [--facts tests/data/facts/h100.json] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from torchindex import pytorch_like, serve, torch_mirror  # noqa: E402 - the tests' fixture index

from envbuilder.commands.plan import make_plan  # noqa: E402


def timed_plan(env: dict[str, str], facts: str, offline: bool) -> float:
    t0 = time.perf_counter()
    make_plan("local", facts_file=facts, env=env, use_lock=False, no_network=offline)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--latency", type=float, default=0.2, help="seconds the server waits before each page")
    ap.add_argument("--facts", default=str(REPO / "tests" / "data" / "facts" / "h100.json"))
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="envbuilder-bench-plan-"))
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    index = pytorch_like(work / "files", py)
    runs: dict[str, list[float]] = {"offline": [], "warm": [], "cold": []}
    cold_requests: list[int] = []
    with serve(index) as server:
        base = {
            "HOME": str(work / "home"),
            "SCRATCH": str(work / "scratch"),
            "PATH": "/usr/bin:/bin",
            "ENVBUILDER_INDEX_MIRROR": torch_mirror(server),
        }
        warm_env = {**base, "ENVBUILDER_HOME": str(work / "eb-warm")}
        # Imports and the table load happen once, before timing; the second plan fills the warm cache.
        timed_plan(warm_env, args.facts, offline=True)
        timed_plan(warm_env, args.facts, offline=False)
        for i in range(args.repeat):
            runs["offline"].append(timed_plan(warm_env, args.facts, offline=True))
            before = len(server.requested)
            runs["warm"].append(timed_plan(warm_env, args.facts, offline=False))
            if len(server.requested) != before:
                raise SystemExit("the warm plan asked the server: the cache did not answer")
            for root in {r.split()[1].rsplit("/", 2)[0].strip("/") for r in server.requested}:
                server.delay[root] = args.latency
            cold_env = {**base, "ENVBUILDER_HOME": str(work / f"eb-cold-{i}")}
            before = len(server.requested)
            runs["cold"].append(timed_plan(cold_env, args.facts, offline=False))
            cold_requests.append(len(server.requested) - before)
            server.delay.clear()
        pages = sorted({r.split()[1] for r in server.requested})

    med = {k: statistics.median(v) * 1000 for k, v in runs.items()}
    machine = f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}"
    print(f"machine: {machine}")
    print(f"plan local with {Path(args.facts).name}, median of {args.repeat} runs\n")
    print(f"{'way':10s}{'median ms':>12s}{'min ms':>10s}{'max ms':>10s}")
    for name, values in runs.items():
        print(f"{name:10s}{med[name]:12.1f}{min(values) * 1000:10.1f}{max(values) * 1000:10.1f}")
    print()
    print(f"warm - offline: {med['warm'] - med['offline']:+.1f} ms   (target: at most +50 ms)")
    print(
        f"cold read: {statistics.median(cold_requests):.0f} page requests ({', '.join(pages)}), "
        f"{med['cold'] - med['offline']:+.0f} ms over offline with {args.latency * 1000:.0f} ms per page "
        f"(serial would be about {len(pages) * args.latency * 1000:.0f} ms)"
    )
    if args.json:
        data = {"machine": machine, "latency_s": args.latency, "runs": runs, "median_ms": med, "pages": pages}
        data["cold_requests"] = cold_requests
        Path(args.json).write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
