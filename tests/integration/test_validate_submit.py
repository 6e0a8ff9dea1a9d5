"""`envbuilder validate --submit` end to end on the session's CPU torch env: the suite as a job of the tests' real
Slurm (torchrun directly or one agent per node through srun, a rank that dies in the job) and of the PBS stand-in.
Apart from test_validate.py so that xdist can run the two files on different workers."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from helpers import REPO

pytestmark = [pytest.mark.integration, pytest.mark.mpi]

SHIMS = REPO / "tests" / "shims"


def _checks(envelope):
    return envelope["data"]["checks"]


@pytest.mark.slurm
def test_submit_runs_the_suite_as_a_slurm_job_and_collects_the_report(validate_world, slurm_cluster):
    res, env = validate_world.validate(
        "--submit", "--checks", "import,libraries,nccl,ddp,filesystem", extra=slurm_cluster.env
    )
    assert res.returncode == 0, res.stderr
    data = env["data"]
    assert data["where"].isdigit()  # the job id
    assert all(
        _checks(env)[c]["status"] == "pass" for c in ("import", "libraries", "nccl", "ddp", "filesystem")
    )
    assert data["partition"] == "debug"
    run_dir = next(
        p
        for p in (validate_world.prefix / "envbuilder" / "validation").glob("run-*")
        if (p / "job.sh").exists()
    )
    script = (run_dir / "job.sh").read_text()
    assert "#SBATCH --partition=debug\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    assert "--gres" not in script and "--gpus" not in script  # a CPU env asks for no GPUs
    assert f"cd {run_dir}" in script
    assert (run_dir / "job.out").exists()


@pytest.mark.slurm
def test_submitted_job_with_a_dead_rank_reports_it(validate_world, slurm_cluster):
    res, env = validate_world.validate(
        "--submit",
        "--checks",
        "import,nccl",
        extra={**slurm_cluster.env, "ENVBUILDER_VALIDATE_FAULT": "0:nccl:exit"},
    )
    assert res.returncode == 8, res.stderr
    assert env["data"]["exit_code"] not in (None, 0)
    assert "rank 0 died during this check" in _checks(env)["nccl"]["cause"]


@pytest.mark.slurm
def test_a_submitted_job_that_can_never_start_is_cancelled_and_named(validate_world, slurm_cluster):
    # Sent to the cluster's `short` partition (sbatch's SBATCH_PARTITION outranks the script's #SBATCH line), whose
    # one-minute limit the job's time is over: it waits for ever (Slurm says PartitionConfig, or
    # PartitionTimeLimit), and so did
    # `validate --submit`.
    res = validate_world.cli(
        "validate",
        "vcpu",
        "--submit",
        "--checks",
        "import",
        extra={**slurm_cluster.env, "SBATCH_PARTITION": "short"},
    )
    assert res.returncode == 8, res.stderr
    found = re.search(
        r"job (\d+) will not start \((PartitionTimeLimit|PartitionConfig): the (job's time limit|job asks)",
        res.stderr,
    )
    assert found and "it was cancelled and nothing was validated" in res.stderr, res.stderr
    queue = subprocess.run(
        ["squeue", "-h", "-j", found.group(1), "-o", "%T"],
        env={**os.environ, **slurm_cluster.env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert queue.stdout.strip() in ("", "CANCELLED"), queue.stdout  # nothing left waiting in the queue


@pytest.mark.slurm
def test_submit_through_srun_starts_one_torchrun_agent_per_node(validate_world, slurm_cluster):
    res, env = validate_world.validate(
        "--submit", "--launcher", "srun", "--checks", "import,nccl", extra=slurm_cluster.env
    )
    assert res.returncode == 0, res.stderr
    data = env["data"]
    assert data["command"][:7] == [
        "srun",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--ntasks=1",
        # The agent gets every CPU the job holds on its node (a step gets one per task unless told).
        "--cpus-per-task",
        "$SLURM_CPUS_ON_NODE",
        str(validate_world.prefix / "bin" / "python"),
    ]
    # One agent, two workers: a single world of 2, not two worlds of 2 (the Zurada seed's double launch).
    assert data["world"] == 2
    hellos = _checks(env)["nccl"]["per_rank"]
    assert sorted(hellos) == ["0", "1"] and all(r["world"] == 2 for r in hellos.values())


def test_submit_to_pbs_through_the_qsub_stand_in(validate_world, tmp_path):
    # PBS cannot run here: qsub/qstat stand-ins (tests/shims/pbs) run the job script in the background as a
    # one-node job would. The env is the same; its recipe's scheduler is PBS (as Polaris's is).
    path = validate_world.variant(
        "vpbs", lambda t: t.replace('type = "slurm"\nbatch = "sbatch"', 'type = "pbs"\nbatch = "qsub"')
    )
    res = validate_world.cli(
        "validate",
        "vpbs",
        "--submit",
        "--checks",
        "import,nccl",
        "--json",
        extra={
            "ENVBUILDER_RECIPE_PATH": path,
            "PATH": f"{SHIMS / 'pbs'}:{validate_world.env['PATH']}",
            "PBS_SHIM_SPOOL": str(tmp_path / "spool"),
        },
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    assert data["where"].endswith(".pbs-shim")
    assert data["checks"]["nccl"]["status"] == "pass"
    scripts = [p.read_text() for p in validate_world.prefix.glob("envbuilder/validation/run-*/job.sh")]
    script = next(t for t in scripts if "#PBS" in t)
    assert "#PBS -l select=1\n" in script and "#PBS -q debug\n" in script
    assert 'cd "${PBS_O_WORKDIR:-$PWD}"' in script
