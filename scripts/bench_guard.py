#!/usr/bin/env python3
"""What the torch build guard costs on an env that holds torch, part by part (issue 36), no network needed:

  files            reading the build from the env's files (dist-info version, torch/version.py): every guard
  wheel digest     the arch cache's key: the sha256 of the wheel's rows of the installed RECORD
  cache hit        the whole arch-list step when this wheel's list is remembered (digest + reading the entry)
  cache miss       the whole arch-list step when it is not: the env's python imports torch
                   (``torch._C._cuda_getArchFlags()``), then the entry is written; what every guard of a GPU
                   target paid before the cache

Each part runs ``--repeat`` times (the miss with the entry removed first); medians in seconds. Usage:

    python scripts/bench_guard.py ENV_PREFIX [--python PY] [--repeat 5] [--json FILE]

``ENV_PREFIX``: a venv (or any prefix) whose ``lib/python*/site-packages`` holds torch; ``--python`` when its own
``bin/python`` is not the one that imports it. The cache lives in a throwaway home.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from envbuilder.backends import torcharch, torchbuild  # noqa: E402 - this checkout's
from envbuilder.system import proc  # noqa: E402


def timed(fn: Callable[[], object], repeat: int, before: Callable[[], None] = lambda: None) -> list[float]:
    out = []
    for _ in range(repeat):
        before()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", type=Path)
    ap.add_argument("--python")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    prefix = args.prefix.resolve()
    python = args.python or str(prefix / "bin" / "python")
    env = proc.scrubbed_env()
    build = torchbuild.read_build(prefix, python, env=env)
    if build is None:
        raise SystemExit(f"no torch in {prefix}")
    digest = torcharch.wheel_digest(Path(build.where))
    with tempfile.TemporaryDirectory(prefix="envbuilder-bench-guard-") as home:
        cache = torcharch.ArchCache(Path(home))

        def arch() -> object:
            return torchbuild.read_arch_flags(build, python, env, lambda _: None, cache)

        def forget() -> None:
            if digest is not None:
                cache.path(digest).unlink(missing_ok=True)

        runs = {
            "files": timed(lambda: torchbuild.read_build(prefix, python, env=env), args.repeat),
            "wheel digest": timed(lambda: torcharch.wheel_digest(Path(build.where)), args.repeat),
            "cache miss (imports torch)": timed(arch, args.repeat, before=forget),
        }
        arch()  # the entry is there now
        runs["cache hit"] = timed(arch, args.repeat)
        flags = arch()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"
    print(f"machine: {machine}\nenv: {prefix} ({build.describe()})")
    print(f"wheel digest: {digest or 'none (RECORD not trusted: read every time)'}; arch list: {flags}")
    print(f"median of {args.repeat}, seconds")
    for label, times in runs.items():
        print(f"  {label:30s}{statistics.median(times):9.4f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine, "env": str(prefix), "runs": runs}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
