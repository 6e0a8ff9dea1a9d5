"""Where a submitted job's output goes: the directory ``envbuilder sbatch`` runs from (Slurm's and qsub's
convention) unless ``--output`` names another file or directory; a value that a command line would read as an
option, or that a line break would cut, is refused. With the tests' real Slurm and the PBS stand-in
(tests/shims/pbs), on a small env without torch: the job runs a shell, not a training."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import REPO, UserWorld, cli_argv, cli_env, ok, refused, run_in
from sharedfs import tmpfs

pytestmark = [pytest.mark.integration]

BOUND_S = 120

RECIPE = """schema_version = 1
[recipe]
name = "{name}"
[scheduler]
type = "{scheduler}"
batch = "{batch}"
partition = "debug"
time = "00:05:00"
[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "python3"
[torch]
install = false
"""

#: The job's program: what a user's script prints, and where it ran.
PROGRAM = ("/bin/sh", "-c", 'echo "job ran in $PWD"')


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> UserWorld:
    """Two envs without torch (no index needed), one on a Slurm site and one on a PBS site."""
    world = UserWorld(tmp_path_factory.mktemp("sbatch-output"))
    world.write_recipe("sslurm", RECIPE.format(name="sslurm", scheduler="slurm", batch="sbatch"))
    world.write_recipe("spbs", RECIPE.format(name="spbs", scheduler="pbs", batch="qsub"))
    for name in ("sslurm", "spbs"):
        ok(world.cli("create", name, "--no-validate"))
    return world


def sbatch(
    world: UserWorld, name: str, *flags: str, cwd: Path, extra=None
) -> subprocess.CompletedProcess[str]:
    argv = cli_argv("sbatch", name, "--launcher", "local", *flags, "--", *PROGRAM)
    return run_in(world, argv, cwd=cwd, extra=extra)


def ended(job: str, env: dict[str, str]) -> None:
    """Until Slurm's job ``job`` has left the queue."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True)
        if not queued.stdout.strip():
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job} still queued after {BOUND_S} s")


def jobs_dir(world: UserWorld, name: str) -> Path:
    return world.scratch / "envs" / name / "envbuilder" / "jobs"


@pytest.mark.slurm
def test_slurm_job_output_goes_to_the_submit_directory_or_to_output(small, slurm_cluster, tmp_path):
    submit_dir = tmp_path / "project 100%x dir"  # Slurm would expand its own %x (the job name) there
    (submit_dir / "logs").mkdir(parents=True)
    env = cli_env({**small.env, **slurm_cluster.env})
    res = sbatch(small, "sslurm", "--json", cwd=submit_dir, extra=slurm_cluster.env)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    # Slurm's convention (slurm-JOBID.out where sbatch ran), with the job's name: its id in the reported path.
    assert data["output"] == str(submit_dir / f"envbuilder-sslurm-{data['job']}.out")
    ended(data["job"], env)
    assert Path(data["output"]).read_text() == f"job ran in {submit_dir}\n"
    # The script stays with the env (the record of what ran); no output is written there any more.
    (job_dir,) = jobs_dir(small, "sslurm").iterdir()
    assert Path(data["script_path"]) == job_dir / "job.sh" and sorted(p.name for p in job_dir.iterdir()) == [
        "job.sh"
    ]
    # --output: a file relative to the submit directory (Slurm's own patterns apply), or a directory.
    named = sbatch(
        small, "sslurm", "--json", "--output", "logs/run-%j.txt", cwd=submit_dir, extra=slurm_cluster.env
    )
    job = json.loads(ok(named).stdout)["data"]
    assert job["output"] == str(submit_dir / "logs" / f"run-{job['job']}.txt")
    into = sbatch(small, "sslurm", "--json", "-o", str(tmp_path), cwd=submit_dir, extra=slurm_cluster.env)
    job2 = json.loads(ok(into).stdout)["data"]
    assert job2["output"] == str(tmp_path / f"envbuilder-sslurm-{job2['job']}.out")
    for j in (job, job2):
        ended(j["job"], env)
        assert Path(j["output"]).read_text() == f"job ran in {submit_dir}\n"
    human = ok(sbatch(small, "sslurm", cwd=submit_dir, extra=slurm_cluster.env))
    job_id = human.stdout.strip()
    assert f"(output: {submit_dir}/envbuilder-sslurm-{job_id}.out)" in human.stderr
    ended(job_id, env)


def test_pbs_job_output_goes_to_the_submit_directory_or_to_output(small, tmp_path):
    spool = tmp_path / "spool"
    extra = {"PATH": f"{REPO / 'tests' / 'shims' / 'pbs'}:{small.env['PATH']}", "PBS_SHIM_SPOOL": str(spool)}
    submit_dir = tmp_path / "work"
    submit_dir.mkdir()
    res = sbatch(small, "spbs", "--json", cwd=submit_dir, extra=extra)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    # qsub's -o holds no pattern for the job id: the name has the job directory's time stamp instead.
    job_dir = Path(data["script_path"]).parent
    stamp = job_dir.name.removeprefix("job-")
    assert data["output"] == str(submit_dir / f"envbuilder-spbs-{stamp}.out")
    named = sbatch(small, "spbs", "--json", "--output", "pbs.log", cwd=submit_dir, extra=extra)
    assert json.loads(ok(named).stdout)["data"]["output"] == str(submit_dir / "pbs.log")
    for job, out in (
        (data["job"], data["output"]),
        (json.loads(named.stdout)["data"]["job"], submit_dir / "pbs.log"),
    ):
        state = spool / f"{job}.state"
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline and not state.read_text().startswith("F"):
            time.sleep(0.2)
        assert state.read_text().strip() == "F 0"
        assert Path(out).read_text() == f"job ran in {submit_dir}\n"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("-x", "--output '-x' looks like an option, not a path"),
        ("--parsable", "looks like an option"),
        ("out\n#PBS -l evil", "a line break is not allowed in a path"),
        ("nul\x01", "is not allowed in a path"),
        ("", "--output is empty"),
        ("missing/out.txt", "does not exist as a directory"),
        ("host:out.txt", "qsub would read the part before ':' as a host name"),
    ],
)
def test_a_hostile_or_unusable_output_is_refused_before_anything_is_submitted(small, tmp_path, value, said):
    spool = tmp_path / "spool"
    extra = {"PATH": f"{REPO / 'tests' / 'shims' / 'pbs'}:{small.env['PATH']}", "PBS_SHIM_SPOOL": str(spool)}
    made = sorted(jobs_dir(small, "spbs").glob("*")) if jobs_dir(small, "spbs").exists() else []
    for dry in ((), ("--dry-run",)):
        res = sbatch(small, "spbs", f"--output={value}", *dry, cwd=tmp_path, extra=extra)
        refused(res, 2, said)
    assert not spool.exists()  # qsub never ran
    assert (sorted(jobs_dir(small, "spbs").glob("*")) if jobs_dir(small, "spbs").exists() else []) == made


def test_an_output_directory_the_job_could_not_write_is_refused(small, tmp_path):
    """A read-only directory (a mount: root cannot write there either) would lose the job's output, found only
    after the job ran: refused at submission, as the default (where sbatch runs) and as --output."""
    spool = tmp_path / "spool"
    extra = {"PATH": f"{REPO / 'tests' / 'shims' / 'pbs'}:{small.env['PATH']}", "PBS_SHIM_SPOOL": str(spool)}
    with tmpfs(tmp_path / "ro", read_only=True) as ro:
        here = sbatch(small, "spbs", cwd=ro, extra=extra)
        refused(
            here, 2, f"the job's output goes to the directory sbatch runs from, {ro}, which is not writable"
        )
        assert "or pass --output PATH" in here.stderr
        there = sbatch(small, "spbs", "--output", str(ro / "job.log"), cwd=tmp_path, extra=extra)
        refused(there, 2, f"the directory {ro} is not writable by you")
    assert not spool.exists()
