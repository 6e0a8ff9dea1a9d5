#!/usr/bin/env python3
"""Benchmark: envbuilder's start-up, each command in a fresh process (issue 35).

Measured, ``--runs`` times each, the commands interleaved round by round so that the machine's noise falls on all
of them alike:

  python            ``python -c pass``: the interpreter's own floor, for reference
  importtime        ``python -X importtime -c "import envbuilder.cli"``: the cumulative import time of
                    ``envbuilder.cli`` as the interpreter reports it (the issue's target: minimum under 150 ms)
  import            ``python -c "import envbuilder.cli"``: the same process's wall time
  create-imports    ``python -c "import envbuilder.cli, envbuilder.commands.create, envbuilder.build.create"``: what
                    a create imports before it starts (the figure ``envbuilder/core/structs.py`` is kept for)
  restore-imports   ``python -c "import envbuilder.cli, envbuilder.commands.backup, envbuilder.backup.restore"``:
                    what a restore (or a backup) imports before it starts
  help              ``envbuilder --help`` (target: under 200 ms)
  version           ``envbuilder --version``
  completion        ``envbuilder completion bash`` (the script shtab writes from the parser)
  activate-help, modulefile-help, backup-help
                    ``envbuilder activate|modulefile|backup --help``: a verb's help, which reads its choices
  plan              ``envbuilder plan local --json`` with ``ENVBUILDER_OFFLINE=1`` (no index read), the
                    repository's recipes/ on ``ENVBUILDER_RECIPE_PATH``

Every figure is a wall time in milliseconds of a whole process (the console script's start included), except
importtime. The minimum is the figure to compare on a shared machine; the median is printed beside it. ``--json
FILE`` saves the figures; ``--before FILE`` (a file saved so from an older tree) adds the ratio after/before of
the minima. ``--against DIR`` measures an older tree in the same sitting, each of its runs beside the current
tree's, and prints the ratio now/then: DIR holds that tree's ``envbuilder`` package (``git archive REV envbuilder
| tar -x -C DIR``) and goes first on ``PYTHONPATH`` (every command runs from a scratch directory, so the current
directory does not shadow it). Usage:

    python scripts/bench_startup.py [--runs 20] [--json FILE] [--before FILE | --against DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ENVBUILDER = str(BIN / "envbuilder")

#: name -> (argv, extra environment)
COMMANDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "python": ([sys.executable, "-c", "pass"], {}),
    "importtime": ([sys.executable, "-X", "importtime", "-c", "import envbuilder.cli"], {}),
    "import": ([sys.executable, "-c", "import envbuilder.cli"], {}),
    "create-imports": (
        [sys.executable, "-c", "import envbuilder.cli, envbuilder.commands.create, envbuilder.build.create"],
        {},
    ),
    "restore-imports": (
        [
            sys.executable,
            "-c",
            "import envbuilder.cli, envbuilder.commands.backup, envbuilder.backup.restore",
        ],
        {},
    ),
    "help": ([ENVBUILDER, "--help"], {}),
    "version": ([ENVBUILDER, "--version"], {}),
    "completion": ([ENVBUILDER, "completion", "bash"], {}),
    "activate-help": ([ENVBUILDER, "activate", "--help"], {}),
    "modulefile-help": ([ENVBUILDER, "modulefile", "--help"], {}),
    "backup-help": ([ENVBUILDER, "backup", "--help"], {}),
    "plan": (
        [ENVBUILDER, "plan", "local", "--json"],
        {"ENVBUILDER_OFFLINE": "1", "ENVBUILDER_RECIPE_PATH": str(REPO / "recipes")},
    ),
}

_CLI_LINE = re.compile(r"import time:\s+\d+\s+\|\s+(\d+)\s+\|\s+envbuilder\.cli$", re.MULTILINE)


def once(argv: list[str], extra: dict[str, str], cwd: str) -> float:
    """One run's figure in ms: the process's wall time, or for ``-X importtime`` envbuilder.cli's cumulative time."""
    env = {**os.environ, **extra}
    t0 = time.perf_counter()
    done = subprocess.run(
        argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False
    )
    wall = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-500:]}")
    if "importtime" in argv:
        found = _CLI_LINE.search(done.stderr)
        if found is None:
            raise SystemExit("no envbuilder.cli line in the -X importtime output")
        return int(found.group(1)) / 1000
    return wall


def measure(
    runs: int, names: list[str], trees: dict[str, dict[str, str]]
) -> dict[str, dict[str, list[float]]]:
    """Each tree's times per command; ``trees`` maps a tree's label to the environment that selects it."""
    with tempfile.TemporaryDirectory() as cwd:
        for name in names:  # an untimed run each: bytecode written, files in the page cache
            for extra in trees.values():
                argv, env = COMMANDS[name]
                once(argv, {**env, **extra}, cwd)
        times: dict[str, dict[str, list[float]]] = {tree: {name: [] for name in names} for tree in trees}
        for _ in range(runs):
            for name in names:
                for tree, extra in trees.items():
                    argv, env = COMMANDS[name]
                    times[tree][name].append(once(argv, {**env, **extra}, cwd))
    return times


def report(times: dict[str, list[float]], before: Optional[dict[str, dict[str, float]]]) -> None:
    head = f"{'command':<16} {'min ms':>8} {'median ms':>10}"
    print(head + ("  after/before (min)" if before else ""))
    for name, values in times.items():
        line = f"{name:<16} {min(values):8.1f} {statistics.median(values):10.1f}"
        old = (before or {}).get(name)
        if old:
            line += f"  {min(values) / old['min']:.2f} ({old['min']:.1f} before)"
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--only", nargs="*", choices=sorted(COMMANDS), help="measure these commands only")
    parser.add_argument("--json", type=Path, help="save the figures here")
    parser.add_argument("--before", type=Path, help="figures saved with --json from the tree before a change")
    parser.add_argument(
        "--against", type=Path, help="an older tree's package directory, measured beside this one"
    )
    args = parser.parse_args()
    names = args.only or list(COMMANDS)
    before = json.loads(args.before.read_text())["commands"] if args.before else None
    trees: dict[str, dict[str, str]] = {"now": {}}
    if args.against:
        trees["then"] = {"PYTHONPATH": str(args.against.resolve())}
    print(
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f}, {args.runs} runs each",
        flush=True,
    )
    measured = measure(args.runs, names, trees)
    times = measured["now"]
    if args.against:
        before = {n: {"min": min(v)} for n, v in measured["then"].items()}
    report(times, before)
    if args.json:
        figures = {n: {"min": min(v), "median": statistics.median(v), "runs": v} for n, v in times.items()}
        args.json.write_text(json.dumps({"python": platform.python_version(), "commands": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
