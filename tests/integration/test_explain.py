"""``envbuilder explain LOG|JOBID`` on real failures made here: a python importing a module that is not there (and
the env's side of it), a process killed by the out-of-memory killer of a real memory cgroup, a job of the tests'
real Slurm cluster found by its id, a torchrun rank killed with SIGKILL and gloo timeouts in the CPU torch env;
and on the GPU failure logs recorded under tests/data/failures/. A site's own signature directory extends the
registry, and is refused where another user could change it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import DATA, REPO, UserWorld, ok, refused
from sharedfs import give_to, other_user
from slurm import sbatch_wait

pytestmark = [pytest.mark.integration]

FAILURES = DATA / "failures"

SMALL = """schema_version = 1
[recipe]
name = "small"
[env]
kind = "venv"
installer = "uv"
prefix = "${SCRATCH}/envs/{name}"
[python]
command = "python3"
[torch]
install = false
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> UserWorld:
    """A user's world with one real env without torch (``small``), for the env's side of an explanation."""
    w = UserWorld(tmp_path_factory.mktemp("explain"))
    w.write_recipe("small", SMALL)
    ok(w.cli("create", "small", "--no-validate"))
    return w


def explained(world: UserWorld, *args: str, **extra: str) -> dict[str, Any]:
    res = ok(world.cli("explain", *args, "--json", **extra))
    return json.loads(res.stdout)["data"]


def ids(data: dict[str, Any]) -> list[str]:
    return [m["id"] for m in data["matches"]]


def run_to_log(argv: list[str], log: Path, **kwargs: Any) -> int:
    """``argv`` run for real, its output and errors in ``log`` as a job's output file holds them."""
    with log.open("w") as f:
        return subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, check=False, **kwargs).returncode


def test_a_real_import_error_and_the_envs_side_of_it(world: UserWorld, tmp_path: Path) -> None:
    log = tmp_path / "a-project-directory-whose-path-alone-is-wider-than-an-80-column-terminal" / "job.log"
    log.parent.mkdir()
    python = world.scratch / "envs" / "small" / "bin" / "python"
    assert run_to_log([str(python), "-c", "import torch"], log) == 1
    data = explained(world, str(log))
    assert ids(data) == ["python-module-missing"]
    (m,) = data["matches"]
    assert m["facts"] == {"module": "torch"} and "no module torch" in m["means"]
    assert data["env"] is None and data["next"] == "the env may be at fault: run `envbuilder doctor ENV`"
    data = explained(world, str(log), "--env", "small")
    (m,) = data["matches"]
    assert m["env_notes"] == [
        "torch is not among small's packages: add it to the recipe (small) and create the env again, or check "
        "the name"
    ]
    human = ok(world.cli("explain", str(log), "--env", "small", COLUMNS="80")).stdout
    assert "KNOWN python-module-missing" in human and "run `envbuilder doctor small`" in human
    # Read through a pipe at 80 columns: the sentences wrap under their field; only a source's URL and the path read
    # stay whole, on lines of their own (the heading names no path).
    long = [
        line
        for line in human.splitlines()
        if len(line) > 80 and not line.lstrip().startswith(("source: ", "read: "))
    ]
    assert not long, long


def test_nothing_known_is_said_plainly(world: UserWorld, tmp_path: Path) -> None:
    log = tmp_path / "fine.log"
    assert run_to_log([sys.executable, "-c", "print('epoch 1 loss 0.5')"], log) == 0
    res = ok(world.cli("explain", str(log)))
    assert (
        "no known signature in this output; run `envbuilder doctor ENV` to check the env itself" in res.stdout
    )
    refused(world.cli("explain", str(tmp_path / "absent.log")), 15, "cannot read the log")
    refused(world.cli("explain", str(log), "--env", "nosuch"), 9, "no env named 'nosuch'")
    # Not a job id's shape: a log's name, never a scheduler's argument.
    refused(world.cli("explain", "slurm-123.out"), 15, "cannot read the log slurm-123.out")


def test_a_cuda_library_the_dynamic_loader_cannot_find(world: UserWorld, tmp_path: Path) -> None:
    """What torch's ``_load_global_deps`` does first (ctypes.CDLL of the CUDA runtime), for real, on a machine
    (and an LD_LIBRARY_PATH) without it; ``small`` is a CPU env, and says so."""
    log = tmp_path / "job.log"
    code = "import ctypes; ctypes.CDLL('libcudart.so.12', mode=ctypes.RTLD_GLOBAL)"
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    assert run_to_log([sys.executable, "-c", code], log, env=env) == 1
    data = explained(world, str(log), "--env", "small")
    assert ids(data) == ["cuda-library-missing"]
    (m,) = data["matches"]
    assert m["facts"] == {"library": "libcudart.so.12"}
    assert m["env_notes"] == [
        "small's torch is a non-CUDA build: libcudart.so.12 is not part of it; the program wants a CUDA build "
        "(a CUDA variant of the recipe) or a module that provides the library"
    ]


def memory_cgroup(name: str, limit: int) -> Path:
    """A real memory cgroup limited to ``limit`` bytes: cgroup v2's memory.max where the unified hierarchy has
    the memory controller, else cgroup v1's memory.limit_in_bytes (this machine mounts memory as v1). Skips where
    neither can be made (no root, no writable hierarchy)."""
    for root, limit_file in (
        (Path("/sys/fs/cgroup"), "memory.max"),
        (Path("/sys/fs/cgroup/unified"), "memory.max"),
        (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
    ):
        controllers = root / "cgroup.controllers"
        v2 = limit_file == "memory.max"
        if v2 and not (controllers.is_file() and "memory" in controllers.read_text().split()):
            continue
        if not v2 and not (root / limit_file).is_file():
            continue
        group = root / name
        try:
            group.mkdir()
            (group / limit_file).write_text(str(limit))
        except OSError as exc:
            pytest.skip(f"cannot make a memory cgroup under {root}: {exc.strerror}")
        return group
    pytest.skip("no cgroup memory controller (v2 or v1) under /sys/fs/cgroup")


def oom_kills(group: Path) -> int:
    for name in ("memory.events", "memory.oom_control"):
        if (group / name).is_file():
            for line in (group / name).read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    return -1


def test_a_process_killed_by_a_memory_cgroups_oom_killer(world: UserWorld, tmp_path: Path) -> None:
    group = memory_cgroup(f"envbuilder-explain-{os.getpid()}", 64 * 1024 * 1024)
    try:
        script = tmp_path / "job.sh"
        script.write_text(
            "#!/bin/bash\n"
            f"echo $$ > {group}/cgroup.procs\n"
            f'{sys.executable} -c "x = bytearray(512 * 1024 * 1024)"\n'
            'echo "training ended"\n'
        )
        script.chmod(0o755)
        log = tmp_path / "job.log"
        run_to_log([str(script)], log)
        assert oom_kills(group) >= 1, "the kernel's OOM killer did not act: " + log.read_text()
    finally:
        group.rmdir()
    data = explained(world, str(log))
    assert ids(data) == ["killed-by-sigkill"]
    assert "out-of-memory killer" in data["matches"][0]["means"]


def test_a_failed_slurm_job_by_its_id(world: UserWorld, slurm_cluster: Any, tmp_path: Path) -> None:
    """A real job of the tests' cluster: no accounting there (AccountingStorageType=accounting_storage/none), so
    sacct answers nothing and the controller's record (scontrol show job) names the output file, in a directory
    with a space in its name. The script names the env (ENVBUILDER_ENV)."""
    jobs = tmp_path / "my jobs"
    jobs.mkdir()
    script = jobs / "run.sh"
    python = world.scratch / "envs" / "small" / "bin" / "python"
    script.write_text(f"#!/bin/bash\nexport ENVBUILDER_ENV=small\n{python} -c 'import torch'\n")
    env = {**world.env, **slurm_cluster.environ(), "PATH": os.environ["PATH"]}
    job = sbatch_wait([f"--output={jobs}/slurm-%j.out", str(script)], env=env, timeout=120, cwd=jobs)
    assert job.returncode == 1
    job_id = job.stdout.strip().split(";")[0]
    res = ok(world.cli("explain", job_id, "--json", **slurm_cluster.env))
    data = json.loads(res.stdout)["data"]
    assert data["source"] == f"job {job_id} (Slurm, scontrol show job): {jobs}/slurm-{job_id}.out"
    assert data["job"]["state"] == "FAILED" and data["job"]["exit code"] == "1:0"
    (sacct,) = data["unanswered"]
    assert sacct.startswith("`sacct -j") and "accounting storage is disabled" in sacct
    assert ids(data) == ["python-module-missing"]
    assert data["env"]["name"] == "small" and data["env"]["named_by"] == "the job script's ENVBUILDER_ENV"
    assert data["matches"][0]["env_notes"][0].startswith("torch is not among small's packages")
    refused(world.cli("explain", "999999", **slurm_cluster.env), 2, "no scheduler here knows job '999999'")
    # A job that SIGKILL ended leaves nothing in its output: the record says it.
    script.write_text("#!/bin/bash\nkill -9 $$\n")
    job = sbatch_wait([f"--output={jobs}/slurm-%j.out", str(script)], env=env, timeout=120, cwd=jobs)
    job_id = job.stdout.strip().split(";")[0]
    data = json.loads(ok(world.cli("explain", job_id, "--json", **slurm_cluster.env)).stdout)["data"]
    assert data["known"] is False
    assert data["job"]["ended by"].startswith("exit code 0:9: signal 9 (SIGKILL: the out-of-memory killer")


def test_a_failed_pbs_job_by_its_id(world: UserWorld, tmp_path: Path) -> None:
    """PBS cannot run here: the qsub/qstat stand-ins (tests/shims/pbs) run the job script as a one-node job would
    and keep its attributes, which ``qstat -x -f`` prints in PBS Pro's full form. The env is named by the job's
    variable list (``qsub -v``)."""
    spool = tmp_path / "spool"
    extra = {"PATH": f"{REPO / 'tests' / 'shims' / 'pbs'}:{world.env['PATH']}", "PBS_SHIM_SPOOL": str(spool)}
    env = {**world.env, **extra}
    script = tmp_path / "job.sh"
    script.write_text(f"{world.scratch / 'envs' / 'small' / 'bin' / 'python'} -c 'import torch'\n")
    out = tmp_path / "job.out"
    argv = ["qsub", "-o", str(out), "-j", "oe", "-v", "ENVBUILDER_ENV=small", str(script)]
    job = subprocess.run(
        argv, env=env, capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.strip()
    deadline = time.monotonic() + 60
    while (
        "job_state = F"
        not in subprocess.run(
            ["qstat", "-x", "-f", job], env=env, capture_output=True, text=True, check=False
        ).stdout
    ):
        assert time.monotonic() < deadline, "the stand-in's job did not end"
        time.sleep(0.2)
    data = explained(world, job, **extra)
    assert data["source"] == f"job {job} (PBS, qstat -x -f): {out}"
    assert data["job"] == {"state": "F", "exit code": "1"}
    assert ids(data) == ["python-module-missing"]
    assert (data["env"]["name"], data["env"]["named_by"]) == ("small", "the job's ENVBUILDER_ENV variable")


@pytest.mark.parametrize("log", sorted(FAILURES.glob("*.log")), ids=lambda p: p.stem)
def test_recorded_failure_logs(world: UserWorld, log: Path) -> None:
    """Each recorded log's header says where it came from and which signatures it shows (``# expect:``)."""
    header = [line[2:] for line in log.read_text().splitlines() if line.startswith("# ")]
    fields = dict(line.split(": ", 1) for line in header if ": " in line)
    assert fields.get("source", "").startswith(("https://", "recorded")), (
        f"{log.name}: no source in its header"
    )
    expected = fields["expect"].split()
    data = explained(world, str(log))
    assert ids(data) == expected
    for pair in filter(None, fields.get("facts", "").split("; ")):
        key, value = pair.split("=", 1)
        assert any(m["facts"].get(key) == value for m in data["matches"]), (pair, data["matches"])


def site_file(folder: Path) -> Path:
    folder.mkdir(mode=0o755)
    path = folder / "site.toml"
    path.write_text(
        textwrap.dedent(
            """\
            schema_version = 1
            [[signature]]
            id = "site-lustre-quota"
            contains = ["Disk quota exceeded"]
            means = "the project's Lustre quota is full"
            fix = "clean $WORK or ask for more: https://hpc.example.org/quota"
            source = "https://hpc.example.org/quota (2026-11-28)"
            """
        )
    )
    path.chmod(0o644)
    return path


def test_a_sites_signatures_extend_the_registry_unless_another_user_can_change_them(
    world: UserWorld, tmp_path: Path
) -> None:
    log = tmp_path / "job.log"
    run_to_log([sys.executable, "-c", "raise OSError(122, 'Disk quota exceeded')"], log)
    folder = tmp_path / "signatures"
    path = site_file(folder)
    data = explained(world, str(log), ENVBUILDER_SIGNATURES_DIR=str(folder))
    assert ids(data) == ["site-lustre-quota"] and data["matches"][0]["file"] == str(path)
    assert explained(world, str(log))["known"] is False
    path.chmod(0o646)  # everyone may write it (a group-writable file of the private group is the user's own)
    refused(world.cli("explain", str(log), ENVBUILDER_SIGNATURES_DIR=str(folder)), 9, "a site signature file")
    path.chmod(0o644)
    give_to(path, other_user(), 0o644)
    refused(world.cli("explain", str(log), ENVBUILDER_SIGNATURES_DIR=str(folder)), 9, "a site signature file")


def test_a_torchrun_rank_killed_by_sigkill(cpu_torch_world: Any, tmp_path: Path) -> None:
    train = tmp_path / "train.py"
    train.write_text(
        "import os, signal, time\n"
        "if os.environ['RANK'] == '1':\n"
        f"    os.kill(os.getpid(), {int(signal.SIGKILL)})\n"
        "time.sleep(30)\n"
    )
    log = tmp_path / "job.log"
    python = str(cpu_torch_world.prefix / "bin" / "python")
    argv = [python, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=0", str(train)]
    assert run_to_log(argv, log, timeout=120) != 0
    data = explained(cpu_torch_world, str(log), "--env", "vcpu")
    assert "torchrun-rank-killed" in ids(data) and "torchrun-child-failed" in ids(data), log.read_text()
    killed = next(m for m in data["matches"] if m["id"] == "torchrun-rank-killed")
    assert killed["facts"] == {"rank": "1"}


GLOO = """\
import datetime, os, sys, time
import torch
import torch.distributed as dist
rank = int(sys.argv[1])
if sys.argv[2] == "join" or rank == 0:
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=3))
if rank == 0:
    dist.all_reduce(torch.ones(1))
else:
    time.sleep(8)
"""


@pytest.mark.parametrize(
    ("mode", "expected"), [("never", "rendezvous-store-timeout"), ("join", "gloo-timeout")]
)
def test_gloo_timeouts(cpu_torch_world: Any, tmp_path: Path, mode: str, expected: str) -> None:
    """Two ranks of a gloo group with a 3 s timeout: rank 1 never joins the group (``never``: rank 0 waits for it
    in the store), or joins and never reaches the all_reduce (``join``: rank 0's collective times out)."""
    script = tmp_path / "ranks.py"
    script.write_text(GLOO)
    python = str(cpu_torch_world.prefix / "bin" / "python")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29400 + os.getpid() % 500)}
    log = tmp_path / "rank0.log"
    other = subprocess.Popen([python, str(script), "1", mode], env=env, stdout=subprocess.DEVNULL)
    try:
        assert run_to_log([python, str(script), "0", mode], log, env=env, timeout=60) != 0
    finally:
        other.wait(30)
    data = explained(cpu_torch_world, str(log))
    assert ids(data) == [expected], log.read_text()[-3000:]
