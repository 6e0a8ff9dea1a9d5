#!/usr/bin/env python3
"""Benchmark: `import torch` from the env directory against the env's squashfs image mounted with squashfuse.

One torch env (torch CPU + numpy) is built by ``envbuilder create`` in a throw-away work dir, packed with
``envbuilder pack`` (the image beside the env, as by default) and mounted with ``envbuilder activate --image``.
Its ``$SCRATCH`` stands for the shared file system (Lustre, GPFS): every metadata call whose path lies under it
would reach the metadata server.

For each source (the env directory, the mounted image) and each process count (1 and 16 at once):

  metadata calls  ``strace -f -e trace=%file`` (every call that names a path: stat family, open, access,
                  readlink, ...) of the processes, counted per process and split by where the path lies:
                  under $SCRATCH (the shared file system), under the mount (node-local), elsewhere
  wall time       the same processes without strace, started together, until the last one ends (median of
                  ``--repeat`` runs)

Calls on an already open descriptor (fstat, read) name no path; the ones squashfuse itself makes on the image
are reads of one open file, not metadata operations. strace is needed (the script says so where it is missing).

    python scripts/bench_scale.py [--repeat 3] [--procs 1,16] [--json FILE] [--keep] [--workdir DIR]

ENVBUILDER_INDEX_MIRROR is taken from the caller (default: the PyTorch index from /opt/wheels, the rest from PyPI).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MIRROR = "https://download.pytorch.org/whl/=/opt/wheels,pypi"
RECIPE = """\
schema_version = 1
[recipe]
name = "scale"
[env]
kind = "venv"
installer = "uv"
prefix = "${SCRATCH}/envs/{name}"
[python]
command = "python3"
[torch]
version = "2.13.0"
variant = "cpu"
packages = ["torch"]
[[packages]]
name = "numpy"
"""
#: A call's path: the first quoted argument (after AT_FDCWD or a descriptor for the *at calls).
CALL = re.compile(r'^(\d+)\s+(\w+)\((?:AT_FDCWD, |-?\d+, )?"([^"]*)"')


def sh(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(
            f"failed (rc {res.returncode}): {' '.join(argv)}\n{(res.stderr or res.stdout)[-3000:]}"
        )
    return res


def envbuilder(env: dict[str, str], *args: str) -> dict[str, Any]:
    return json.loads(sh([sys.executable, "-m", "envbuilder", *args, "--json"], env).stdout)["data"]


def machine() -> dict[str, Any]:
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine()
    )
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def user_env(work: Path) -> dict[str, str]:
    keep = {
        k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "VIRTUAL_ENV", "ENVBUILDER_"))
    }
    dirs = {
        "SCRATCH": work / "scratch",
        "ENVBUILDER_HOME": work / "home",
        "ENVBUILDER_RECIPE_PATH": work / "recipes",
        "UV_CACHE_DIR": work / "uv-cache",
        "TMPDIR": work / "node",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return {
        **keep,
        **{k: str(v) for k, v in dirs.items()},
        "NO_COLOR": "1",
        "ENVBUILDER_INDEX_MIRROR": os.environ.get("ENVBUILDER_INDEX_MIRROR") or DEFAULT_MIRROR,
    }


def importers(python: Path, n: int) -> list[subprocess.Popen[bytes]]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", "")}
    return [subprocess.Popen([str(python), "-c", "import torch"], env=env) for _ in range(n)]


def wall(python: Path, n: int) -> float:
    t0 = time.perf_counter()
    procs = importers(python, n)
    if any(p.wait() for p in procs):
        raise SystemExit(f"import torch failed with {python}")
    return time.perf_counter() - t0


def traced(python: Path, n: int, shared: Path, local: Path, log: Path) -> dict[str, float]:
    """strace -f of ``n`` importers started together (one strace per process); metadata calls per process."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", "")}
    argv = ["strace", "-f", "-qq", "-e", "trace=%file", "-e", "signal=none"]
    procs = [
        subprocess.Popen([*argv, "-o", f"{log}.{i}", str(python), "-c", "import torch"], env=env)
        for i in range(n)
    ]
    if any(p.wait() for p in procs):
        raise SystemExit(f"import torch under strace failed with {python}")
    where: Counter[str] = Counter()
    for i in range(n):
        for line in Path(f"{log}.{i}").read_text(errors="replace").splitlines():
            if "resumed>" in line:
                continue  # the second half of a call already counted
            m = CALL.match(line)
            if not m:
                where["no path"] += 1
                continue
            path = m.group(3)
            where[
                "shared"
                if path.startswith(str(shared))
                else "local"
                if path.startswith(str(local))
                else "other"
            ] += 1
    return {k: round(v / n, 1) for k, v in where.items()} | {"total": round(sum(where.values()) / n, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--procs", default="1,16")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--workdir", metavar="DIR")
    args = ap.parse_args()
    if not shutil.which("strace"):
        raise SystemExit(
            "strace is not installed: the metadata calls cannot be counted (apt-get install strace)"
        )
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-scale-"))
    env = user_env(work)
    (work / "recipes" / "scale.toml").write_text(RECIPE)
    t0 = time.perf_counter()
    envbuilder(env, "create", "scale", "--no-validate")
    created = time.perf_counter() - t0
    t0 = time.perf_counter()
    packed = envbuilder(env, "pack", "scale")
    pack_s = time.perf_counter() - t0
    mounted = envbuilder(env, "activate", "scale", "--image")["image"]
    prefix = Path(env["SCRATCH"]) / "envs" / "scale"
    mount = Path(mounted["path"])
    results: dict[str, Any] = {
        "machine": machine(),
        "create_s": round(created, 1),
        "pack_s": round(pack_s, 1),
        "image_bytes": packed["bytes"],
        "how": mounted["how"],
        "runs": [],
    }
    try:
        for n in (int(x) for x in args.procs.split(",")):
            for source, root in (("directory", prefix), ("image", mount)):
                python = root / "bin" / "python"
                wall(python, 1)  # warm the page cache (and squashfuse's) for both alike
                times = [wall(python, n) for _ in range(args.repeat)]
                calls = traced(python, n, Path(env["SCRATCH"]), mount, work / f"strace-{source}-{n}")
                row = {
                    "source": source,
                    "procs": n,
                    "wall_s": round(statistics.median(times), 2),
                    "calls": calls,
                }
                results["runs"].append(row)
                print(json.dumps(row), flush=True)
    finally:
        subprocess.run(["fusermount3", "-u", str(mount)], check=False)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
