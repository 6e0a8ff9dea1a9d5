"""The test Slurm cluster itself (tests/slurm.py): real batch jobs, a GPU step and a failing job, seen the way the
tool sees a site's Slurm, through sbatch, srun, squeue and scontrol. There is no accounting, so a job's end state
comes from scontrol while the controller still remembers the job."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from slurm import CGROUP_CONTROLLERS, CGROUP_V1, ENDED, ConfinedCluster, MiniCluster, available, job_record

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

#: Polls give up after this long; a bound so a stuck job fails the test instead of hanging it.
JOB_LIMIT = 120


def submit(cluster: MiniCluster, *args: str, cwd: Path) -> str:
    proc = cluster.client("sbatch", "--parsable", f"--chdir={cwd}", *args)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    assert job_id.isdigit(), proc.stdout
    return job_id


def finished(cluster: MiniCluster, job_id: str) -> dict[str, str]:
    """Waits until the job has ended, then its record from scontrol as key=value pairs."""
    deadline = time.monotonic() + JOB_LIMIT
    while (job := job_record(job_id, cluster.environ())).get("JobState") not in ENDED:
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} has not ended ({job.get('JobState')})\n{cluster.log_tails()}")
        time.sleep(0.1)
    return job


def test_batch_job_runs_and_completes(slurm_cluster: MiniCluster, tmp_path: Path) -> None:
    result = tmp_path / "result.txt"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH -J envbuilder-test\n"
        "#SBATCH -n 1\n"
        f"#SBATCH -o {tmp_path}/%x-%j.out\n"
        f'echo "job=$SLURM_JOB_ID partition=$SLURM_JOB_PARTITION" > {result}\n'
        "echo hello from the job\n"
    )
    job_id = submit(slurm_cluster, str(script), cwd=tmp_path)

    job = finished(slurm_cluster, job_id)
    assert job["JobState"] == "COMPLETED", job
    assert job["ExitCode"] == "0:0"
    assert result.read_text() == f"job={job_id} partition={slurm_cluster.partition}\n"
    assert (tmp_path / f"envbuilder-test-{job_id}.out").read_text() == "hello from the job\n"


def test_gpu_step_sees_both_fake_gpus(slurm_cluster: MiniCluster) -> None:
    proc = slurm_cluster.client("srun", "-n1", "--gres=gpu:2", "printenv", "CUDA_VISIBLE_DEVICES")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "0,1\n"


def test_asking_for_more_gpus_than_the_node_has_is_refused(slurm_cluster: MiniCluster) -> None:
    proc = slurm_cluster.client("srun", "-n1", "--gres=gpu:3", "true")
    assert proc.returncode != 0
    assert "Requested node configuration is not available" in proc.stderr


def test_failing_job_ends_failed_with_its_exit_code(slurm_cluster: MiniCluster, tmp_path: Path) -> None:
    job_id = submit(slurm_cluster, "--wrap", "exit 3", "-o", "/dev/null", cwd=tmp_path)

    job = finished(slurm_cluster, job_id)
    assert job["JobState"] == "FAILED", job
    assert job["Reason"] == "NonZeroExitCode"
    assert job["ExitCode"] == "3:0"


AFFINITY = "import os; print(os.environ['SLURM_CPUS_ON_NODE'], len(os.sched_getaffinity(0)))"


@pytest.mark.parametrize("confinement", ["cgroup", "affinity"])
def test_a_confined_clusters_steps_run_only_on_their_cpus(tmp_path: Path, confinement: str) -> None:
    # As sites run Slurm: a step may run on the CPUs it was allocated, no more (by cgroups, else by binding).
    # The unconfined MiniCluster lets every step run on every CPU of the machine.
    reason = available()
    if reason is not None:
        pytest.skip(f"no test Slurm cluster: {reason}")
    cluster = ConfinedCluster(tmp_path / "c")
    if cluster.cpus < 2:
        pytest.skip("one CPU here: a one-CPU step cannot be told from the whole machine")
    if confinement == "cgroup" and cluster.cgroup_problem:
        pytest.skip(f"no cgroup confinement here: {cluster.cgroup_problem}")
    cluster.confinement = confinement
    with cluster:
        one = cluster.client("srun", "--ntasks=1", sys.executable, "-c", AFFINITY)
        every = cluster.client(
            "srun", "--ntasks=1", f"--cpus-per-task={cluster.cpus}", sys.executable, "-c", AFFINITY
        )
    assert (one.returncode, one.stdout.split()) == (0, ["1", "1"]), one.stderr
    assert (every.returncode, every.stdout.split()) == (0, [str(cluster.cpus)] * 2), every.stderr
    for name in CGROUP_CONTROLLERS:  # its groups are gone with it
        assert not (CGROUP_V1 / name / f"slurm_{cluster.node}").exists()
