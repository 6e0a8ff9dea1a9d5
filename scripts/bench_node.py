"""The node mode of scripts/bench_create.py (``--wheels DIR``): envbuilder against raw uv on one machine, from a local
wheel directory, with no network (issue 36).

The wheels: on a GPU node, the node's CUDA torch and what it needs, repacked by scripts/repack_wheels.py (see
scripts/gpu_bench36.sh); with ``--cpu``, the CPU torch file pip finds here (find-links), fetched into DIR when it
holds no torch file. One recipe (``bench36``: a uv venv with that torch, the index mirrored to DIR) and the raw way
(``uv venv`` + ``uv pip install --no-index --find-links DIR torch==V``) on the same python. Parts (``--parts``):

  create   raw uv and ``create --no-validate``: cold (fresh uv cache and envbuilder home), then warm (same ones)
  default  the default create (validation on every GPU; gloo ranks with --cpu), cold, then ``--force`` of that env
           (warm); against raw uv cold + the bare probe (scripts/raw_allreduce.py under torchrun, the suite's
           world and largest message)
  restore  ``backup`` (wheelhouse) of a cold-created env, then ``restore`` to a new prefix (warm cache); against raw
           uv warm
  validate (not by default) scripts/bench_validate.py on an env a validated create made (its bytecode written):
           the suite against the bare program, wall time and busbw

Raw uv is also timed warm with its cache on another file system than the env (uv's default cache under $HOME, the
env in $SCRATCH, as on a cluster: uv copies instead of linking), where /dev/shm is one (``home_cache``).

Every round runs raw uv and each ``--tree NAME=PATH`` (``python -m envbuilder`` with PYTHONPATH=PATH) in turn, so
before/after are measured in one run on one machine. Medians, ratios and differences go to a markdown table
(stdout and OUT/bench36.md) and JSON (OUT/bench36.json, rewritten after every run, so a run cut short keeps what
it measured): scripts/bench_node_report.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_node_report import PROBE_BYTES, save, table  # noqa: E402 - a sibling script
from bench_validate import bare_loop  # noqa: E402 - a sibling script

RECIPE = "bench36"
#: What a run's environment must not inherit: the caller's installer and envbuilder settings.
SCRUB = ("PIP_", "UV_", "VIRTUAL_ENV", "ENVBUILDER_", "PYTHONPATH", "CONDA_")


@dataclass
class Bench:
    wheels: Path
    work: Path
    out: Path
    trees: dict[str, Path]
    python: str
    uv: str
    cpu: bool
    nproc: int
    torch: str = ""
    variant: str = ""
    runs: list[dict[str, Any]] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)
    #: The python envbuilder runs with: a venv of its own, as pipx gives users (bench_create.own_venv).
    envpython: str = sys.executable

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"


def run(args: Any, uv: str) -> int:
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}; expected some of {', '.join(PARTS)}")
    out = Path(args.out or ".").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench36-")).resolve()  # not under OUT: envs come back
    clear_work(work)
    bench = Bench(
        wheels=Path(args.wheels).resolve(),
        work=work,
        out=out,
        trees=parse_trees(args.tree),
        python=real_python(args.python),
        uv=uv,
        cpu=args.cpu,
        nproc=args.nproc,
    )
    if args.cpu and not list(bench.wheels.glob("torch-*.whl")):
        fetch_cpu_wheels(bench.wheels)
    # Not this interpreter: a node image's python may hold many packages whose .pth files it reads at every start
    # (0.06 s on the H200 node), which an envbuilder installed with pipx never reads and raw uv never pays.
    from bench_create import own_venv  # noqa: PLC0415 - a sibling script (it imports this one the same way)

    bench.envpython = own_venv(work / "envbuilder-python")
    check_trees(bench)
    bench.torch, bench.variant = torch_of(bench.wheels, args.variant)
    write_recipe(bench)
    for i in range(args.repeat):
        order = list(bench.trees) if i % 2 == 0 else list(reversed(bench.trees))
        for part in args.parts.split(","):
            PARTS[part](bench, i, order)
    print(table(bench))
    shutil.rmtree(work, ignore_errors=True)
    return 0


def clear_work(work: Path) -> None:
    """An empty work directory: one this script made before (its marker inside: a run cut short) is emptied, any
    other that holds files is refused."""
    marker = work / ".bench36-work"
    if work.is_dir() and any(work.iterdir()) and not marker.is_file():
        raise SystemExit(
            f"--work {work}: not empty and not made by this script; give a new or empty directory"
        )
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    marker.touch()


def parse_trees(given: Optional[list[str]]) -> dict[str, Path]:
    trees: dict[str, Path] = {}
    for item in given or [f"this={HERE.parent}"]:
        name, sep, path = item.partition("=")
        tree = Path(path).resolve()
        if not sep or not name or not (tree / "envbuilder" / "__init__.py").is_file():
            raise SystemExit(f"--tree {item!r}: expected NAME=PATH, PATH a source tree holding envbuilder/")
        trees[name] = tree
    return trees


def check_trees(bench: Bench) -> None:
    """Each tree's ``python -m envbuilder`` must import that tree's package, not an installed one. Its bytecode is
    written first (untimed), so no tree's first run pays for compiling it."""
    for name, tree in bench.trees.items():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "envbuilder")], check=False)
        code = "import envbuilder; print(envbuilder.__file__)"
        res = subprocess.run(
            [bench.envpython, "-c", code],
            check=False,
            capture_output=True,
            text=True,
            cwd=bench.work,
            env={**base_env(bench, bench.work), "PYTHONPATH": str(tree)},
        )
        if res.returncode != 0 or not Path(res.stdout.strip()).is_relative_to(tree):
            raise SystemExit(
                f"--tree {name}: {bench.envpython} imports {res.stdout.strip() or res.stderr[-500:]}"
            )


def real_python(command: str) -> str:
    """The interpreter behind ``command`` (a pyenv shim, a venv's link): raw uv and the recipe get the same one."""
    res = subprocess.run(
        [command, "-c", "import sys; print(sys.executable)"], check=False, capture_output=True, text=True
    )
    if res.returncode != 0:
        raise SystemExit(f"--python {command}: {res.stderr.strip()}")
    return res.stdout.strip()


def fetch_cpu_wheels(dest: Path) -> None:
    """The CPU torch file pip finds on this machine (find-links; the tests' cache) and what it needs."""
    argv = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest), "torch==2.13.0"]
    res = subprocess.run(argv, check=False, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"no CPU torch wheel here: {res.stderr[-1500:]}")


def torch_of(wheels: Path, variant: Optional[str]) -> tuple[str, str]:
    """torch's release and variant from the one torch file in ``wheels`` (2.11.0+cu130: 2.11.0, cu130)."""
    files = sorted(wheels.glob("torch-*.whl"))
    if len(files) != 1:
        raise SystemExit(f"{wheels}: expected one torch-*.whl, found {[f.name for f in files]}")
    version = files[0].name.split("-")[1]
    release, _, label = version.partition("+")
    if not (variant or re.fullmatch(r"cpu|cu\d+|rocm[\d.]+", label)):
        raise SystemExit(f"{files[0].name}: no variant in its version; give --variant (cu130, cpu, ...)")
    return release, variant or label


def write_recipe(bench: Bench) -> None:
    recipes = bench.work / "recipes"
    recipes.mkdir()
    (recipes / f"{RECIPE}.toml").write_text(
        f"""schema_version = 1
[recipe]
name = "{RECIPE}"
description = "uv venv with torch from a local wheel directory, for scripts/bench_create.py --wheels"
[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "{bench.python}"
[torch]
version = "{bench.torch}"
variant = "{bench.variant}"
packages = ["torch"]
[activate]
env = {{ NCCL_NVLS_ENABLE = "0", TORCH_SYMM_MEM_DISABLE_MULTICAST = "1", NVSHMEM_DISABLE_NVLS = "1" }}
"""
    )


# -- the ways ----------------------------------------------------------------------------------------------------


def base_env(bench: Bench, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUB)}
    return {
        **env,
        "UV_CACHE_DIR": str(cache),
        "NO_COLOR": "1",
        "COLUMNS": "160",
    }


def uv_install(bench: Bench, prefix: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = base_env(bench, cache)
    made = subprocess.run(
        [bench.uv, "venv", "-q", "--python", bench.python, str(prefix)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    if made.returncode != 0:
        return made
    argv = [
        bench.uv,
        "pip",
        "install",
        "-q",
        "--python",
        str(prefix / "bin" / "python"),
        "--no-index",
        "--find-links",
        str(bench.wheels),
        f"torch=={bench.torch}",
    ]
    return subprocess.run(argv, check=False, capture_output=True, text=True, env=env)


def home_cache(bench: Bench) -> Optional[Path]:
    """Where raw uv keeps its cache as users run it on a cluster: uv's default, under $HOME, while the env goes to
    $SCRATCH, another file system, so uv copies every file out of its cache instead of linking it (its own
    warning says so). ``BENCH_HOME_CACHE`` (default: a new directory in /dev/shm, a tmpfs standing in for $HOME);
    None (no such rows) where that directory shares the work directory's file system."""
    given = os.environ.get("BENCH_HOME_CACHE")
    try:
        cache = Path(given) if given else Path(tempfile.mkdtemp(prefix="bench36-home-uv-", dir="/dev/shm"))
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if cache.stat().st_dev != bench.work.stat().st_dev:
        return cache
    shutil.rmtree(cache, ignore_errors=True)
    return None


def uv_from_home(bench: Bench, i: int, d: Path, what: str) -> None:
    """Raw uv warm with its cache in $HOME (``home_cache``): filled by an untimed install first, then timed."""
    cache = home_cache(bench)
    if cache is None:
        return
    uv_install(bench, d / f"uv-{what}-fill", cache)
    shutil.rmtree(d / f"uv-{what}-fill", ignore_errors=True)
    timed(bench, i, "uv", what, uv_install, bench, d / f"uv-{what}", cache)
    shutil.rmtree(d / f"uv-{what}", ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)


def tree_env(bench: Bench, tree: str, state: Path) -> dict[str, str]:
    """The environment of ``tree``'s envbuilder: its own home, uv cache, scratch and work under ``state``."""
    mirror = str(bench.wheels)
    for d in ("scratch", "work"):  # the suite's filesystem check writes in them
        (state / d).mkdir(parents=True, exist_ok=True)
    return {
        **base_env(bench, state / "uv-cache"),
        "PYTHONPATH": str(bench.trees[tree]),
        "ENVBUILDER_HOME": str(state / "home"),
        "ENVBUILDER_RECIPE_PATH": str(bench.work / "recipes"),
        "ENVBUILDER_INDEX_MIRROR": f"https://download.pytorch.org/whl/={mirror} pypi={mirror}",
        "SCRATCH": str(state / "scratch"),
        "WORK": str(state / "work"),
    }


def envbuilder(bench: Bench, tree: str, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m envbuilder ARGS`` from ``tree`` (bench.envpython: it sees envbuilder's dependencies). Its stderr
    comes back traced: each line with the seconds since the start at which it arrived, so a create's steps can be
    read off one by one (the JSON's ``trace``)."""
    # Run from the work directory: `python -m` puts the current one first on sys.path, before PYTHONPATH.
    argv = [bench.envpython, "-m", "envbuilder", *args]
    env = tree_env(bench, tree, state)
    t0 = time.perf_counter()
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=bench.work
    ) as child:
        pipe_out, pipe_err = child.stdout, child.stderr
        if pipe_out is None or pipe_err is None:  # both are pipes (PIPE above)
            raise RuntimeError("no pipes")
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(pipe_out.read()))
        reader.start()  # stdout drained meanwhile: a full pipe would stop the child
        traced = [f"[{time.perf_counter() - t0:7.3f}] {line.rstrip()}" for line in pipe_err]
        reader.join()
        stdout = "".join(out)
        code = child.wait()
    traced.append(f"[{time.perf_counter() - t0:7.3f}] (exit {code})")
    return subprocess.CompletedProcess(argv, code, stdout, "\n".join(traced) + "\n")


def timed(bench: Bench, round_: int, way: str, what: str, call: Any, *args: Any) -> Optional[float]:
    """Run ``call(*args)`` (after writing out what earlier runs left dirty, untimed) and record its wall time, or
    its failure (None, with the tail of its stderr in the JSON and on stderr)."""
    os.sync()
    t0 = time.perf_counter()
    res = call(*args)
    seconds = time.perf_counter() - t0
    entry: dict[str, Any] = {"round": round_, "way": way, "what": what, "seconds": round(seconds, 3)}
    if res.returncode != 0:
        entry.update(seconds=None, rc=res.returncode, error=(res.stderr or res.stdout)[-3000:])
    bench.runs.append(entry)
    shown = f"{seconds:7.2f} s" if res.returncode == 0 else f"FAILED rc={res.returncode}: {res.stderr[-600:]}"
    print(f"round {round_ + 1}  {way:10s} {what:8s} {shown}", file=sys.stderr, flush=True)
    entry["output"] = res.stdout
    if call is envbuilder:
        entry["trace"] = res.stderr
        keep_log(bench, args[2], f"{round_ + 1}-{way}-{what}")
    save(bench)
    return entry["seconds"]


def keep_log(bench: Bench, state: Path, name: str) -> None:
    """The newest build log of the envbuilder run just timed, as OUT/logs/NAME.log: each command in it with its
    time (``(exit 0, 3.2 s)``), so a create's wall time can be read phase by phase."""
    logs = sorted((state / "home" / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
    if logs:
        (bench.out / "logs").mkdir(exist_ok=True)
        shutil.copyfile(logs[-1], bench.out / "logs" / f"{name}.log")


def part_create(bench: Bench, i: int, order: list[str]) -> None:
    """Cold, then warm: raw uv and each tree's ``create --no-validate`` in turn."""
    d = bench.work / f"create-{i}"
    for what in ("cold", "warm"):  # each env is removed once timed (disk: a copied CUDA env is 4.5 GB)
        timed(bench, i, "uv", what, uv_install, bench, d / f"uv-{what}", d / "uv-cache")
        shutil.rmtree(d / f"uv-{what}", ignore_errors=True)
        if what == "warm":
            uv_from_home(bench, i, d, "warm-home")
        for tree in order:
            prefix = d / f"{tree}-{what}"
            argv = ["create", RECIPE, "--prefix", str(prefix), "--name", f"b-{what}", "--no-validate"]
            timed(bench, i, tree, what, envbuilder, bench, tree, d / tree, *argv)
            shutil.rmtree(prefix, ignore_errors=True)
    if i == 0 and os.environ.get("BENCH_PROFILE"):
        profile_warm(bench, d, order)
    shutil.rmtree(d, ignore_errors=True)


def profile_warm(bench: Bench, d: Path, order: list[str]) -> None:
    """One more warm create per tree, under cProfile (scripts/profile_create.py): OUT/profile-TREE.txt, untimed."""
    for tree in order:
        prefix = d / f"{tree}-profiled"
        script = str(bench.trees[tree] / "scripts" / "profile_create.py")
        out = str(bench.out / f"profile-{tree}.txt")
        argv = [bench.envpython, script, out, "create", RECIPE, "--prefix", str(prefix), "--no-validate"]
        env = tree_env(bench, tree, d / tree)
        subprocess.run(argv, check=False, capture_output=True, env=env, cwd=bench.work)
        shutil.rmtree(prefix, ignore_errors=True)


def part_default(bench: Bench, i: int, order: list[str]) -> None:
    """The default create (validation) cold and its ``--force`` rebuild warm, per tree; raw uv cold + the bare
    probe on that env."""
    d = bench.work / f"default-{i}"
    timed(bench, i, "uv", "d-cold", uv_install, bench, d / "uv", d / "uv-cache")
    for tree in order:
        state, prefix = d / tree, d / f"{tree}-env"
        argv = ("create", RECIPE, "--prefix", str(prefix), "--json")
        timed(bench, i, tree, "default", envbuilder, bench, tree, state, *argv)
        note_suite(bench, bench.runs[-1])
        timed(bench, i, tree, "force", envbuilder, bench, tree, state, *argv, "--force")
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(prefix, ignore_errors=True)
    probe(bench, i, d / "uv")
    shutil.rmtree(d, ignore_errors=True)


def note_suite(bench: Bench, entry: dict[str, Any]) -> None:
    """The world and the largest message of the suite a default create ran, for the bare probe."""
    try:
        report = json.loads(entry["output"])["data"]["validation"]
        busbw = report["checks"]["nccl"]["figures"]["busbw"]
        bench.probe.setdefault("world", int(report["world"]))
        bench.probe.setdefault("bytes", int(busbw["bytes"]))
        entry["suite"] = {"world": report["world"], "seconds": report.get("seconds"), "busbw": busbw["value"]}
    except (KeyError, TypeError, ValueError):
        pass


def probe(bench: Bench, i: int, prefix: Path) -> None:
    world = bench.probe.get("world", bench.nproc)
    nbytes = bench.probe.get("bytes", PROBE_BYTES[bench.device])
    os.sync()
    wall, busbw = bare_loop(str(prefix / "bin" / "python"), world, nbytes, bench.device)
    entry = {
        "round": i,
        "way": "uv",
        "what": "probe",
        "seconds": round(wall, 3),
        "busbw": busbw,
        "world": world,
    }
    bench.runs.append({**entry, "bytes": nbytes})
    save(bench)
    print(f"round {i + 1}  {'probe':10s} {world} ranks {wall:7.2f} s, busbw {busbw:.2f}", file=sys.stderr)


def part_restore(bench: Bench, i: int, order: list[str]) -> None:
    """Per tree: a cold create and an import check (untimed here), ``backup``, then ``restore`` to a new prefix on
    the warm cache: as it is (the import on record stands on this node), with ``--check-import`` and with
    ``--no-validate``; raw uv cold then warm as the baseline."""
    d = bench.work / f"restore-{i}"
    for what in ("cold", "warm"):
        timed(bench, i, "uv", f"r-{what}", uv_install, bench, d / f"uv-{what}", d / "uv-cache")
    uv_from_home(bench, i, d, "r-home")
    for tree in order:
        state, bk = d / tree, str(d / f"{tree}-backups")
        argv = ["create", RECIPE, "--prefix", str(d / f"{tree}-env"), "--name", "b", "--no-validate", "-q"]
        made = envbuilder(bench, tree, state, *argv)
        if made.returncode != 0:
            print(f"round {i + 1}  {tree}: create failed: {made.stderr[-600:]}", file=sys.stderr)
            continue
        # As a user's env is: torch imported once on this node (its record holds the passing import).
        envbuilder(bench, tree, state, "validate", "b", "--checks", "import", "-q")
        # Timed as users run them (progress lines on stderr, as the create rows are), not with -q.
        timed(bench, i, tree, "backup", envbuilder, bench, tree, state, "backup", "b", "--to", bk)
        argv = ["restore", "b", "--from", bk, "--prefix", str(d / f"{tree}-restored"), "--name", "b-restored"]
        timed(bench, i, tree, "restore", envbuilder, bench, tree, state, *argv)
        # The same, importing torch again (--check-import: what every restore did before).
        argv = ["restore", "b", "--from", bk, "--prefix", str(d / f"{tree}-restored-ci"), "--name", "b-ci"]
        timed(bench, i, tree, "restore-import", envbuilder, bench, tree, state, *argv, "--check-import")
        # The same without its smoke check (an import of torch): the install and the guard alone.
        argv = ["restore", "b", "--from", bk, "--prefix", str(d / f"{tree}-restored-nv"), "--name", "b-nv"]
        timed(bench, i, tree, "restore-nv", envbuilder, bench, tree, state, *argv, "--no-validate")
        shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)


def part_validate(bench: Bench, i: int, order: list[str]) -> None:
    """Per tree: a create as users run it (untimed; its validation writes the bytecode of torch and of what DDP
    imports, as every validated create does), then scripts/bench_validate.py: the suite (``validate``) and the bare
    program on the same ranks, ``VALIDATE_RUNS`` (default 2) of each, medians. An env made with ``--no-validate``
    holds no bytecode: its first suite compiled torch and torch._dynamo in every rank, and the bare program, run
    after it, found them compiled."""
    d = bench.work / f"validate-{i}"
    runs = os.environ.get("VALIDATE_RUNS", "2")
    for tree in order:
        state, report = d / tree, d / f"{tree}.json"
        made = envbuilder(bench, tree, state, "create", RECIPE, "--prefix", str(d / f"{tree}-env"), "--name", "v",
                          "-q")  # fmt: skip
        argv = [sys.executable, str(HERE / "bench_validate.py"), "v", "--runs", runs, "--json", str(report)]
        argv += ["--cpu"] if bench.cpu else []
        res = made if made.returncode != 0 else subprocess.run(
            argv, check=False, capture_output=True, text=True, env=tree_env(bench, tree, state), cwd=bench.work
        )  # fmt: skip
        if res.returncode != 0:
            timed(bench, i, tree, "suite", lambda r: r, res)  # recorded as failed, with its error
            continue
        fig = json.loads(report.read_text())
        ratio = fig["busbw_ratio_median"]
        for way, what, secs, parts in (
            (tree, "suite", fig["suite_wall_median_s"], fig.get("suite_parts_s")),
            (tree, "bare", statistics.median(fig["raw_wall_s"]), fig.get("raw_parts_s")),
            (tree, "bare-ddp", statistics.median(fig["raw_ddp_wall_s"]), fig.get("raw_ddp_parts_s")),
        ):
            bench.runs.append(
                {
                    "round": i,
                    "way": way,
                    "what": what,
                    "seconds": secs,
                    "busbw_ratio": ratio,
                    "parts_s": parts,
                }
            )
        print(f"round {i + 1}  {tree:10s} suite {fig['suite_wall_s']} s, bare {fig['raw_wall_s']} s, bare+ddp"
              f" {fig['raw_ddp_wall_s']} s, busbw ratio {ratio}, bytecode {fig.get('bytecode')}",
              file=sys.stderr)  # fmt: skip
        print(
            f"  suite parts {fig.get('suite_parts_s')}\n  bare parts {fig.get('raw_parts_s')}",
            file=sys.stderr,
        )
        save(bench)
        shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)


PARTS = {"create": part_create, "default": part_default, "restore": part_restore, "validate": part_validate}
