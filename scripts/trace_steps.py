#!/usr/bin/env python3
"""Print each envbuilder run of a bench36.json (scripts/bench_node.py) step by step: the time at which each line
of its stderr arrived, so a create's wall time splits into start-up and probe (before its first line), the
install, the guard, the record and the swap (issue 36).

    python scripts/trace_steps.py OUT/bench36.json [--what cold,warm]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

STAMP = re.compile(r"^\[\s*(\d+\.\d+)\] (.*)$")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument(
        "--what", default="", help="only these parts' runs (comma-separated: cold,warm,default,...)"
    )
    args = parser.parse_args(argv)
    wanted = {w for w in args.what.split(",") if w}
    for run in json.loads(args.results.read_text())["runs"]:
        if "trace" not in run or (wanted and run["what"] not in wanted):
            continue
        print(f"== round {run['round'] + 1} {run['way']} {run['what']}: {run['seconds']} s")
        previous = 0.0
        for line in run["trace"].splitlines():
            match = STAMP.match(line)
            if not match:
                continue
            at, text = float(match.group(1)), match.group(2)
            print(f"  {at:7.3f} (+{at - previous:6.3f})  {text[:110]}")
            previous = at
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
