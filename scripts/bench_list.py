#!/usr/bin/env python3
"""Benchmark: what `envbuilder list`, `show` and `doctor` cost per recorded env.

One env is built for real (`envbuilder create --no-validate`, a venv of the wheels in ``--wheels`` served on
127.0.0.1, on a scratch file system with a purge policy, so the purge and backup columns are computed), then
cloned to N envs: each clone's files are hard links of the first's (the same files to stat and read, no space)
and its record the first's with its own name and prefix. The first env is backed up (wheelhouse) and each env
given ``--backups`` copies of that backup, a day apart, as a user's nightly backups would be. For each N in ``--counts`` the commands run as a user
runs them (a child ``python -m envbuilder``), ``--repeat`` times; the median is reported with the cost per env
(the slope between the smallest and largest N). No network: the wheels come from a local directory.

    python scripts/bench_list.py [--wheels DIR] [--packages "sympy networkx"] [--counts 10,50] [--backups 5]
                                 [--repeat 5] [--json FILE]

On a GPU node: ``--wheels`` the directory of the node's repacked wheels, ``--packages "torch"``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from wheelindex import mirror_env, serve  # noqa: E402 - the tests' index server, found through sys.path

from envbuilder.system import state  # noqa: E402

DEFAULT_WHEELS = Path(os.environ.get("ENVBUILDER_TEST_CACHE", "/var/cache/envbuilder-tests")) / "pypi-wheels"

RECIPE = """schema_version = 1
[recipe]
name = "bench"
[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "{python}"
[torch]
install = false
{packages}
[filesystems.scratch]
path = "${{SCRATCH}}"
purge_days = 30
touch_allowed = false
"""


def world(work: Path, mirror: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(work / "home"),
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "SCRATCH": str(work / "scratch"),
        "ENVBUILDER_HOME": str(work / "eb-home"),
        "ENVBUILDER_RECIPE_PATH": str(work / "recipes"),
        "ENVBUILDER_INDEX_MIRROR": mirror,
        "ENVBUILDER_BACKUP_ROOT": str(work / "backups"),
        "UV_CACHE_DIR": str(work / "uv-cache"),
        "PYTHONPATH": str(REPO),
    }


def cli(env: dict[str, str], *args: str, ok_codes: tuple[int, ...] = (0,)) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "envbuilder", *args], env=env, capture_output=True, text=True, check=False
    )
    took = time.perf_counter() - t0
    if res.returncode not in ok_codes:
        raise SystemExit(f"envbuilder {' '.join(args)} exited {res.returncode}:\n{res.stderr[-3000:]}")
    return took


def build_template(work: Path, env: dict[str, str], packages: list[str]) -> state.EnvRecord:
    (work / "recipes").mkdir(parents=True)
    entries = "".join(f'[[packages]]\nname = "{p}"\nspec = "{p}"\n' for p in packages)
    recipe = RECIPE.format(python=sys.executable, packages=entries)
    (work / "recipes" / "bench.toml").write_text(recipe, encoding="utf-8")
    cli(env, "create", "bench", "--no-validate")
    return state.load(Path(env["ENVBUILDER_HOME"]), "bench")


def clone(template: state.EnvRecord, home: Path, name: str, backup: Path, backups: int) -> None:
    """``name``: the template's files as hard links at a prefix of its own, its record, and ``backups`` copies
    of the template's ``backup`` (its backup.json names no env: the directory does)."""
    prefix = Path(template.prefix).with_name(name)
    shutil.copytree(template.prefix, prefix, symlinks=True, copy_function=os.link)
    data = template.to_json()
    data["name"], data["prefix"] = name, str(prefix)
    state.save(home, state.EnvRecord.from_json(data))
    copies(backup, backup.parent.parent / name, backups)


def copies(backup: Path, env_dir: Path, count: int) -> None:
    """``count`` copies of ``backup`` in ``env_dir``, stamped a day apart before it."""
    stamp = time.mktime(time.strptime(backup.name, "%Y%m%dT%H%M%SZ"))
    for day in range(1, count + 1):
        target = env_dir / time.strftime("%Y%m%dT%H%M%SZ", time.localtime(stamp - day * 86400))
        if not target.exists():
            shutil.copytree(backup, target)


def check_world(env: dict[str, str], n: int) -> None:
    """What is timed is what a user's list shows: n healthy envs, each with its backup and its purge estimate."""
    res = subprocess.run(
        [sys.executable, "-m", "envbuilder", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(res.stdout)["data"]
    bad = [r["name"] for r in rows if r["health"]["status"] != "ok" or not r["backup"] or not r["purge"]]
    if len(rows) != n or bad:
        raise SystemExit(
            f"the bench's world is not what it should be: {len(rows)} envs, not as expected: {bad}"
        )


def files_in(prefix: str) -> int:
    return sum(len(files) for _dirs, _sub, files in os.walk(prefix))


def median_time(env: dict[str, str], args: list[str], repeat: int, ok_codes: tuple[int, ...]) -> float:
    return statistics.median(cli(env, *args, ok_codes=ok_codes) for _ in range(repeat))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS, help="a directory of wheels (no network)")
    ap.add_argument("--packages", default="sympy networkx", help="what each env holds (space-separated)")
    ap.add_argument("--counts", default="10,50", help="the numbers of envs to time, comma-separated")
    ap.add_argument("--backups", type=int, default=5, help="backups of each env (at least 1)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    counts = sorted(int(n) for n in args.counts.split(","))
    args.backups = max(1, args.backups)
    if not args.wheels.is_dir():
        raise SystemExit(f"{args.wheels} is not a directory of wheels (pass --wheels DIR)")

    work = Path(tempfile.mkdtemp(prefix="envbuilder-bench-list-"))
    results: dict[str, dict[int, float]] = {"list": {}, "show": {}, "doctor": {}}
    try:
        with serve(args.wheels) as index:
            env = world(work, mirror_env(index))
            template = build_template(work, env, args.packages.split())
            cli(env, "backup", "bench", "--mode", "wheelhouse")
        [backup] = (work / "backups" / "envs" / "bench").iterdir()
        copies(backup, backup.parent, args.backups - 1)
        env["ENVBUILDER_OFFLINE"] = "1"  # the doctor reads no index while timed
        home = Path(env["ENVBUILDER_HOME"])
        made = 1
        for n in counts:
            for i in range(made, n):
                clone(template, home, f"bench{i:03d}", backup, args.backups)
            made = max(made, n)
            check_world(env, n)
            results["list"][n] = median_time(env, ["list"], args.repeat, (0,))
            results["show"][n] = median_time(env, ["show", "bench"], args.repeat, (0,))
            # 14: a finding needs action (the purge's backup advice on a scratch env); the doctor still ran.
            results["doctor"][n] = median_time(env, ["doctor"], args.repeat, (0, 14))
        report(results, counts, files_in(template.prefix), args.backups)
        if args.json:
            Path(args.json).write_text(json.dumps({"files_per_env": files_in(template.prefix), **results}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(results: dict[str, dict[int, float]], counts: list[int], files: int, backups: int) -> None:
    print(f"each env: {files} files, {backups} backups; medians of child `python -m envbuilder` runs")
    print(f"{'command':<8}" + "".join(f"{f'{n} envs':>12}" for n in counts) + f"{'per env':>12}")
    lo, hi = counts[0], counts[-1]
    for command, times in results.items():
        slope = (times[hi] - times[lo]) / (hi - lo) if hi > lo else float("nan")
        cells = "".join(f"{times[n]:>11.3f}s" for n in counts)
        print(f"{command:<8}{cells}{slope * 1000:>10.1f}ms")


if __name__ == "__main__":
    sys.exit(main())
